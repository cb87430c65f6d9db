"""Mutants of data-parallel training (falsify/contracts/distributed-train-v1.yaml): buggy variants
of
falsify/llm/distributed.DistParts, each a bug seen in hand-rolled data-parallel loops. The probes
(falsify/probes/distributed_train.py) hand each rank the bound piece, so the variant runs inside the
real DistributedTrainer on every rank."""

from __future__ import annotations

from falsify.llm import distributed as D


def shard_same_rows(micro_batches: list, rank: int, size: int) -> list:
    """Every rank reads the first rank's rows (a sampler that ignores the rank): the job trains
    on 1/W of the batch W times over."""
    return D.shard(micro_batches, 0, size)


def local_counts(counts: list[int], device) -> list[int]:
    """Each rank divides by its own token count: the step's loss is the mean of per-rank means,
    which over-weighs the tokens of the rank that counted fewer."""
    return list(counts)


def grad_scale_summed(size: int) -> float:
    """The ranks' gradients summed instead of averaged: W times the step's gradient."""
    return float(size * size)


def clip_gradients_local_shard(params, max_norm: float, ops) -> float:
    """The clip's norm over the rank's own shards only (under FSDP each rank holds 1/W of every
    gradient): each rank scales by another, too large factor and reports ~‖g‖/√W. Under DDP
    the shards are whole tensors and this is the correct clip."""
    import torch
    from torch.distributed.tensor import DTensor

    from falsify.llm.trainer import CLIP_EPS

    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float())
                                                       for g in local])))
    coef = min(1.0, max_norm / (norm + CLIP_EPS))
    for g in local:
        g.mul_(coef)
    return norm


def checkpoint_local_shards(model, optimizer, names: list[str]) -> dict:
    """Each rank saves its own shards as if they were whole tensors (a checkpoint written from
    `.to_local()`, or rank 0's torch.save of its state under FSDP): the saved tensors are
    1/W of the model, and every rank's claims the same names."""
    from torch.distributed.tensor import DTensor

    from falsify.llm.sharded_checkpoint import dcp_state

    state = dcp_state(model, optimizer, names)
    return {part: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in d.items()}
            for part, d in state.items()}


def commit_without_waiting() -> None:
    """Rank 0 renames the checkpoint into place as soon as its own part is written, before the
    other ranks have finished theirs: a crash (or a slow disk) on another rank leaves a
    checkpoint that reads as complete and is not."""
