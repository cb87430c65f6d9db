"""Kernel backend selection for the model.

The model never calls a kernel directly: it asks `get_ops(backend)` for an `Ops` bundle and calls
`ops.rmsnorm(...)`, `ops.rope(...)`, ... . The kernels live at `falsify.kernels.<backend>.<kernel>`
(one module per kernel, the function named like the module), so the contract that tests
`falsify/kernels/torch/rope.py` tests exactly the code the training loop runs.

The training loop's own kernels come from the same bundle: `ops.adamw` (the optimizer update),
`ops.grad_clip` (global-norm clipping) and `ops.lr_schedule` (the per-step learning rate), so
the adamw, grad-clip and lr-schedule contracts test exactly what a run executes, and
`ops.provenance` names every function that ran.

Rules: a backend that was asked for by name and cannot run is an error, never a
silent fallback. Only `backend="auto"` and the dispatch policies choose, and they log what they
chose and why. A policy (`fastest-verified`, `prefer:<backend>`, `reference`;
falsify/llm/dispatch.py) chooses per kernel from the results ledger: the bundle then mixes
backends, and `dispatch` records each kernel's backend and the reason.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

BACKENDS = ("torch", "triton", "auto")
# The dispatch policies' names (their rules: falsify/llm/dispatch.py, which this module does not
# import, so that the fingerprint of everything built on the model leaves the dispatcher out)
FASTEST, REFERENCE, PREFER = "fastest-verified", "reference", "prefer:"
POLICY_BACKENDS = ("torch", "triton")  # what prefer:<backend> may name


def is_policy(backend: str) -> bool:
    return backend in (FASTEST, REFERENCE) or backend.startswith(PREFER)
# The kernels the model needs. gemm is deliberately absent: projections go through
# `Ops.linear` (F.linear, weights stored [out, in] like HF) on every backend; see `linear` below.
KERNELS = ("rmsnorm", "rope", "attention", "swiglu", "embedding", "fused_linear_cross_entropy")
# The training step's kernels: name -> (module, function) under falsify.kernels.<backend>, and the
# backend it comes from when that is not the model's. The schedule is a host-side float64
# scalar per step (no tensor work), so one implementation, torch's, serves every backend.
TRAINING_KERNELS = {"adamw": ("adamw", "adamw_multi"),
                    "grad_clip": ("grad_clip", "clip_grad_norm_"),
                    "lr_schedule": ("lr_schedule", "set_lr")}
HOST_KERNELS = {"lr_schedule": "torch"}


class BackendUnavailableError(RuntimeError):
    """The requested kernel backend cannot run here (no GPU, kernel module missing, ...)."""


def gpu_available() -> bool:
    return torch.cuda.is_available()


def _triton_runnable() -> tuple[bool, str]:
    """Triton kernels run on a GPU, or on CPU under the interpreter. Importing
    falsify.kernels.triton switches the interpreter on (and says so on stderr) when no GPU is
    visible and triton is not imported yet; after that, TRITON_INTERPRET tells which case we are
    in."""
    if gpu_available():
        return True, "a CUDA GPU is present"
    try:
        importlib.import_module("falsify.kernels.triton")
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        return False, f"falsify.kernels.triton does not import ({type(e).__name__}: {e})"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, "no GPU: Triton interpreter (TRITON_INTERPRET=1), slow"
    return False, ("no CUDA GPU, and triton was imported before the interpreter could be "
                   "enabled (set TRITON_INTERPRET=1 before importing triton)")


def backend_error(requested: str) -> str | None:
    """Why `requested` is neither a backend nor a dispatch policy, or None."""
    if requested in BACKENDS:
        return None
    if is_policy(requested):
        if requested.startswith(PREFER) and requested[len(PREFER):] not in POLICY_BACKENDS:
            return f"prefer:<backend> names one of {', '.join(POLICY_BACKENDS)}"
        return None
    return (f"must be one of {', '.join(BACKENDS)}, or a dispatch policy: "
            f"{FASTEST}, {PREFER}<backend>, {REFERENCE}")


def resolve_backend(requested: str) -> str:
    """Map a requested backend to the one that will run; errors name the problem.

    `auto` picks triton only when a GPU is present (the interpreter is for tests, far too slow to
    train with), otherwise torch, and logs the choice at INFO level once per process (a run
    resolves its backend for the check before any work and again when it builds the model; the
    answer cannot change in between). A dispatch policy is returned as it is: it chooses per
    kernel (falsify/llm/dispatch.configure)."""
    bad = backend_error(requested)
    if bad:
        raise ValueError(f"backend={requested!r}: {bad}")
    if is_policy(requested):
        return requested
    if requested == "auto":
        if gpu_available():
            missing = [k for k in KERNELS if _find_module("triton", k) is None]
            if not missing:
                _say_once("backend=auto -> triton (CUDA GPU present, all triton kernels import)")
                return "triton"
            _say_once("backend=auto -> torch (CUDA GPU present but triton kernels missing: "
                      + ", ".join(missing) + ")")
            return "torch"
        _say_once("backend=auto -> torch (no CUDA GPU)")
        return "torch"
    if requested == "triton":
        ok, why = _triton_runnable()
        if not ok:
            raise BackendUnavailableError(
                f"backend='triton' was requested but cannot run: {why}. Use backend=torch, "
                "or backend=auto to choose automatically.")
    return requested


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log.info(message)


def _find_module(backend: str, kernel: str):
    """Import falsify.kernels.<backend>.<kernel>; None only if that exact module does not exist
    (an ImportError raised *inside* an existing kernel module is a bug and propagates)."""
    name = f"falsify.kernels.{backend}.{kernel}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y = x @ W.T with W stored [out, in] (HF layout). On every backend this is torch's GEMM
    (MKL/oneDNN on CPU, cuBLAS on GPU): the gemm kernel contract tests falsify/kernels/*/gemm.py on
    its own,
    and the model does not route projections through it."""
    return F.linear(x, w)


@dataclass(frozen=True)
class Ops:
    backend: str
    rmsnorm: Callable
    rope: Callable
    attention: Callable
    swiglu: Callable
    embedding: Callable
    fused_linear_cross_entropy: Callable  # the training loss: LM head + CE, logits never built
    linear: Callable
    adamw: Callable  # in-place multi-tensor AdamW update (the optimizer class calls it)
    grad_clip: Callable  # in-place global-norm clip of a list of gradients; returns the norm
    lr_schedule: Callable  # writes the step's learning rate into the optimizer; returns it
    provenance: dict  # kernel -> "falsify.kernels.torch.rope:rope", recorded in run configs
    # a dispatch policy's record (falsify/llm/dispatch.record): each kernel's backend and why;
    # None for a bundle of one backend asked for by name (or by `auto`)
    dispatch: dict | None = None

    def backend_of(self, kernel: str) -> str:
        """The backend that runs `kernel` (differs from `backend` under a dispatch policy)."""
        if self.dispatch is None:
            return HOST_KERNELS.get(kernel, self.backend)
        return self.dispatch["kernels"][kernel]["backend"]


ALL_KERNELS = KERNELS + tuple(TRAINING_KERNELS)
_CACHE: dict[str, Ops] = {}


def _bundle(name: str, backend_of: dict[str, str], dispatch: dict | None = None) -> Ops:
    """The Ops of `backend_of` (kernel -> backend), named `name`."""
    fns: dict[str, Callable] = {}
    prov: dict[str, str] = {}
    for k in ALL_KERNELS:
        b = backend_of[k]
        module, fname = TRAINING_KERNELS.get(k, (k, k))
        mod = _find_module(b, module)
        if mod is None:
            raise BackendUnavailableError(f"backend={name!r}: kernel module "
                                          f"falsify.kernels.{b}.{module} does not exist")
        fn = getattr(mod, fname, None)
        if fn is None:
            raise BackendUnavailableError(
                f"backend={name!r}: falsify.kernels.{b}.{module} has no function {fname!r}")
        fns[k] = fn
        prov[k] = f"falsify.kernels.{b}.{module}:{fname}"
    return Ops(backend=name, linear=linear, provenance=prov, dispatch=dispatch, **fns)


def install(policy: str, backend_of: dict[str, str], record: dict) -> Ops:
    """Keep the bundle a dispatch policy chose (falsify/llm/dispatch.configure): every later
    `get_ops(policy)` in this process returns it."""
    ops = _bundle(policy, backend_of, record)
    _CACHE[policy] = ops
    return ops


def runnable() -> dict[str, str | None]:
    """backend -> why the model cannot train on it here (None: it can). The Triton interpreter
    runs checks, but is far too slow to train with, as `auto` also holds."""
    why = None if gpu_available() else \
        "no GPU: the Triton interpreter is for checks, far too slow to train with"
    if why is None:
        ok, reason = _triton_runnable()
        why = None if ok else reason
    return {"torch": None, "triton": why}


def get_ops(backend: str = "auto") -> Ops:
    """The kernel bundle for `backend`: 'torch', 'triton', 'auto', or a dispatch policy that a
    run has resolved (falsify/llm/dispatch.configure; an unresolved one is an error: which kernels
    are verified depends on the run's ledger, dtype and device)."""
    chosen = resolve_backend(backend)
    if chosen in _CACHE:
        return _CACHE[chosen]
    if is_policy(chosen):
        raise BackendUnavailableError(
            f"backend={chosen!r} is a dispatch policy that no run has resolved in this process: "
            "it chooses from a ledger for a dtype and device (a training config resolves it "
            "before building the model; in code, falsify.llm.dispatch.configure)")
    ops = _bundle(chosen, {k: HOST_KERNELS.get(k, chosen) for k in ALL_KERNELS})
    _CACHE[chosen] = ops
    return ops
