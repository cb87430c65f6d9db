"""Gradient-clipping mutants: the bugs the clipping contract's checks must catch."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.arguments import check_clip_args
from falsify.kernels.torch.grad_clip import check_grads, total_norm
from falsify.kernels.triton import grad_clip as tg


def _finish(gs, coef, norm):
    outs = [(g.float() * coef).to(g.dtype) for g in gs]
    return outs[0], outs[1], outs[2], norm


def norm_to_the_fourth(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """The ‖g‖⁴ bug: the squared norm Σg² is squared again instead of square-rooted,
    so the coefficient is max_norm/(‖g‖⁴ + eps) and the reported norm is ‖g‖⁴."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [g0, g1, g2]
    check_grads(gs)
    sumsq = sum(torch.sum(g.float() ** 2) for g in gs)
    norm = sumsq * sumsq
    coef = torch.clamp(max_norm / (norm + eps), max=1.0)
    return _finish(gs, coef, norm)


def per_tensor(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """Each tensor clipped by its own norm: the global norm after clipping can reach
    √(#tensors)·max_norm (per-block and global clipping confused)."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [g0, g1, g2]
    check_grads(gs)
    outs = []
    for g in gs:
        n = torch.linalg.vector_norm(g.float())
        coef = torch.clamp(max_norm / (n + eps), max=1.0)
        outs.append((g.float() * coef).to(g.dtype))
    return outs[0], outs[1], outs[2], total_norm(gs)


def nonfinite_propagates(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """torch.nn.utils.clip_grad_norm_'s default behaviour: coef computed from a NaN/inf norm
    and applied anyway, so one inf zeroes every gradient and one NaN poisons all of them."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [g0, g1, g2]
    check_grads(gs)
    norm = total_norm(gs)
    coef = torch.clamp(max_norm / (norm + eps), max=1.0)
    return _finish(gs, coef, norm)


def unscaled_fp32_sum(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """‖g‖ = √(Σ g²) accumulated in fp32 without scaling: overflows to inf once |g| ≳ 1.8e19,
    so exactly the exploding gradients that need clipping are left unclipped."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [g0, g1, g2]
    check_grads(gs)
    norm = torch.sqrt(sum(torch.sum(g.float() ** 2) for g in gs))
    coef = torch.where(torch.isfinite(norm), torch.clamp(max_norm / (norm + eps), max=1.0),
                       torch.ones_like(norm))
    return _finish(gs, coef, norm)


@triton.jit
def _norm_kernel_no_rescale(part_ptr, n_parts, max_norm, eps, out_ptr, BLOCK: tl.constexpr):
    # The bug: partial sums of squares scaled by *different* maxima are added as if they
    # shared one scale (the online-softmax "missing rescale" bug, in a norm).
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
        big_m = tl.maximum(big_m, tl.max(m, axis=0))
        big_s = big_s + tl.sum(s, axis=0)
    norm = big_m * tl.sqrt_rn(big_s)
    norm = tl.where(code >= 2.0, float("nan"), tl.where(code >= 1.0, float("inf"), norm))
    coef = tl.minimum(tl.div_rn(max_norm, norm + eps), 1.0)
    coef = tl.where(code >= 1.0, 1.0, coef)
    tl.store(out_ptr, norm)
    tl.store(out_ptr + 1, coef)


def triton_merge_without_rescale(g0, g1, g2, max_norm, eps, error_if_nonfinite, out=None):
    """The Triton path with the merge kernel replaced by one that skips the (m_k/M)² rescale."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [g0, g1, g2]
    check_grads(gs)
    views = [tg._as_2d(g, f"g{i}") for i, g in enumerate(gs)]
    plan, n_parts = tg.launch_config([v.numel() for v in views])
    parts = torch.empty(3 * max(n_parts, 1), dtype=torch.float32)
    for v, (block, progs, first) in zip(views, plan):
        if progs:
            tg._partials_kernel[(progs,)](v, parts, v.numel(), v.shape[1], v.stride(0),
                                          v.stride(1), first, BLOCK=block)
    nc = torch.empty(2, dtype=torch.float32)
    _norm_kernel_no_rescale[(1,)](parts, n_parts, float(max_norm), float(eps), nc,
                                  BLOCK=tg.REDUCE_BLOCK)
    dsts = [torch.empty_like(g0) if out is None else out, torch.empty_like(g1),
            torch.empty_like(g2)]
    for i, (g, d) in enumerate(zip(gs, dsts)):
        tg._scale(g, d, nc, f"g{i}")
    return dsts[0], dsts[1], dsts[2], nc[0]


def no_clamp_at_one(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """coef = max_norm/(‖g‖ + eps) without min(1, ·): small gradients are scaled *up* to the
    max_norm ball (a "normalise" instead of a "clip")."""
    check_clip_args(max_norm, eps, error_if_nonfinite)
    gs = [g0, g1, g2]
    check_grads(gs)
    norm = total_norm(gs)
    coef = torch.where(torch.isfinite(norm), max_norm / (norm + eps), torch.ones_like(norm))
    return _finish(gs, coef, norm)


def triton_loop_clip_skips_last(g0, g1, g2, max_norm, eps, error_if_nonfinite, out=None):
    """Triton `clip_grad_norm` whose in-place clip (`clip_grad_norm_`, the training loop's call)
    leaves the last tensor of the list unscaled. Before the functional form clipped through
    `clip_grad_norm_`, no contract check reached that function and the bug survived."""
    from unittest import mock

    real = tg.clip_grad_norm_

    def skips_last(grads, *rest):
        grads = list(grads)
        keep = grads[-1].clone()
        norm = real(grads, *rest)
        grads[-1].copy_(keep)
        return norm

    with mock.patch.object(tg, "clip_grad_norm_", skips_last):
        return tg.clip_grad_norm(g0, g1, g2, max_norm, eps, error_if_nonfinite, out=out)
