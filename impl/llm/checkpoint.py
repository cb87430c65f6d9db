"""Checkpoints: everything needed to continue a run bit-identically.

    <run>/checkpoints/step-00000100/
        model.safetensors      weights, HF-style names (impl/model.py), fp32
        optimizer.safetensors  AdamW exp_avg / exp_avg_sq / step per parameter name
        rng.safetensors        torch CPU (and CUDA) generator states
        state.json             step, data position, python + numpy RNG states, config,
                               optimizer hyperparameters, metrics (val_loss), timestamp

Atomicity is directory-level: the checkpoint is written into `.tmp-...` in the same directory
and renamed into place with os.replace, so a reader (or a resume after `kill -9`) sees either a
complete checkpoint or none; names starting with '.' are never considered. Retention keeps the
last N and the best (lowest val_loss); a pruned directory is renamed to `.trash-...` before it is
deleted so a half-deleted checkpoint can never look complete.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

STATE = "state.json"
PREFIX = "step-"


class CheckpointError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ RNG
def rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON-able python/numpy states, tensors for torch generators)."""
    py = random.getstate()
    np_state = np.random.get_state()
    js = {"python": [py[0], list(py[1]), py[2]],
          "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]),
                    float(np_state[4])]}
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return js, tensors


def set_rng_state(js: dict, tensors: dict[str, torch.Tensor]) -> None:
    v, internal, gauss = js["python"]
    random.setstate((v, tuple(internal), gauss))
    n = js["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A fresh hidden directory next to its final place (same file system, so os.replace is
    atomic), with the permissions a plain mkdir would give (mkdtemp's are 0700)."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


# ------------------------------------------------------------------------------- layout
def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (state.json present, not a temp/trash dir), oldest first."""
    d = checkpoints_dir(run_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def read_state(ckpt: str | Path) -> dict:
    return json.loads((Path(ckpt) / STATE).read_text())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: str | Path) -> Path | None:
    scored = [(s["metrics"]["val_loss"], int(s["step"]), p) for p in list_checkpoints(run_dir)
              if (s := read_state(p)).get("metrics", {}).get("val_loss") is not None]
    return min(scored)[2] if scored else None


def find_checkpoint(target: str | Path) -> Path:
    """`target` is a checkpoint directory or a run directory (its latest checkpoint)."""
    p = Path(target)
    if (p / STATE).is_file():
        return p
    latest = latest_checkpoint(p)
    if latest is None:
        raise CheckpointError(f"no complete checkpoint under {p} (looked for "
                              f"{checkpoints_dir(p)}/{PREFIX}*/{STATE})")
    return latest


# --------------------------------------------------------------------------------- save
def _optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> dict:
    """Flatten AdamW state to name-keyed tensors; `names` are the parameter names in the
    optimizer's own parameter order."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if len(params) != len(names):
        raise CheckpointError(f"{len(names)} names for {len(params)} optimizer parameters")
    out = {}
    for name, p in zip(names, params):
        for k, v in optimizer.state.get(p, {}).items():
            t = v if torch.is_tensor(v) else torch.tensor(float(v))
            out[f"{name}.{k}"] = t.detach().to("cpu").contiguous()
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, param_names: list[str], *,
                    data_state: dict, config: dict, metrics: dict | None = None,
                    extra: dict | None = None, keep_last: int = 2) -> Path:
    """Write checkpoint `step` atomically, then prune to the last `keep_last` + best."""
    if keep_last < 1:
        raise CheckpointError(f"keep_last={keep_last}: must keep at least one checkpoint")
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:08d}"
    tmp = make_temp_dir(root, f".tmp-{final.name}-")
    try:
        weights = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(tmp / "model.safetensors"))
        save_file(_optimizer_tensors(optimizer, param_names), str(tmp / "optimizer.safetensors"))
        rng_js, rng_t = rng_state()
        save_file(rng_t, str(tmp / "rng.safetensors"))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        state = {"step": step, "time": time.time(), "data": data_state, "rng": rng_js,
                 "config": config, "optimizer_groups": groups, "param_names": param_names,
                 "metrics": metrics or {}, **(extra or {})}
        (tmp / STATE).write_text(json.dumps(state, indent=1, default=_json_default))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            # Re-saving a step (e.g. resumed at it): move the old one aside first; os.replace
            # cannot replace a non-empty directory.
            _discard(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    prune(run_dir, keep_last)
    return final


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON-serialisable in checkpoint state: {type(o).__name__}")


def _discard(path: Path) -> None:
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the last `keep_last` checkpoints and the best one; returns the deleted."""
    found = list_checkpoints(run_dir)
    keep = set(found[-keep_last:])
    best = best_checkpoint(run_dir)
    if best is not None:
        keep.add(best)
    gone = [p for p in found if p not in keep]
    for p in gone:
        _discard(p)
    return gone


# --------------------------------------------------------------------------------- load
def load_checkpoint(ckpt: str | Path, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, param_names: list[str]) -> dict:
    """Restore weights (strict: every tensor present, shapes equal), optimizer state and RNG
    states; return state.json (step, data position, config, ...)."""
    ckpt = Path(ckpt)
    state = read_state(ckpt)
    weights = load_file(str(ckpt / "model.safetensors"))
    own = model.state_dict()
    missing, extra = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    if missing or extra:
        raise CheckpointError(f"{ckpt}: weights do not match the model "
                              f"(missing {missing[:5]}, unexpected {extra[:5]})")
    for k, v in weights.items():
        if v.shape != own[k].shape:
            raise CheckpointError(f"{ckpt}: {k} has shape {tuple(v.shape)}, "
                                  f"model expects {tuple(own[k].shape)}")
    model.load_state_dict(weights, strict=True)
    if optimizer is not None:
        if state["param_names"] != param_names:
            raise CheckpointError(f"{ckpt}: optimizer parameter order differs from the model's")
        flat = load_file(str(ckpt / "optimizer.safetensors"))
        sd = optimizer.state_dict()
        sd["state"] = {}
        for i, name in enumerate(param_names):
            entry = {k[len(name) + 1:]: v for k, v in flat.items()
                     if k.startswith(name + ".") and k[len(name) + 1:] in
                     ("step", "exp_avg", "exp_avg_sq")}
            if entry:
                sd["state"][i] = entry
        optimizer.load_state_dict(sd)
        # The scheduler owns lr; every other hyperparameter must be the saved one
        # (C-HYPERPARAMS-001: nothing may silently replace a configured value on resume).
        for g, saved in zip(optimizer.param_groups, state["optimizer_groups"]):
            for k in ("betas", "eps", "weight_decay"):
                if list(np.atleast_1d(g[k])) != list(np.atleast_1d(saved[k])):
                    raise CheckpointError(f"{ckpt}: optimizer {k}={g[k]} but the checkpoint was "
                                          f"written with {k}={saved[k]}")
    set_rng_state(state["rng"], load_file(str(ckpt / "rng.safetensors")))
    return state
