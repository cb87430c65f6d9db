"""GEMM in torch: C = α·op(A)·op(B) + β·C with BLAS semantics, fp32 accumulation.

Autograd comes from torch (matmul, cast, scale are all differentiable); the backward formulas it
applies are the ones written in falsify/reference/gemm.py. `check_args` is shared with the Triton
wrapper so both backends reject the same bad calls, before anything runs.

Choices stated once here (the contract repeats them):
- β = 0 ignores C completely (BLAS): C is not read, so NaN in C does not reach the result.
- The result dtype is the input dtype, or `out.dtype` when `out` is given; `out` may be float32
  for float16/bfloat16 inputs (cuBLAS GemmEx-style mixed precision: large products of fp16
  gradients land in an fp32 buffer instead of overflowing fp16's 65504).
- `out` must be exactly [M, N]: an undersized or wrongly-shaped buffer raises; it
  must not overlap A or B, and may alias C only exactly (in place C ← α·op(A)·op(B) + β·C,
  each tile read before it is written).
"""

from __future__ import annotations

import numbers

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["gemm"]



def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] a tensor view can touch (torch strides are ≥ 0)."""
    lo = t.data_ptr()
    if t.numel() == 0:
        return lo, lo
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return lo, lo + (last + 1) * t.element_size()


def may_overlap(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Conservative: byte ranges intersect (interleaved views count as overlapping)."""
    (a0, a1), (b0, b1) = _span(x), _span(y)
    return a0 < b1 and b0 < a1


def internal_overlap(t: torch.Tensor) -> bool:
    """True when two different indices of a 2-D view may share memory (e.g. stride 0). The test
    is sufficient for 'no overlap': order the non-trivial dims by stride, each stride must
    exceed the span of the dims below it."""
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s > 1)
    span = 1
    for st, s in dims:
        if st < span:
            return True
        span = st * (s - 1) + span
    return False


def _flag(name, v) -> bool:
    if isinstance(v, bool):
        return v
    if type(v).__name__ == "bool_":  # numpy bool from a contract expression
        return bool(v)
    raise TypeError(f"gemm: {name} must be a bool, got {type(v).__name__} {v!r}")


def _scalar(name, v) -> float:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise TypeError(f"gemm: {name} must be a scalar, got a tensor of shape "
                            f"{tuple(v.shape)}")
        return float(v.item())
    if isinstance(v, numbers.Real):
        return float(v)
    raise TypeError(f"gemm: {name} must be a real number, got {type(v).__name__}")


def check_args(a, b, c, alpha, beta, trans_a, trans_b, out, dtypes: tuple = CHECKED):
    """Validate a gemm call; returns (M, N, K, alpha, beta, trans_a, trans_b, out_dtype)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError("gemm: a and b must be torch tensors")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"gemm: a and b must be 2-D, got shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}")
    require("gemm", dtypes, a=a, b=b)
    if b.dtype != a.dtype:
        raise TypeError(f"gemm: a and b must share one dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"gemm: a is on {a.device}, b on {b.device}")
    trans_a, trans_b = _flag("trans_a", trans_a), _flag("trans_b", trans_b)
    alpha, beta = _scalar("alpha", alpha), _scalar("beta", beta)
    m, k = (a.shape[1], a.shape[0]) if trans_a else tuple(a.shape)
    k2, n = (b.shape[1], b.shape[0]) if trans_b else tuple(b.shape)
    if k != k2:
        raise ValueError(f"gemm: inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    allowed = (a.dtype,) if a.dtype == torch.float32 else (a.dtype, torch.float32)
    if c is not None:
        if not isinstance(c, torch.Tensor) or tuple(c.shape) != (m, n):
            shape = tuple(c.shape) if isinstance(c, torch.Tensor) else type(c).__name__
            raise ValueError(f"gemm: c must be a tensor of shape {(m, n)}, got {shape}")
        if c.dtype not in allowed or c.device != a.device:
            raise TypeError(f"gemm: c must be {' or '.join(map(str, allowed))} on {a.device}, "
                            f"got {c.dtype} on {c.device}")
    elif beta != 0.0:
        raise ValueError(f"gemm: beta={beta} needs c (beta = 0 is the only value that ignores c)")
    out_dtype = a.dtype
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"gemm: out must be a tensor, got {type(out).__name__}")
        if tuple(out.shape) != (m, n):
            raise ValueError(f"gemm: out has shape {tuple(out.shape)} ({out.numel()} elements); "
                             f"the result is {m}x{n} = {m * n} elements. An undersized or "
                             "wrongly-shaped output buffer is refused before launch.")
        if out.dtype not in allowed or out.device != a.device:
            raise TypeError(f"gemm: out must be {' or '.join(map(str, allowed))} on {a.device}, "
                            f"got {out.dtype} on {out.device}")
        if internal_overlap(out):
            raise ValueError(f"gemm: out has overlapping elements (strides {out.stride()})")
        for name, t in (("a", a), ("b", b)):
            if may_overlap(out, t):
                raise ValueError(f"gemm: out overlaps {name}; results would depend on the "
                                 "order tiles are written")
        if c is not None and beta != 0.0 and may_overlap(out, c):
            same = (out.data_ptr() == c.data_ptr() and out.stride() == c.stride()
                    and out.dtype == c.dtype)
            if not same:
                raise ValueError("gemm: out overlaps c without being exactly c (only the exact "
                                 "in-place update C ← α·op(A)·op(B) + β·C is allowed)")
        out_dtype = out.dtype
    return m, n, k, alpha, beta, trans_a, trans_b, out_dtype


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, alpha: float = 1.0,
         beta: float = 0.0, trans_a: bool = False, trans_b: bool = False,
         out: torch.Tensor | None = None) -> torch.Tensor:
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out)
    opa = a.t() if trans_a else a
    opb = b.t() if trans_b else b
    # fp16/bf16: upcast so the K-reduction runs in fp32 (an fp16 partial sum overflows at 65504
    # and loses ~3 digits over a few hundred terms); round once at the end.
    y = torch.matmul(opa.float(), opb.float())
    if alpha != 1.0:
        y = y * alpha
    if beta != 0.0:
        y = y + beta * c.float()
    y = y.to(odt)
    if out is not None:
        out.copy_(y)
        return out
    return y
