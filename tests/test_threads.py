"""Each parallel worker gets its share of the cores for torch's threads
(falsify/harness/threads.py), and a value the user set wins."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from falsify.harness import threads

PROBE = """
import os, torch
import torch._inductor.config as inductor
def test_probe():
    with open(os.path.join(os.environ["PROBE_DIR"], os.environ["PYTEST_XDIST_WORKER"]), "w") as f:
        f.write(f"{torch.get_num_threads()} {os.environ.get('OMP_NUM_THREADS')} "
                f"{inductor.compile_threads}")
"""

RUN = """
import sys, pytest
from falsify.harness import threads
with threads.for_workers(2):
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "--no-ledger", "-n", "2", sys.argv[1]])
sys.exit(rc)
"""


def test_a_workers_share_is_the_cores_divided_among_the_workers():
    assert threads.share(2, cores=2) == 1
    assert threads.share(2, cores=16) == 8
    assert threads.share(3, cores=16) == 5
    assert threads.share(4, cores=2) == 1  # never 0
    assert threads.share(1, cores=2) == 2


def test_a_value_the_user_set_wins_and_nothing_is_left_behind(monkeypatch):
    both = (threads.ENV, threads.COMPILE_ENV)
    for name in both:
        monkeypatch.delenv(name, raising=False)
    with threads.for_workers(1):  # one process: torch's own defaults stand
        assert not any(name in os.environ for name in both)
    with threads.for_workers(64):
        assert [os.environ[name] for name in both] == ["1", "1"]
    assert not any(name in os.environ for name in both)
    monkeypatch.setenv(threads.ENV, "3")  # the user's choice of one leaves the other ours
    with threads.for_workers(2):
        assert os.environ[threads.ENV] == "3"
        assert os.environ[threads.COMPILE_ENV] == str(threads.share(2))
    assert os.environ[threads.ENV] == "3" and threads.COMPILE_ENV not in os.environ


def test_the_xdist_workers_run_torch_with_their_share(tmp_path):
    """The mechanism end to end: the workers started inside `for_workers` import torch with
    their share as its intra-op thread count and as Inductor's compile pool."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    env = {k: v for k, v in os.environ.items() if k not in (threads.ENV, threads.COMPILE_ENV)}
    env["PROBE_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", RUN, str(tmp_path / "test_probe.py")], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    want = threads.share(2)
    seen = [(tmp_path / w).read_text() for w in ("gw0", "gw1") if (tmp_path / w).exists()]
    assert seen == [f"{want} {want} {want}"], seen  # one test: one worker ran it
