"""Loading a checkpoint of either layout (falsify/llm/checkpoint.py: one process's files;
falsify/llm/sharded_checkpoint.py: a data-parallel run's DCP shards and per-rank RNG files)
into a model and optimizer, for a resume or a probe. It lies above both writers, which do not
import each other's loader."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from falsify.llm import checkpoint as C
from falsify.llm import sharded_checkpoint as SC

log = logging.getLogger(__name__)


def load_checkpoint(ckpt: str | Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, param_names: list[str]) -> dict:
    """Restore weights (strict: every tensor present, shapes equal), optimizer state and RNG
    states; return state.json (step, data position, config, ...)."""
    ckpt = Path(ckpt)
    state = C.read_state(ckpt)
    if C._is_sharded(ckpt, None):
        _load_sharded(ckpt, state, model, optimizer, param_names)
        if optimizer is not None:
            _check_hyperparameters(ckpt, optimizer, state)
        return state
    weights = _load_tensors(ckpt, "model.safetensors")
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or extra:
        raise C.CheckpointError(f"{ckpt}: weights do not match the model "
                                f"(missing {missing[:5]}, unexpected {extra[:5]})")
    for k, v in weights.items():
        if v.shape != own[k].shape:
            raise C.CheckpointError(f"{ckpt}: {k} has shape {tuple(v.shape)}, "
                                    f"model expects {tuple(own[k].shape)}")
    model.load_state_dict({k: _placed_like(v, own[k]) for k, v in weights.items()}, strict=True)
    if optimizer is not None:
        if state["param_names"] != param_names:
            raise C.CheckpointError(f"{ckpt}: optimizer parameter order differs from the model's")
        flat = _load_tensors(ckpt, "optimizer.safetensors")
        sd = optimizer.state_dict()
        sd["state"] = {}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, name in enumerate(param_names):
            entry = {k[len(name) + 1:]: v for k, v in flat.items()
                     if k.startswith(name + ".") and k[len(name) + 1:] in
                     ("step", "exp_avg", "exp_avg_sq")}
            entry = {k: v if k == "step" else _placed_like(v, params[i])
                     for k, v in entry.items()}
            if entry:
                sd["state"][i] = entry
        optimizer.load_state_dict(sd)
        _check_hyperparameters(ckpt, optimizer, state)
    C.set_rng_state(state["rng"], _load_tensors(ckpt, "rng.safetensors"))
    return state


def _check_hyperparameters(ckpt: Path, optimizer, state: dict) -> None:
    """The scheduler owns lr; every other hyperparameter must be the saved one
    (nothing may silently replace a configured value on resume)."""
    for g, saved in zip(optimizer.param_groups, state["optimizer_groups"]):
        for k in ("betas", "eps", "weight_decay"):
            if list(np.atleast_1d(g[k])) != list(np.atleast_1d(saved[k])):
                raise C.CheckpointError(f"{ckpt}: optimizer {k}={g[k]} but the checkpoint "
                                        f"was written with {k}={saved[k]}")


def _placed_like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """A whole tensor from a checkpoint, sharded like `ref` when `ref` is a DTensor (an FSDP
    rank keeps its shard of it); otherwise as it is."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # DTensor's tables: >1 s

    if isinstance(ref, DTensor):
        return distribute_tensor(t.to(ref.device), ref.device_mesh, ref.placements)
    return t


def _load_tensors(ckpt: Path, name: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(ckpt / name))
    except FileNotFoundError:
        raise C.CheckpointDamaged(ckpt, name, "missing") from None
    except (SafetensorError, OSError) as e:
        raise C.CheckpointDamaged(ckpt, name, f"not a valid safetensors file ({e})") from None


def _load_sharded(ckpt: Path, state: dict, model, optimizer, param_names: list[str]) -> None:
    """Restore weights and AdamW state from the shards (resharded to however this run holds
    them: FSDP, DDP or one process, any world size) and this rank's RNG streams."""
    target = SC.dcp_state(model, optimizer, param_names) if optimizer is not None else \
        {"model": dict(model.state_dict())}
    if optimizer is not None and state["param_names"] != param_names:
        raise C.CheckpointError(f"{ckpt}: optimizer parameter order differs from the model's")
    dcp = SC._dcp()
    try:
        dcp.load(target, checkpoint_id=ckpt / C.SHARDS, no_dist=not dist.is_initialized())
    except (dcp.api.CheckpointException, Exception) as e:  # DCP's is a BaseException
        raise C.CheckpointError(f"{ckpt}/{C.SHARDS}: cannot be loaded into this model "
                                f"({_why(e)})") from None
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    saved_world = int(state.get("world_size", 1))
    own = rank if world == saved_world else 0
    if own != rank:
        log.info("the checkpoint's %d RNG streams do not split over %d processes: rank %d "
                 "continues rank 0's", saved_world, world, rank)
    path = ckpt / C.rng_file(own)
    try:
        with safe_open(str(path), "pt") as f:
            js = json.loads(f.metadata()["rng"])
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except FileNotFoundError:
        raise C.CheckpointDamaged(ckpt, path.name, "missing") from None
    except (SafetensorError, OSError, KeyError, TypeError, ValueError) as e:
        raise C.CheckpointDamaged(ckpt, path.name, f"not an RNG state file ({e})") from None
    C.set_rng_state(js, tensors)


def _why(e: BaseException) -> str:
    """One line: DCP's CheckpointException carries each rank's exception (its text is their
    tracebacks); distinct causes are named once."""
    causes = getattr(e, "failures", None) or {0: e}  # rank -> (exception, its frames)
    causes = {r: x[0] if isinstance(x, tuple) else x for r, x in causes.items()}
    lines = dict.fromkeys(f"{type(x).__name__}: {str(x).strip().splitlines()[-1][:300]}"
                          if str(x).strip() else type(x).__name__ for x in causes.values())
    return "; ".join(lines)
