"""Sharded checkpoints of data-parallel runs, written with torch.distributed.checkpoint (DCP).

    <run>/checkpoints/step-00000100/
        shards/                     DCP: weights and AdamW state as the ranks hold them (FSDP:
                                    each rank writes its 1/W; DDP: a replicated tensor once)
        rng-rank00000.safetensors   one per rank: its torch generators, with its python and
        rng-rank00001.safetensors   numpy states in the file's metadata
        model.safetensors           the whole weights, gathered to rank 0: export, eval and
                                    fine-tuning read the one-process layout unchanged
        state.json                  step, global data position, config, world_size
        manifest.json               size and sha256 of every file above; written last

Commit. Rank 0 creates the locked temp directory (checkpoint.py's rule for orphans) and sends
its name to the others. Every rank writes its part: the shards (dcp.save, collective) and its
RNG file. Then `wait_for_ranks`: only when every rank's part is on disk does rank 0 write
state.json and the manifest and rename the directory into place. A rank that dies anywhere
before the rename leaves the previous checkpoint the newest complete one, and its temp
directory an orphan that the next start removes.

Loading either layout is falsify/llm/checkpoint_load.py's. Resume at any world size: DCP
reads each rank's slices of whatever the savers held (FSDP 2 → DDP 1, 1 → 2, ...). The RNG
streams are per rank: at the same world size each rank takes its own, at another every rank
takes rank 0's (W streams cannot be split into W' others), and the log says so. Every rank
writes into one directory, so a multi-node run needs its out_dir on a file system that all
nodes see (as DCP's FileSystemWriter does).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from falsify.llm import checkpoint as C
from falsify.llm.checkpoint import SHARDS, rng_file, save_file  # noqa: F401  (SHARDS, rng_file: named here too)

LAYOUT = "sharded"

log = logging.getLogger(__name__)


def _dcp():
    """torch.distributed.checkpoint, imported when a sharded checkpoint is written or read: it
    pulls in DTensor's operator tables (over a second of CPU), which every command that merely
    imports the training loop (`falsify --help` among them) would otherwise pay."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.api  # noqa: F401  (CheckpointException)

    return dcp


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (an all-gather every rank joins); a plain tensor as it is."""
    from torch.distributed.tensor import DTensor  # DTensor's operator tables: see _dcp

    return t.full_tensor() if isinstance(t, DTensor) else t


def wait_for_ranks() -> None:
    """Before the commit: every rank's part of the checkpoint is written (a barrier)."""
    dist.barrier()


def dcp_state(model: torch.nn.Module, optimizer, names: list[str]) -> dict:
    """{model: the model's tensors, optim: "<param>.<exp_avg|exp_avg_sq|step>"}: the tensors
    themselves (DTensors under FSDP), so that dcp.load fills them in place. A parameter
    without AdamW state yet (a fresh optimizer being restored) gets zeros to be filled."""
    from falsify.kernels.torch.adamw import init_state

    params = [p for g in optimizer.param_groups for p in g["params"]]
    if len(params) != len(names):
        raise C.CheckpointError(f"{len(names)} names for {len(params)} optimizer parameters")
    optim = {}
    for name, p in zip(names, params, strict=True):
        st = optimizer.state[p]
        if not st:
            (st["exp_avg"],), (st["exp_avg_sq"],) = init_state([p])
            st["step"] = torch.zeros((), dtype=torch.float32)
        for k in ("exp_avg", "exp_avg_sq", "step"):
            optim[f"{name}.{k}"] = st[k]
    return {"model": dict(model.state_dict()), "optim": optim}


def save(run_dir: str | Path, step: int, model, optimizer, param_names: list[str], *,
         rank: int, world_size: int, data_state: dict, config: dict,
         metrics: dict | None = None, extra: dict | None = None, keep_last: int = 2,
         state_fn=dcp_state, wait=wait_for_ranks) -> Path:
    """Every rank calls this (collective); returns the committed checkpoint on every rank.
    `state_fn` and `wait` are the pieces distributed-train-v1 binds (DistParts)."""
    if keep_last < 1:
        raise C.CheckpointError(f"keep_last={keep_last}: must keep at least one checkpoint")
    root = C.checkpoints_dir(run_dir)
    final = root / f"{C.PREFIX}{step:08d}"
    tmp = lock_fd = lock = None
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        C.remove_orphans(run_dir)
        tmp, lock_fd, lock = C._locked_temp_dir(root, f".tmp-{final.name}-")
    box = [str(tmp) if tmp is not None else None]
    dist.broadcast_object_list(box, src=0)
    part = Path(box[0])
    dcp = _dcp()
    try:
        dcp.save(state_fn(model, optimizer, param_names), checkpoint_id=part / SHARDS)
        # the whole weights: an all-gather per tensor under FSDP, which every rank joins
        weights = {k: full(v).detach().to("cpu").contiguous()
                   for k, v in model.state_dict().items()}
        rng_js, rng_t = C.rng_state()
        save_file(rng_t, str(part / rng_file(rank)), metadata={"rng": json.dumps(rng_js)})
        wait()
        if rank == 0:
            save_file(weights, str(part / "model.safetensors"))
            groups = [{k: v for k, v in g.items() if k != "params"}
                      for g in optimizer.param_groups]
            state = {"step": step, "time": time.time(), "data": data_state, "rng": rng_js,
                     "config": config, "optimizer_groups": groups,
                     "param_names": param_names, "metrics": metrics or {},
                     "layout": LAYOUT, "world_size": world_size, **(extra or {}),
                     C.STATE_HASHES: C.content_hashes(part)}
            (part / C.STATE).write_text(json.dumps(state, indent=1, default=C._json_default))
            for f in (part / "model.safetensors", part / C.STATE):
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            C.write_manifest(part)
            if final.exists():
                C._discard(final)
            os.replace(part, final)
            C._fsync_dir(root)
    finally:
        if rank == 0:
            if part.exists():
                shutil.rmtree(part, ignore_errors=True)
            Path(lock).unlink(missing_ok=True)
            os.close(lock_fd)
    done = [str(final) if rank == 0 else None]
    dist.broadcast_object_list(done, src=0)  # nobody goes on before the commit
    if rank == 0:
        C.prune(run_dir, keep_last)
    return Path(done[0])
