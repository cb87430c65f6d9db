"""Data-parallel pretraining on torch.distributed: DDP, launched by torchrun.

The engine is torch's (process groups, torchrun's launcher, DistributedDataParallel); what
this module adds is the loop's side of the bargain, which
falsify/contracts/distributed-train-v1.yaml
checks against a single process:

- Data. Each optimizer step's global batch is the single-process batch with micro-batches of
  batch_size × W blocks (the sampler runs with that size, so its order is a function of seed,
  step and world size, and its position is global). Rank r reads rows [r·b, (r+1)·b) of every
  micro-batch (`shard`): the shards are disjoint and their union is the global batch.
- Normalisation. Every rank divides its loss sum by the *global* count of trained targets,
  all-reduced before the first backward (`global_counts`), and multiplies by W, because DDP
  averages gradients over the W ranks (`grad_scale`): the gradient is Σ_ranks Σ_micro ∇s / n,
  every token weighted the same across ranks, not a mean of per-rank means.
- Accumulation. DDP's no_sync on every micro-batch but the last: one all-reduce per step.
- Replicas. After that all-reduce every rank holds the same gradient, so the clip's norm is the
  global one and the AdamW update keeps the ranks bit-identical.
- Checkpoints. Sharded, with torch.distributed.checkpoint: every rank writes its part, and
  rank 0 commits the directory only after all of them have (falsify/llm/sharded_checkpoint.py).
  Logs and metrics: rank 0 writes them.
- The run. `DataParallel` is a run's process strategy (falsify/llm/run_base.py:OneProcess is
  the one-process one): the pretraining and fine-tuning runs ask it for their rank, writer,
  global batch, rows, trainer and checkpoint save, so one run class serves both.

Backend: gloo on the CPU, nccl on CUDA, chosen from the run's device and logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from falsify.llm import sharded_checkpoint
from falsify.llm.run_base import OneProcess, metrics_extra
from falsify.llm.sharded_checkpoint import full  # noqa: F401  (named here too: the probes)
from falsify.llm.trainer import IGNORE_INDEX, Trainer

log = logging.getLogger("falsify.distributed")


# ----------------------------------------------------------------------------------- world
@dataclass(frozen=True)
class World:
    rank: int
    size: int
    backend: str

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """The world size torchrun (or any env:// launcher) gave this process; 1 when none did."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def join(device: torch.device) -> World:
    """Join the process group the launcher described in the environment (env://)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    world = World(dist.get_rank(), dist.get_world_size(), dist.get_backend())
    log.info("rank %d of %d, backend %s", world.rank, world.size, world.backend)
    return world


def leave(completed: bool = True, trainer=None) -> None:
    """Leave the process group. `trainer`'s DDP wrapper goes first (DataParallelStep.release
    says why). After a completed run every rank then meets the others at a barrier: a rank
    that tears its connections down while a peer still has one in flight aborts in gloo
    ("terminate called without an active exception", seen at the end of FSDP runs)."""
    if trainer is not None:
        trainer.release()
    if dist.is_initialized():
        if completed:
            dist.barrier()
        dist.destroy_process_group()


def launch(nproc: int, nnodes: int, rdzv_endpoint: str | None, argv: list[str]) -> int:
    """Run `python -m falsify ARGV` as nproc × nnodes ranks through torchrun's launcher API
    (one elastic agent per node, c10d rendezvous, no restarts: a rank that fails stops the job
    with its error). Returns the exit code: 0, or the first failed rank's."""
    # torch's elastic launcher loads only in the launching process, not in every rank
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1 or nnodes < 1:
        raise ValueError(f"--nproc {nproc} and --nnodes {nnodes} must be ≥ 1")
    if nnodes > 1 and not rdzv_endpoint:
        raise ValueError("a multi-node job needs --rdzv-endpoint HOST:PORT (the same on every "
                         "node)")
    # every node of a job must name the same rendezvous id: derived from the endpoint they all
    # name, so no node needs another argument; a one-node job gets a fresh one
    run_id = f"falsify-{rdzv_endpoint}" if rdzv_endpoint else str(uuid.uuid4())
    cfg = LaunchConfig(min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc,
                       rdzv_backend="c10d", rdzv_endpoint=rdzv_endpoint or "localhost:0",
                       run_id=run_id, max_restarts=0, monitor_interval=0.5)
    log.info("launching %d process(es) on each of %d node(s)", nproc, nnodes)
    try:
        elastic_launch(cfg, entrypoint=sys.executable)("-m", "falsify", *argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(f"falsify: rank {rank} failed (exit code {failure.exitcode}); the job stopped",
              file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    return 0


# ------------------------------------------------------------------ the swappable pieces
def shard(micro_batches: list, rank: int, size: int) -> list:
    """Rank `rank`'s rows of every global micro-batch [b·W, S]: rows [r·b, (r+1)·b)."""
    out = []
    for x, y in micro_batches:
        b, rem = divmod(x.shape[0], size)
        if rem:
            raise ValueError(f"a global micro-batch of {x.shape[0]} rows does not split over "
                             f"{size} ranks")
        out.append((x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]))
    return out


def global_counts(counts: list[int], device: torch.device) -> list[int]:
    """Each micro-batch's count of trained targets summed over the ranks (one all-reduce)."""
    t = torch.tensor(counts, dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [int(c) for c in t.tolist()]


def grad_scale(size: int) -> float:
    """What each rank multiplies its normalised loss by: DDP averages the ranks' gradients,
    and the step's gradient is their sum (each already divided by the global count)."""
    return float(size)


@dataclass(frozen=True)
class DistParts:
    """The data-parallel pieces distributed-train-v1 binds and its mutants replace."""

    shard: Callable = shard
    global_counts: Callable = global_counts
    grad_scale: Callable = grad_scale
    checkpoint_state: Callable = sharded_checkpoint.dcp_state
    wait_for_ranks: Callable = sharded_checkpoint.wait_for_ranks


# ------------------------------------------------------------------------------- the step
class _Root(torch.nn.Module):
    """The module DDP or FSDP wraps, so their hooks see every call that reads the weights:
    forward(x, y) is the model's fused loss sum (the training step), forward(x) its logits
    (evaluation; sampling passes last_only, as Transformer.forward takes it)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @property
    def cfg(self):
        return self.model.cfg

    def forward(self, x, y=None, last_only=False):
        if y is None:
            return self.model(x, last_only=last_only)
        return self.model.loss_sum(x, y, IGNORE_INDEX)[0]


class _MicroRoot(torch.nn.Module):
    """The module DDP wraps for a trainer with its own micro-batch objective (fine-tuning:
    SFT or DPO): forward(micro) is the trainer's micro_loss, which reads `model`'s weights."""

    def __init__(self, trainer):
        super().__init__()
        self.model = trainer.model
        self._micro_loss = trainer.micro_loss  # a bound method, not a submodule

    def forward(self, micro):
        return self._micro_loss(micro)


class DataParallelStep:
    """The step's data-parallel half, over any Trainer (mixed in before it): global counts,
    W·s/N per rank, accumulation under no_sync, one gradient reduction per step, and the
    step's loss and stats summed over the ranks. A subclass sets `world`, `dparts`,
    `parallel` and `wrapped` (DDP or the FSDP root), and says how `wrapped` takes a
    micro-batch (`parallel_loss`)."""

    world: World
    dparts: DistParts
    parallel: str
    wrapped: torch.nn.Module

    def parallel_loss(self, micro) -> tuple[torch.Tensor, dict]:
        raise NotImplementedError

    def release(self) -> None:
        """Drop the DDP (or FSDP root) wrapper while the process group is still registered.
        DDP's Reducer holds the group; if the Reducer is its last holder, the group is
        destroyed when the Reducer is deallocated, with the GIL held, and ~ProcessGroupGloo
        then joins a worker thread that waits for the GIL to free a finished barrier's
        tensors: a rank hung at exit (seen with py-spy in a 2 → 2 resume)."""
        self.wrapped = None
        self.forward_model = self.model
        gc.collect()

    def no_sync(self):
        """Accumulate without reducing (every micro-batch but the step's last)."""
        if self.parallel == "ddp":
            return self.wrapped.no_sync()
        return _fsdp_no_sync(self.wrapped)

    def forward_backward(self, micro_batches: list) -> tuple[float, int, dict]:
        counts = self.dparts.global_counts([self.count(m) for m in micro_batches],
                                           self.device)
        n = sum(counts)
        if n == 0:
            raise ValueError(f"step {self.step + 1}: no trained target in any micro-batch "
                             "(every target is ignore_index); nothing to learn from")
        divisors = self.parts.micro_batch_divisors(counts)
        scale = self.dparts.grad_scale(self.world.size)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        stats: dict = {}
        last = len(micro_batches) - 1
        for i, (m, d) in enumerate(zip(micro_batches, divisors, strict=True)):
            with self.no_sync() if i < last else contextlib.nullcontext():
                s, st = self.parallel_loss(m)
                (s * (scale / d)).backward()
            total += s.detach().double()
            for k, v in st.items():
                stats[k] = stats.get(k, 0) + v
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        if stats:  # the step's stats are the ranks' sums, as one process would count them
            keys = sorted(stats)
            t = torch.tensor([float(stats[k]) for k in keys], dtype=torch.float64,
                             device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            stats = dict(zip(keys, t.tolist(), strict=True))
        return float(total) / n, n, stats


class DistributedTrainer(DataParallelStep, Trainer):
    """The pretraining step with DDP or FSDP underneath.

    DDP keeps a full replica per rank and all-reduces the gradient. FSDP (fully_shard per
    decoder layer and on the root) keeps 1/W of every weight, gradient and AdamW moment, as
    DTensors: it gathers a layer's weights for its forward and backward and reduce-scatters its
    gradient. Both average over the ranks, hence the same W·s/N. The clip's norm over DTensor
    gradients is the global one (DTensor reduces the shards' partial sums)."""

    def __init__(self, model, cfg, device, autocast_dtype=None, parts=None, *, world: World,
                 dparts: DistParts, parallel: str = "ddp"):
        if autocast_dtype is not None:
            raise ValueError("data-parallel training runs fp32 (precision='fp32' or 'auto')")
        self.world, self.dparts, self.parallel = world, dparts, parallel
        loss_module = _Root(model)
        if parallel == "fsdp":
            # before the optimizer is built: fully_shard replaces the parameters by DTensors
            from torch.distributed.fsdp import fully_shard

            for layer in model.layers:
                fully_shard(layer)
            fully_shard(loss_module)
        Trainer.__init__(self, model, cfg, device, autocast_dtype, parts)
        if parallel == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            loss_module = DistributedDataParallel(loss_module, device_ids=ids)
        elif parallel != "fsdp":
            raise ValueError(f"parallel={parallel!r}: must be ddp or fsdp")
        self.wrapped = loss_module  # DDP(root) or the FSDP root: what the step calls
        # evaluation and sampling: under FSDP through the root (its forward gathers the
        # sharded weights); under DDP the replica itself, which is the model (it has the
        # model's cfg) — DDP's wrapper adds only gradient reduction, which they do not need
        self.forward_model = loss_module.module if parallel == "ddp" else loss_module

    def parallel_loss(self, micro) -> tuple[torch.Tensor, dict]:
        x, y = micro
        return self.wrapped(x.to(self.device), y.to(self.device)), {}

    @torch.no_grad()
    def evaluate(self, batches) -> tuple[float, float]:
        out = super().evaluate(batches)
        self.settle()
        return out

    def settle(self) -> None:
        """FSDP leaves the root's weights gathered after a forward without backward (it
        expects the backward to need them): give them back, so no gathered state or pending
        work outlives an evaluation or the run."""
        if self.parallel == "fsdp":
            self.wrapped.reshard()


def ddp_over_objective(trainer) -> DistributedDataParallel:
    """DDP over a _MicroRoot of `trainer`'s own micro_loss (fine-tuning). Only the trainable
    parameters (the adapters) are reduced; the frozen base, loaded alike on every rank, is
    not broadcast at each forward (broadcast_buffers=False: its NF4 codes are buffers)."""
    ids = [trainer.device.index] if trainer.device.type == "cuda" else None
    return DistributedDataParallel(_MicroRoot(trainer), device_ids=ids,
                                   broadcast_buffers=False)


@contextlib.contextmanager
def _fsdp_no_sync(module):
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


# --------------------------------------------------------------------- the run's strategy
class DataParallel:
    """A run's process strategy (falsify/llm/run_base.py: OneProcess is the one-process one)
    when this process is one rank of a torchrun job: the local rank's GPU when the run is on
    CUDA, the process group joined, rank 0 alone writing files, the data drawn as the global
    batch (batch_size × W) and each rank training its rows of it."""

    def __init__(self, dparts: DistParts | None = None):
        self.dparts = dparts or DistParts()
        self.world: World | None = None  # joined in attach, once the run's device is known

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    @property
    def writes(self) -> bool:
        return self.world.main

    def attach(self, device: torch.device) -> torch.device:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        self.world = join(device)
        return device

    def agree(self, decide):
        """Rank 0 decides (a new run directory's name), every rank gets its value."""
        box = [decide()] if self.world.main else [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def global_batch(self, cfg):
        """The sampler and the step count run on the global batch: batch_size × W."""
        return dataclasses.replace(cfg, batch_size=cfg.batch_size * self.world.size)

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 does the work first (builds the data cache: tokenizer, token files), then
        the others, which read what it wrote."""
        if not self.world.main:
            dist.barrier()
        yield
        if self.world.main:
            dist.barrier()

    def shard_blocks(self, micro: list) -> list:
        return self.dparts.shard(micro, self.world.rank, self.world.size)

    def local_rows(self, idx, per: int):
        r = self.world.rank
        return idx[r * per:(r + 1) * per]

    def trainer(self, run) -> Trainer:
        return run.make_parallel_trainer(self.world, self.dparts)

    def save(self, run, metrics: dict | None) -> Path:
        """A run whose state may be sharded (pretraining under FSDP) writes a sharded
        checkpoint, every rank its part; a run of replicas (fine-tuning's adapters, bit-identical
        after every step) is saved by rank 0 in the one-process layout while the others wait."""
        tr = run.trainer
        if run.shards_state:
            return sharded_checkpoint.save(
                run.out, tr.step, run.checkpoint_module(), tr.optimizer, tr.param_names,
                rank=self.world.rank, world_size=self.world.size,
                data_state=run.sampler.state_dict(), config=run.checkpoint_config(),
                metrics=metrics,
                extra={**run.checkpoint_extra(), **metrics_extra(run, tr.step)},
                keep_last=run.cfg.keep_last,
                state_fn=self.dparts.checkpoint_state, wait=self.dparts.wait_for_ranks)
        path = OneProcess().save(run, metrics) if self.world.main else None
        box = [str(path) if path is not None else None]
        dist.broadcast_object_list(box, src=0)  # also the barrier: the save is complete
        return Path(box[0])

    def settle(self, trainer: Trainer) -> None:
        trainer.settle()

    def leave(self, completed: bool, trainer: Trainer | None) -> None:
        """A process group left to the interpreter's exit can abort it (SIGABRT)."""
        leave(completed, trainer)
