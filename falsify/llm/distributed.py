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

Backend: gloo on the CPU, nccl on CUDA, chosen from the run's device and logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from falsify.llm import sharded_checkpoint
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
    import sys
    import uuid

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
    (evaluation, sampling)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    @property
    def cfg(self):
        return self.model.cfg

    def forward(self, x, y=None):
        if y is None:
            return self.model(x)
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
        self.forward_model = loss_module  # evaluation and sampling go through it too

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


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (an all-gather every rank joins); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


# -------------------------------------------------------------------------------- the run
def _become_rank(run, dparts: DistParts | None) -> None:
    """A run (pretraining or fine-tuning) becomes one rank of the job: the local rank's GPU
    when the run is on CUDA, the process group joined, and only rank 0 writes files."""
    if run.device.type == "cuda":
        run.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(run.device)
    run.world = join(run.device)
    run.dparts = dparts or DistParts()
    run.writes = run.world.main
    run.world_size = run.world.size


def distributed_run_class():
    """PretrainRun with the data-parallel stages (imported late: run.py imports this module)."""
    from falsify.llm.config import effective_config
    from falsify.llm.run import PretrainRun, metrics_extra, new_run_dir

    class DistributedRun(PretrainRun):
        """Rank 0 decides the run directory and writes every file; every rank trains."""

        def __init__(self, cfg, parts, dparts: DistParts | None = None):
            super().__init__(cfg, parts)
            _become_rank(self, dparts)

        def open(self, resume) -> None:
            if self.cfg.out_dir is None and resume is None:
                name = [str(new_run_dir(self.cfg.model))] if self.world.main else [None]
                dist.broadcast_object_list(name, src=0)
                self.cfg = dataclasses.replace(self.cfg, out_dir=name[0])
            super().open(resume)

        def prepare(self, data) -> None:
            # one rank builds the data cache (tokenizer, token files), then the others read it
            global_cfg = dataclasses.replace(self.cfg, batch_size=self.cfg.batch_size
                                             * self.world.size)
            local_cfg, self.cfg = self.cfg, global_cfg
            try:
                if not self.world.main:
                    dist.barrier()
                super().prepare(data)
                if self.world.main:
                    dist.barrier()
            finally:
                self.cfg = local_cfg

        def next_micro(self) -> list:
            return self.dparts.shard(self.sampler.next_step(), self.world.rank, self.world.size)

        def make_trainer(self) -> Trainer:
            return DistributedTrainer(self.model, self.cfg, self.device, self.autocast,
                                      self.parts, world=self.world, dparts=self.dparts,
                                      parallel=self.cfg.parallel)

        def finish(self) -> None:
            super().finish()
            self.trainer.settle()

        def save(self, metrics: dict | None = None) -> Path:
            tr = self.trainer
            return sharded_checkpoint.save(
                self.out, tr.step, self.model, tr.optimizer, tr.param_names,
                rank=self.world.rank, world_size=self.world.size,
                data_state=self.sampler.state_dict(),
                config=effective_config(self.cfg, self.kernels), metrics=metrics,
                extra={"best_val_loss": self.best_val, **metrics_extra(self, tr.step)},
                keep_last=self.cfg.keep_last,
                state_fn=self.dparts.checkpoint_state, wait=self.dparts.wait_for_ranks)

    return DistributedRun


def distributed_finetune_run_class():
    """FinetuneRun with DDP (imported late: finetune.py is the heavier import). Fine-tuning
    trains adapters, a small share of the model, over a frozen base that every rank loads
    whole: DDP, not FSDP. Rank 0 writes the run directory and the checkpoints, which are the
    one-process layout (the replicas are bit-identical after every step)."""
    from falsify.llm import finetune as FT

    class DataParallelFinetuneTrainer(DataParallelStep, FT.FinetuneTrainer):
        def __init__(self, model, cfg, device, autocast_dtype, kind, objectives, *,
                     world: World, dparts: DistParts):
            FT.FinetuneTrainer.__init__(self, model, cfg, device, autocast_dtype, kind,
                                        objectives)
            self.world, self.dparts, self.parallel = world, dparts, "ddp"
            self.wrapped = ddp_over_objective(self)

        def parallel_loss(self, micro):
            return self.wrapped(micro)

    class DistributedFinetuneRun(FT.FinetuneRun):
        def __init__(self, cfg, obj, dparts: DistParts | None = None):
            super().__init__(cfg, obj)
            _become_rank(self, dparts)

        def load(self, base, dataset, console) -> None:
            # the sampler and the step count run on the global batch (batch_size × W)
            local = self.cfg
            self.cfg = dataclasses.replace(local, batch_size=local.batch_size * self.world.size)
            try:
                super().load(base, dataset, console)
            finally:
                self.cfg = local

        def next_micro(self) -> list:
            per = self.cfg.batch_size
            r = self.world.rank
            return [FT.make_micro(self.train_ex, idx[r * per:(r + 1) * per], self.dataset.kind,
                                  self.pad_id, self.weights)
                    for idx in self.sampler.next_step()]

        def make_trainer(self):
            return DataParallelFinetuneTrainer(self.model, self.rcfg, self.device,
                                               self.autocast, self.dataset.kind, self.obj,
                                               world=self.world, dparts=self.dparts)

        def save(self, metrics=None) -> Path:
            path = super().save(metrics) if self.world.main else None
            box = [str(path) if path is not None else None]
            dist.broadcast_object_list(box, src=0)  # also the barrier: the save is complete
            return Path(box[0])

    return DistributedFinetuneRun
