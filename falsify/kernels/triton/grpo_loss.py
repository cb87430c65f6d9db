"""GRPO loss and group advantages in Triton (math and gradients: falsify/reference/grpo_loss.py).

`_adv_kernel`: one program per group of G contiguous rewards (BLOCK_G ≥ G lanes, masked):
deviations from the group's first reward, their mean, the sample std (G − 1), A = dev/(sd + eps).
`_grpo_fwd_kernel`: one program per sequence b, looping over its T tokens in BLOCK_T chunks,
writes Σ_t m·(−(policy − β·kl)) for the row in fp32; the wrapper sums the B row sums and
divides by the number of counted tokens n (a fixed order: deterministic, no atomics).
`_grpo_bwd_kernel`: the same rows, writing
    ∂loss/∂logp_t = m_t·(−ρ·A·[clip inactive] + β·(1 − exp(ref − logp)))·dy/n
with dy/n one device scalar (no host sync). Padded positions load as 0 and are selected away.
kl = max(exp(d) − d − 1, 0): the interpreter has no expm1, and exp(d) − d − 1 rounds to −d for
|d| < eps while the true value is ≥ 0, so clamping at 0 only moves the result toward it.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import next_power_of_2, next_power_of_2_capped
from falsify.kernels.torch.grpo_loss import check_advantage_args, check_grpo_args
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["group_advantages", "grpo_loss"]

MAX_BLOCK_T = 256  # tokens per loop iteration: a power of two


def launch_config(B, T):
    """(grid, BLOCK_T): one program per sequence; the token loop `range(0, T, BLOCK_T)` with
    the mask `offs < T` covers [0, T) once."""
    return B, next_power_of_2_capped(max(T, 1), MAX_BLOCK_T)


def advantage_launch_config(N, G):
    """(grid, BLOCK_G): one program per group of G ≤ BLOCK_G rewards."""
    return N // G, next_power_of_2(G)


@triton.jit
def _adv_kernel(r_ptr, a_ptr, G, s_r, eps, BLOCK_G: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_G)
    lane = offs < G
    base = r_ptr + g * G * s_r
    r = tl.load(base + offs * s_r, mask=lane, other=0.0).to(tl.float32)
    r0 = tl.load(base).to(tl.float32)
    c = tl.where(lane, r - r0, 0.0)
    dev = tl.where(lane, c - tl.sum(c, axis=0) / G, 0.0)
    sd = tl.sqrt(tl.sum(dev * dev, axis=0) / (G - 1))
    tl.store(a_ptr + g * G + offs, dev / (sd + eps), mask=lane)


@triton.jit
def _grpo_fwd_kernel(lp_ptr, old_ptr, ref_ptr, a_ptr, m_ptr, rows_ptr, T, s_lp0, s_lp1,
                     s_old0, s_old1, s_ref0, s_ref1, s_a, s_m0, s_m1, clip_eps, beta,
                     BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    a = tl.load(a_ptr + row * s_a).to(tl.float32)
    acc = tl.zeros((BLOCK_T,), tl.float32)
    for t0 in range(0, T, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        inb = offs < T
        keep = (tl.load(m_ptr + row * s_m0 + offs * s_m1, mask=inb, other=0) != 0) & inb
        lp = tl.load(lp_ptr + row * s_lp0 + offs * s_lp1, mask=keep, other=0.0).to(tl.float32)
        old = tl.load(old_ptr + row * s_old0 + offs * s_old1, mask=keep,
                      other=0.0).to(tl.float32)
        ref = tl.load(ref_ptr + row * s_ref0 + offs * s_ref1, mask=keep,
                      other=0.0).to(tl.float32)
        ratio = tl.exp(lp - old)
        policy = tl.minimum(ratio * a, tl.minimum(tl.maximum(ratio, 1.0 - clip_eps),
                                                  1.0 + clip_eps) * a)
        d = ref - lp
        kl = tl.maximum(tl.exp(d) - d - 1.0, 0.0)
        acc += tl.where(keep, -(policy - beta * kl), 0.0)
    tl.store(rows_ptr + row, tl.sum(acc, axis=0))


@triton.jit
def _grpo_bwd_kernel(lp_ptr, old_ptr, ref_ptr, a_ptr, m_ptr, scale_ptr, g_ptr, T, s_lp0, s_lp1,
                     s_old0, s_old1, s_ref0, s_ref1, s_a, s_m0, s_m1, s_g0, s_g1, clip_eps,
                     beta, BLOCK_T: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    a = tl.load(a_ptr + row * s_a).to(tl.float32)
    scale = tl.load(scale_ptr)
    for t0 in range(0, T, BLOCK_T):
        offs = t0 + tl.arange(0, BLOCK_T)
        inb = offs < T
        keep = (tl.load(m_ptr + row * s_m0 + offs * s_m1, mask=inb, other=0) != 0) & inb
        lp = tl.load(lp_ptr + row * s_lp0 + offs * s_lp1, mask=keep, other=0.0).to(tl.float32)
        old = tl.load(old_ptr + row * s_old0 + offs * s_old1, mask=keep,
                      other=0.0).to(tl.float32)
        ref = tl.load(ref_ptr + row * s_ref0 + offs * s_ref1, mask=keep,
                      other=0.0).to(tl.float32)
        ratio = tl.exp(lp - old)
        ab = a + tl.zeros_like(ratio)  # the row's advantage on every lane
        clipped = ((ab > 0) & (ratio > 1.0 + clip_eps)) | ((ab < 0) & (ratio < 1.0 - clip_eps))
        dpolicy = tl.where(clipped, 0.0, ratio * ab)
        dkl = 1.0 - tl.exp(ref - lp)
        g = tl.where(keep, (beta * dkl - dpolicy) * scale, 0.0)
        tl.store(g_ptr + row * s_g0 + offs * s_g1, g.to(g_ptr.dtype.element_ty), mask=inb)


def _mask_view(mask):
    # triton loads bool as int1 from a byte pointer: pass the same bytes as uint8
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


def _launch_args(logp, old_logp, ref_logp, advantages, mask):
    return (logp.stride(0), logp.stride(1), old_logp.stride(0), old_logp.stride(1),
            ref_logp.stride(0), ref_logp.stride(1), advantages.stride(0), mask.stride(0),
            mask.stride(1))


class _GRPOLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
        B, T = logp.shape
        m = _mask_view(mask)
        n = (m != 0).sum().float()
        rows = torch.zeros(B, dtype=torch.float32, device=logp.device)
        if B and T:
            grid, block = launch_config(B, T)
            _grpo_fwd_kernel[(grid,)](
                logp, old_logp, ref_logp, advantages, m, rows, T,
                *_launch_args(logp, old_logp, ref_logp, advantages, m),
                float(clip_eps), float(beta), BLOCK_T=block)
        ctx.save_for_backward(logp, old_logp, ref_logp, advantages, m, n)
        ctx.cfg = (float(clip_eps), float(beta))
        return (rows.sum() / n).to(logp.dtype)

    @staticmethod
    @once_differentiable("grpo_loss (Triton)")
    def backward(ctx, dy):
        logp, old_logp, ref_logp, advantages, m, n = ctx.saved_tensors
        clip_eps, beta = ctx.cfg
        B, T = logp.shape
        g = torch.zeros_like(logp)
        if B and T:
            # dy/n stays on the device (no host sync); with n = 0 every token is selected away
            scale = (dy.float() / n).reshape(1).contiguous()
            grid, block = launch_config(B, T)
            _grpo_bwd_kernel[(grid,)](
                logp, old_logp, ref_logp, advantages, m, scale, g, T,
                *_launch_args(logp, old_logp, ref_logp, advantages, m),
                g.stride(0), g.stride(1), clip_eps, beta, BLOCK_T=block)
        return g, None, None, None, None, None, None


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    check_grpo_args(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta,
                    allowed=triton_dtypes())
    return _GRPOLoss.apply(logp, old_logp.detach(), ref_logp.detach(), advantages.detach(),
                           mask.detach(), clip_eps, beta)


def group_advantages(rewards, group_size, eps):
    check_advantage_args(rewards, group_size, eps, allowed=triton_dtypes())
    N = rewards.shape[0]
    out = torch.empty(N, dtype=torch.float32, device=rewards.device)
    if N:
        grid, block = advantage_launch_config(N, group_size)
        _adv_kernel[(grid,)](rewards.detach(), out, group_size, rewards.stride(0), float(eps),
                             BLOCK_G=block)
    return out.to(rewards.dtype)
