"""Calling a bound function on a backend: argument conversion, binding overrides (`--bind`
and mutants), poisoned-margin views for Triton, and output conversion back to float64.

This is the only place that knows how reference (numpy float64) and torch/triton (tensors in the
case dtype) differ, so the check kinds stay backend-agnostic.
"""

from __future__ import annotations

import inspect
import os

import numpy as np

from falsify.harness.binding import BindingError, active_overrides, binding_ref, overriding, resolve  # noqa: F401  (callers name them here)
from falsify.harness.cases import Case, arg_dtype
from falsify.harness.model import Contract


class ImplementationRaised(AssertionError):
    """The implementation under test raised on a valid input: the check fails (for a mutant,
    that is a kill), unlike an error in the harness or the contract."""


def call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as e:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ImplementationRaised(f"{name} raised {type(e).__name__}: {e}") from e


class MarginViolation(AssertionError):
    """A Triton kernel read or wrote outside the tensor view it was given."""


def function(contract: Contract, equation: str, backend: str):
    return resolve(binding_ref(contract, equation, backend)[0])


# ---------------------------------------------------------------- argument conversion
def torch_dtype(name: str):
    import torch

    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
            "uint8": torch.uint8, "bool": torch.bool}[name]


def reference_args(case: Case) -> dict:
    """Floats widened to float64 (values unchanged: they were rounded to the case dtype)."""
    out = {}
    for k, v in case.args.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            out[k] = v.astype(np.float64)
        else:
            out[k] = v.copy() if isinstance(v, np.ndarray) else v
    return out


def device_for(backend: str) -> str:
    """Where a backend's tensors live. Triton kernels compiled for a GPU need CUDA tensors;
    under the interpreter (and for torch) they are CPU tensors. Decided from how Triton was
    configured at `import falsify` (falsify.triton_env), never guessed per call."""
    if backend != "triton" or os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        raise BindingError("Triton is configured for a GPU (TRITON_INTERPRET is not 1) but torch "
                           "sees no CUDA device: set FALSIFY_TRITON=interpret to use the "
                           "interpreter")
    return "cuda"


def tensor_args(case: Case, spec_args: dict, requires_grad: tuple = (),
                device: str = "cpu") -> dict:
    import torch

    out = {}
    for k, v in case.args.items():
        if isinstance(v, np.ndarray):
            dt = arg_dtype(spec_args.get(k, {}), case.dtype)
            t = torch.from_numpy(np.ascontiguousarray(v)).to(device=device,
                                                            dtype=torch_dtype(dt))
            if k in requires_grad:
                t.requires_grad_(True)
            out[k] = t
        else:
            out[k] = v
    return out


def args_for(backend: str, case: Case, spec_args: dict, requires_grad: tuple = ()) -> dict:
    if backend == "reference":
        return reference_args(case)
    return tensor_args(case, spec_args, requires_grad, device_for(backend))


def to_numpy(x):
    """Any output (tensor, array, scalar) → float64/int numpy array; a str (decoded text) →
    a 0-d object array holding it unchanged (numpy's own str arrays drop trailing NULs)."""
    if isinstance(x, str):
        out = np.empty((), dtype=object)
        out[()] = x
        return out
    try:
        import torch
    except ImportError:  # the reference path works without torch
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16, torch.float32):
            x = x.float()
        arr = x.numpy()
    else:
        arr = np.asarray(x)
    return arr.astype(np.float64) if arr.dtype.kind in "fc" else arr


def outputs(result) -> list:
    if isinstance(result, (tuple, list)):
        return [to_numpy(r) for r in result]
    return [to_numpy(result)]


# ---------------------------------------------------------------- poisoned margins (Triton)
MARGIN = 16


def _sentinel(dtype):
    """NaN for floats; the largest value for integers (a plausible-looking but wrong code)."""
    import torch

    return float("nan") if dtype.is_floating_point else int(torch.iinfo(dtype).max)


def _poisoned_view(t, pad_last: int = 3):
    """A copy of `t` living inside a larger sentinel-filled buffer (NaN for floats): `MARGIN`
    sentinels before and after, and `pad_last` sentinel columns after each row, so the view
    is non-contiguous."""
    import torch

    shape = tuple(t.shape)
    if t.dim() == 0 or t.numel() == 0:
        return t, None
    padded = shape[:-1] + (shape[-1] + pad_last,)
    n = int(np.prod(padded))
    buf = torch.full((n + 2 * MARGIN,), _sentinel(t.dtype), dtype=t.dtype, device=t.device)
    view = buf[MARGIN:MARGIN + n].view(padded)[..., : shape[-1]]
    with torch.no_grad():
        view.copy_(t)
    mask = torch.ones(n + 2 * MARGIN, dtype=torch.bool, device=t.device)
    inner = mask[MARGIN:MARGIN + n].view(padded)
    inner[..., : shape[-1]] = False
    view.requires_grad_(t.requires_grad)
    return view, (buf, mask)


def poison(targs: dict, fn) -> tuple[dict, list]:
    """Replace float tensor args (and `out`, when the function accepts it) by poisoned views."""
    import torch

    guards = []
    out = dict(targs)
    for k, v in targs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and not v.requires_grad:
            out[k], g = _poisoned_view(v)
            if g:
                guards.append((k, g))
    return out, guards


def poisoned_out(fn, like):
    """An `out` view into a NaN buffer, if `fn` takes `out=`; else None."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None, None
    if "out" not in params:
        return None, None
    import torch

    view, g = _poisoned_view(torch.empty_like(like))
    return view, g


def check_margins(guards: list) -> None:
    import torch

    for name, (buf, mask) in guards:
        margin = buf[mask]
        intact = (torch.isnan(margin) if buf.dtype.is_floating_point
                  else margin == _sentinel(buf.dtype))
        if not intact.all():
            bad = int((~intact).sum())
            raise MarginViolation(f"kernel wrote {bad} element(s) outside the view of {name!r}")
