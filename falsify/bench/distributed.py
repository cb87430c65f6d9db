"""`falsify bench distributed`: one training step on one global batch, one process against N
data-parallel processes (DDP on gloo here, NCCL on a GPU machine's CUDA ranks).

- One process trains micro-batches of batch × N rows with N threads; N processes train batch
  rows each with one thread: the same global batch on the same cores. The ratio is the median
  step time of the single process over the DDP step's.
- Communication share: every rank also times the same step with DDP's all-reduce skipped
  (`no_sync` on every micro-batch; the gradients are then wrong, which is why it is only
  timed), alternating with the real step; the share is 1 − t(no all-reduce) / t(step).
- Bytes all-reduced: a DDP communication hook adds up the gradient buckets it hands to the
  all-reduce; the step's total is printed against 4P, the fp32 gradient of P parameters.
  Buckets regroup the gradient but send every element once: the two agree unless parameters
  are unused (never all-reduced) or the hook runs more than once per step.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from falsify.errors import UsageError
from falsify.helptext import first_paragraph

MODEL = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
             intermediate_size=192, max_seq_len=32)


def _config(batch: int, threads: int):
    from falsify.llm import run as RUN

    return RUN.tiny_config("unused", batch_size=batch, grad_accum=2, max_steps=10**6,
                           warmup_steps=0, threads=threads, device="cpu", backend="torch",
                           **{k: v for k, v in MODEL.items() if k != "max_seq_len"},
                           seq_len=MODEL["max_seq_len"])


def _batches(rows: int, grad_accum: int, steps: int):
    import torch

    g = torch.Generator().manual_seed(0)
    v, s = MODEL["vocab_size"], MODEL["max_seq_len"]
    return [[(torch.randint(4, v, (rows, s), generator=g), torch.randint(4, v, (rows, s),
                                                                        generator=g))
             for _ in range(grad_accum)] for _ in range(steps)]


def _single(batch: int, world: int, steps: int) -> dict:
    import torch

    from falsify.llm import config as LC
    from falsify.llm.model import build_model
    from falsify.llm.trainer import Trainer

    cfg = _config(batch * world, world)
    torch.set_num_threads(world)
    model = build_model(LC.model_config(cfg), "torch", seed=0)
    tr = Trainer(model, cfg, torch.device("cpu"))
    times = []
    for micro in _batches(batch * world, cfg.grad_accum, steps + 1):
        t0 = time.perf_counter()
        tr.train_step(micro)
        times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times[1:]),
            "params": sum(p.numel() for p in model.parameters())}


def _rank(rank: int, world: int, tmp: str, batch: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from falsify.llm import config as LC
    from falsify.llm import distributed as D
    from falsify.llm.model import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world)
    tr = None
    try:
        cfg = _config(batch, 1)
        model = build_model(LC.model_config(cfg), "torch", seed=0)
        tr = D.DistributedTrainer(model, cfg, torch.device("cpu"),
                                  world=D.World(rank, world, "gloo"), dparts=D.DistParts())
        sent = [0]

        def counting(state, bucket):
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            sent[0] += bucket.buffer().numel() * bucket.buffer().element_size()
            return default_hooks.allreduce_hook(state, bucket)

        tr.wrapped.register_comm_hook(None, counting)
        synced, skipped, per_step = [], [], []
        for micro in _batches(batch * world, cfg.grad_accum, steps + 1):
            mine = D.shard(micro, rank, world)
            before = sent[0]
            t0 = time.perf_counter()
            tr.train_step(mine)
            synced.append(time.perf_counter() - t0)
            per_step.append(sent[0] - before)
            dist.barrier()
            with tr.wrapped.no_sync():  # the same step without the gradient all-reduce: timed only
                t0 = time.perf_counter()
                tr.train_step(mine)
                skipped.append(time.perf_counter() - t0)
            dist.barrier()
        if rank == 0:
            Path(tmp, "rank0.json").write_text(json.dumps({
                "step_s": statistics.median(synced[1:]),
                "no_allreduce_s": statistics.median(skipped[1:]),
                "bytes_per_step": int(statistics.median(per_step[1:]))}))
    finally:
        D.leave(completed=False, trainer=tr)


def run(world: int, batch: int, steps: int) -> dict:
    """One process, then `world` DDP processes, watched through the shared progress display
    on stderr, redrawn between the two only: on a terminal sides done of total and an ETA; in
    a log one line per finished side."""
    import torch.multiprocessing as mp
    from rich.console import Console

    from falsify.harness.progress import Progress

    with Progress(Console(stderr=True), "sides", total=2, ticking=False) as view:
        view.start(f"one process, {steps} steps")
        t0 = time.monotonic()
        one = _single(batch, world, steps)
        view.finished(f"bench distributed: one process: step {one['step_s'] * 1e3:.1f} ms, "
                      f"{time.monotonic() - t0:.0f} s")
        view.start(f"DDP, {world} processes, {steps} steps")
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(_rank, args=(world, tmp, batch, steps), nprocs=world,
                               start_method="spawn", join=True)
            ddp = json.loads(Path(tmp, "rank0.json").read_text())
        view.finished(f"bench distributed: DDP {world} processes: step "
                      f"{ddp['step_s'] * 1e3:.1f} ms, {time.monotonic() - t0:.0f} s")
    p = one["params"]
    return {"world": world, "batch_per_rank": batch, "global_rows": batch * world * 2,
            "steps": steps, "backend": "gloo", "params": p,
            "single_step_s": one["step_s"], "ddp_step_s": ddp["step_s"],
            "speedup": one["step_s"] / ddp["step_s"],
            "comm_share": 1 - ddp["no_allreduce_s"] / ddp["step_s"],
            "bytes_per_step": ddp["bytes_per_step"], "fp32_grad_bytes": 4 * p,
            "cpus": os.cpu_count()}


def register(sub) -> None:
    p = sub.add_parser("distributed", help="1 vs N DDP processes: step, comm share, bytes",
                       description=first_paragraph(__doc__))
    p.add_argument("--nproc", type=int, default=2, help="data-parallel processes (default 2)")
    p.add_argument("--batch", type=int, default=4, help="rows per rank and micro-batch")
    p.add_argument("--steps", type=int, default=10, help="timed steps (after one warm-up)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_distributed)


def cmd_distributed(args) -> int:
    if args.nproc < 2 or args.batch < 1 or args.steps < 1:
        raise UsageError("falsify bench distributed: --nproc >= 2, --batch >= 1 and --steps >= 1 "
                         f"(got {args.nproc}, {args.batch}, {args.steps})")
    r = run(args.nproc, args.batch, args.steps)
    if args.format == "json":
        print(json.dumps(r, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"one training step, global batch {r['global_rows']} rows × "
                    f"{MODEL['max_seq_len']} tokens (tiny model, {r['params']:,} params)")
    for col in ("", "processes × threads", "step (ms)", "ratio"):
        t.add_column(col)
    t.add_row("one process", f"1 × {r['world']}", f"{1e3 * r['single_step_s']:.1f}", "1.00")
    t.add_row(f"DDP ({r['backend']})", f"{r['world']} × 1", f"{1e3 * r['ddp_step_s']:.1f}",
              f"{r['speedup']:.2f}× faster" if r["speedup"] >= 1
              else f"{1 / r['speedup']:.2f}× slower")
    c = Console()
    c.print(t)
    c.print(f"communication share of the DDP step: {100 * r['comm_share']:.0f} % (the step "
            "against the same step with its all-reduce skipped)")
    ratio = r["bytes_per_step"] / r["fp32_grad_bytes"]
    c.print(f"all-reduced per step: {r['bytes_per_step']:,} bytes; the fp32 gradient is 4P = "
            f"{r['fp32_grad_bytes']:,} bytes (ratio {ratio:.3f})")
    return 0
