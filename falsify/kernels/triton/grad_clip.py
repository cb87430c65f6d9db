"""Global-norm gradient clipping in Triton: three kernels, no host synchronisation.

1. `_partials_kernel`, one launch per gradient tensor: each program reduces BLOCK elements
   to a partial (m, s, code) with m = max|g|, s = Σ (g/m)² (each term ≤ 1, so no overflow),
   code = 2 if a NaN was seen, 1 if an inf, else 0. Partials of all tensors go to one buffer.
2. `_norm_kernel`, one program: merges the partials with the online rule
       M = max(m₁, m₂),   S = s₁·(m₁/M)² + s₂·(m₂/M)²
   (exact over the reals: s_k·m_k² = Σ_k g², proved in falsify/proofs/grad_clip.py), then
   ‖g‖ = M·√S, coef = min(1, max_norm/(‖g‖ + eps)), or ‖g‖ = NaN / +inf and coef = 1 when a
   non-finite element was seen. It writes [‖g‖, coef] to a 2-element device buffer.
3. `_scale_kernel`, one launch per tensor: g ← g·coef, coef read from that buffer (a GPU
   pipeline never waits for the host). coef = 1 multiplies exactly, so below the
   threshold the gradients come back bit-identical.

Strided 2-D views are read and written through explicit strides (poisoned-margin safe).
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.arguments import check_clip_args
from falsify.errors import NonFiniteGradNorm
from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_capped
from falsify.kernels.torch.grad_clip import check_grads

# clip_grad_norm_ is the training loop's clip on this backend (falsify/llm/ops.py): the bound
# clip_grad_norm clips its copies with it on every path.
__all__ = ["clip_grad_norm", "clip_grad_norm_"]

MAX_BLOCK = 1024  # elements per partial: power of two
REDUCE_BLOCK = 256  # partials merged per iteration of the norm kernel


def launch_config(numels):
    """Per tensor: (BLOCK, programs, offset of its first partial); and the total number of
    partials. Pure integer arithmetic (z3 runs it: falsify/proofs/grad_clip.py)."""
    plan, offset = [], 0
    for n in numels:
        block = next_power_of_2_capped(n, MAX_BLOCK)
        progs = cdiv(n, block)
        plan.append((block, progs, offset))
        offset = offset + progs
    return plan, offset


@triton.jit
def _partials_kernel(g_ptr, part_ptr, numel, C, s0, s1, first, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    r = offs // C
    c = offs % C
    x = tl.abs(tl.load(g_ptr + r * s0 + c * s1, mask=mask, other=0.0).to(tl.float32))
    is_nan = x != x
    is_inf = x == float("inf")
    code = tl.maximum(2.0 * tl.max(is_nan.to(tl.float32), axis=0),
                      tl.max(is_inf.to(tl.float32), axis=0))
    xf = tl.where(is_nan | is_inf, 0.0, x)
    m = tl.max(xf, axis=0)
    safe = tl.where(m > 0.0, m, 1.0)
    q = tl.div_rn(xf, safe)
    s = tl.sum(q * q, axis=0)
    base = part_ptr + 3 * (first + pid)
    tl.store(base, m)
    tl.store(base + 1, s)
    tl.store(base + 2, code)


@triton.jit
def _norm_kernel(part_ptr, n_parts, max_norm, eps, out_ptr, BLOCK: tl.constexpr):
    big_m = 0.0
    big_s = 0.0
    code = 0.0
    for start in range(0, n_parts, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < n_parts
        m = tl.load(part_ptr + 3 * idx, mask=mask, other=0.0)
        s = tl.load(part_ptr + 3 * idx + 1, mask=mask, other=0.0)
        cd = tl.load(part_ptr + 3 * idx + 2, mask=mask, other=0.0)
        code = tl.maximum(code, tl.max(cd, axis=0))
        cm = tl.max(m, axis=0)
        new_m = tl.maximum(big_m, cm)
        safe = tl.where(new_m > 0.0, new_m, 1.0)
        r = tl.div_rn(m, safe)
        chunk = tl.sum(s * r * r, axis=0)
        ro = tl.div_rn(big_m, safe)
        big_s = big_s * ro * ro + chunk
        big_m = new_m
    norm = big_m * tl.sqrt_rn(big_s)
    norm = tl.where(code >= 2.0, float("nan"), tl.where(code >= 1.0, float("inf"), norm))
    coef = tl.minimum(tl.div_rn(max_norm, norm + eps), 1.0)
    coef = tl.where(code >= 1.0, 1.0, coef)
    tl.store(out_ptr, norm)
    tl.store(out_ptr + 1, coef)


@triton.jit
def _scale_kernel(g_ptr, o_ptr, coef_ptr, numel, C, s0, s1, t0, t1, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    r = offs // C
    c = offs % C
    coef = tl.load(coef_ptr + 1)
    g = tl.load(g_ptr + r * s0 + c * s1, mask=mask, other=0.0).to(tl.float32)
    tl.store(o_ptr + r * t0 + c * t1, (g * coef).to(o_ptr.dtype.element_ty), mask=mask)


def _as_2d(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() == 0:
        return t.view(1, 1)
    if t.dim() == 1:
        return t.unsqueeze(0)
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name}: strides {tuple(t.stride())} of shape {tuple(t.shape)} cannot "
                         "be collapsed to 2-D without a copy") from None


def _check_int32(t2: torch.Tensor, name: str) -> None:
    last = sum((n - 1) * s for n, s in zip(t2.shape, t2.stride()))
    if last >= 2 ** 31 or t2.numel() > 2 ** 31 - MAX_BLOCK:
        raise ValueError(f"{name}: too large for the kernel's int32 offsets")


def _total_norm_and_coef(grads, max_norm, eps) -> torch.Tensor:
    """[‖g‖, coef] as a 2-element fp32 device tensor (launches kernels 1 and 2)."""
    views = [_as_2d(g, f"grads[{i}]") for i, g in enumerate(grads)]
    for i, v in enumerate(views):
        _check_int32(v, f"grads[{i}]")
    plan, n_parts = launch_config([v.numel() for v in views])
    dev = grads[0].device
    parts = torch.empty(3 * max(n_parts, 1), dtype=torch.float32, device=dev)
    for v, (block, progs, first) in zip(views, plan):
        if progs:
            _partials_kernel[(progs,)](v, parts, v.numel(), v.shape[1], v.stride(0),
                                       v.stride(1), first, BLOCK=block)
    out = torch.empty(2, dtype=torch.float32, device=dev)
    _norm_kernel[(1,)](parts, n_parts, float(max_norm), float(eps), out, BLOCK=REDUCE_BLOCK)
    return out


def _scale(g: torch.Tensor, dst: torch.Tensor, norm_coef: torch.Tensor, name: str) -> None:
    src, out = _as_2d(g, name), _as_2d(dst, name + " (out)")
    _check_int32(out, name)
    n = src.numel()
    if n == 0:
        return
    block = next_power_of_2_capped(n, MAX_BLOCK)
    _scale_kernel[(cdiv(n, block),)](src, out, norm_coef, n, src.shape[1], src.stride(0),
                                     src.stride(1), out.stride(0), out.stride(1), BLOCK=block)


def clip_grad_norm_(grads, max_norm, eps, error_if_nonfinite) -> torch.Tensor:
    """In-place global-norm clip of a list of tensors; returns the pre-clip norm (0-d fp32)."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    grads = list(grads)
    check_grads(grads, triton_dtypes())
    nc = _total_norm_and_coef(grads, max_norm, eps)
    if error_if_nonfinite and not bool(torch.isfinite(nc[0])):
        raise NonFiniteGradNorm(f"total gradient norm is {nc[0].item()}; gradients left "
                                "unchanged")
    for i, g in enumerate(grads):
        _scale(g, g, nc, f"grads[{i}]")
    return nc[0]


def clip_grad_norm(g0, g1, g2, max_norm, eps, error_if_nonfinite, out=None):
    """Functional form on three tensors: (g0', g1', g2', norm). `out` (optional) receives g0'.
    The gradients are copied and the copies clipped in place by `clip_grad_norm_`, the training
    loop's call, so every check of this binding runs it (the copy costs one extra pass; this
    form is the contract's, not the loop's)."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    grads = [g0, g1, g2]
    check_grads(grads, triton_dtypes())
    if out is not None and (out.shape != g0.shape or out.dtype != g0.dtype):
        raise ValueError(f"out: expected shape {tuple(g0.shape)} and dtype {g0.dtype}, got "
                         f"{tuple(out.shape)}, {out.dtype}")
    dsts = [torch.empty_like(g0) if out is None else out, torch.empty_like(g1),
            torch.empty_like(g2)]
    for g, d in zip(grads, dsts):
        d.copy_(g)
    norm = clip_grad_norm_(dsts, max_norm, eps, error_if_nonfinite)
    return dsts[0], dsts[1], dsts[2], norm
