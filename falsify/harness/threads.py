"""Compute threads per process when a run spreads over parallel worker processes.

torch gives every process one intra-op thread per core (OpenMP). pytest-xdist starts one
process per worker, so `-n 2` on 2 cores ran four compute threads on two cores, which spin
and preempt one another. Measured on 2 cores, a torch-only slice of the generated checks under
`-n 2` took 34 to 40 s with torch's default and 23 to 24 s with one thread per worker. So each
worker gets its share of the cores, cores // workers (at least 1), through OMP_NUM_THREADS in
the environment the workers inherit. A value the user set wins.

Inductor's compile workers (the compile kind's torch.compile) follow the same share through
TORCHINDUCTOR_COMPILE_THREADS: by default each process would start a pool of one compile
process per core, each importing torch, so two workers on 2 cores kept four compile processes
for two cores. The pool changes how fast a graph compiles, never the code it produces.
Measured on 2 cores, three compile checks in one process: 40.7 s with torch's default pool of
2, 36.1 s with 1.
"""

from __future__ import annotations

import contextlib
import os

ENV = "OMP_NUM_THREADS"
COMPILE_ENV = "TORCHINDUCTOR_COMPILE_THREADS"


def share(workers: int, cores: int | None = None) -> int:
    """One worker's share of the cores this process may run on."""
    if cores is None:  # the cores this process may use (Linux), else the machine's (macOS)
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    return max(1, cores // max(1, workers))


def set_for_workers(workers: int) -> list[str]:
    """Set OMP_NUM_THREADS and TORCHINDUCTOR_COMPILE_THREADS to one worker's share for worker
    processes started from now on; the variables set (none for a single process; a variable
    the user set is left as it is)."""
    if workers <= 1:
        return []
    changed = [name for name in (ENV, COMPILE_ENV) if not os.environ.get(name)]
    for name in changed:
        os.environ[name] = str(share(workers))
    return changed


@contextlib.contextmanager
def for_workers(workers: int):
    """`set_for_workers` for the workers started inside, undone afterwards."""
    changed = set_for_workers(workers)
    try:
        yield
    finally:
        for name in changed:
            os.environ.pop(name, None)


@contextlib.contextmanager
def as_one_of(workers: int):
    """This process runs, itself, work planned for `workers` workers (falsify run's small
    runs): torch gets one worker's share of the cores, as a worker process would through
    OMP_NUM_THREADS, so a result does not depend on whether workers were started (a CPU
    reduction may split over threads). The process's own setting comes back afterwards."""
    import sys

    if workers <= 1 or os.environ.get(ENV):
        yield
        return
    torch = sys.modules.get("torch")
    if torch is None:  # imported during the run: it reads the variable then
        os.environ[ENV] = str(share(workers))
        try:
            yield
        finally:
            os.environ.pop(ENV, None)
        return
    before = torch.get_num_threads()
    torch.set_num_threads(share(workers))
    try:
        yield
    finally:
        torch.set_num_threads(before)
