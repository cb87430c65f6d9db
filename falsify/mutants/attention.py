"""Attention mutants: the bugs the attention contract's checks must catch. Same signature as
the bound `attention(q, k, v, causal=True, scale=None, out=None)`."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import math

import torch
import triton
import triton.language as tl

from falsify.kernels.torch import attention as ta
from falsify.kernels.triton import attention as xa


@triton.jit
def attn_fwd_kernel_no_rescale(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                               sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                               sob, soh, sos, sod,
                               H, GROUP, S, D, scale,
                               CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """A fused tiled attention update as often written: l is rescaled by exp(m_old − m_new) but the
    accumulator is not (`O += exp(scores_tile − m_new) @ V[tile_k]`)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < S
    mask_d = offs_d < D
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :] * sqd,
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)
    k_base = k_ptr + b * skb + hk * skh
    v_base = v_ptr + b * svb + hk * svh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, S)
    else:
        hi = S
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < S
        kt = tl.load(k_base + cols[None, :] * sks + offs_d[:, None] * skd,
                     mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision="ieee") * scale
        valid = mask_n[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :] * svd,
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod,
             o.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])
    tl.store(lse_ptr + bh.to(tl.int64) * S + offs_m, m_i + tl.log(l_i), mask=mask_m)


def triton_no_accumulator_rescale(q, k, v, causal=True, scale=None, out=None):
    *_, scale = ta.check_args(q, k, v, causal, scale, out, max_head_dim=xa.MAX_HEAD_DIM)
    return xa.launch_forward(q, k, v, bool(causal), scale, out,
                             kernel=attn_fwd_kernel_no_rescale)[0]


def _naive(q, k, v, causal, scale, out, mask_diagonal_offset=1, scale_fn=None):
    """Materialized attention with two knobs for the bugs below (differentiable by autograd)."""
    b, hq, hkv, s, d, _ = ta.check_args(q, k, v, causal, scale, out)
    if scale is None:
        scale = scale_fn(d) if scale_fn else 1.0 / math.sqrt(d)
    kk = k.repeat_interleave(hq // hkv, dim=1).float()
    vv = v.repeat_interleave(hq // hkv, dim=1).float()
    sc = (q.float() @ kk.transpose(-1, -2)) * scale
    if causal:
        mask = torch.ones(s, s, dtype=torch.bool).triu(mask_diagonal_offset)
        sc = sc.masked_fill(mask, float("-inf"))
    y = (torch.softmax(sc, dim=-1) @ vv).to(q.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def torch_mask_off_by_one(q, k, v, causal=True, scale=None, out=None):
    """Causal mask `j > i + 1` instead of `j > i`: each query also sees the next key."""
    return _naive(q, k, v, causal, scale, out, mask_diagonal_offset=2)


def torch_scale_inverse_d(q, k, v, causal=True, scale=None, out=None):
    """Default scale 1/d instead of 1/√d (identical only at d = 1)."""
    return _naive(q, k, v, causal, scale, out, scale_fn=lambda d: 1.0 / d)


class _NoLseBackward(torch.autograd.Function):
    """A refuted design: without the saved logsumexp the backward was
    'approximated' as grad_q ≈ grad_attn_out, grad_k = grad_v = 0."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        ctx.kv = (k.shape, k.dtype)
        o32, _ = ta.forward(q, k, v, causal, scale)
        return o32.to(q.dtype)

    @staticmethod
    def backward(ctx, do):
        shape, dtype = ctx.kv
        return do.clone(), torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype), \
            None, None


def torch_backward_without_lse(q, k, v, causal=True, scale=None, out=None):
    *_, scale = ta.check_args(q, k, v, causal, scale, out)
    if out is not None:
        return ta.attention(q, k, v, causal, scale, out)
    return _NoLseBackward.apply(q, k, v, bool(causal), scale)


def triton_gqa_grad_one_head(q, k, v, causal=True, scale=None, out=None):
    """GQA backward built from the MHA kernels on K/V repeated per group, then reduced by
    taking the first head of each group instead of summing the group (the other G − 1 query
    heads' contributions to dK and dV are lost)."""
    b, hq, hkv, s, d, scale = ta.check_args(q, k, v, causal, scale, out,
                                            max_head_dim=xa.MAX_HEAD_DIM)
    g = hq // hkv
    if out is not None or not (torch.is_grad_enabled()
                               and any(t.requires_grad for t in (q, k, v))):
        return xa.attention(q, k, v, causal, scale, out)

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = xa.launch_forward(q, k, v, bool(causal), scale)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            kr, vr = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            dq, dkr, dvr = xa.launch_backward(q, kr, vr, o, lse, do.to(o.dtype), None,
                                              bool(causal), scale)
            return dq, dkr[:, ::g].contiguous(), dvr[:, ::g].contiguous()

    return Fn.apply(q, k, v)


def torch_materialized_scores(q, k, v, causal=True, scale=None, out=None):
    """Correct values, but the [B, Hq, S, S] scores and probabilities are materialized (unfused
    attention, which [dao2022] avoids): peak memory grows as S²."""
    return _naive(q, k, v, causal, scale, out)


def _backward_dk_unscaled(q, k, v, o, lse, do, dlse, causal, scale):
    """ta.backward with one bug: the probabilities dK is built from are recomputed from the
    unscaled scores Q·Kᵀ (exp(Q·Kᵀ − lse) instead of exp(scale·Q·Kᵀ − lse)); dQ and dV keep the
    right P, so only dK is wrong (and only where scale ≠ 1, i.e. D > 1)."""
    b, hq, s, d = q.shape
    block = ta.block_size(s)
    hkv = k.shape[1]
    g = hq // hkv
    dq, _, dv = ta.backward(q, k, v, o, lse, do, dlse, causal, scale)
    qg, dog, lse_g = ta._grouped(q, hkv), ta._grouped(do, hkv), ta._grouped(lse, hkv)
    delta = ta._grouped((do.float() * o.float()).sum(dim=-1), hkv)
    if dlse is not None:
        delta = delta - ta._grouped(dlse.float(), hkv)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    for ks in range(0, s, block):
        ke = min(s, ks + block)
        kc, vc = k[:, :, ks:ke].float(), v[:, :, ks:ke].float()
        for qs in range((ks // block) * block if causal else 0, s, block):
            qe = min(s, qs + block)
            qc, doc = ta._rows(qg, qs, qe), ta._rows(dog, qs, qe)
            p = torch.exp(qc @ kc.transpose(-1, -2) - ta._rows(lse_g[..., None], qs, qe))
            if causal and ke - 1 > qs:
                p = ta._mask_tile(p, g, qs, qe, ks, ke, 0.0)
            ds = p * (doc @ vc.transpose(-1, -2) - ta._rows(delta[..., None], qs, qe))
            dk[:, :, ks:ke] += (ds.transpose(-1, -2) @ qc) * scale
    return dq, dk, dv


def _flash_function(backward):
    """The project's tiled torch autograd.Function (falsify/kernels/torch/attention.py) with another
    `backward(q, k, v, o, lse, do, dlse, causal, scale) -> (dq, dk, dv)`."""

    class _Flash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, scale):
            o32, lse = ta.forward(q, k, v, causal, scale)
            o = o32.to(q.dtype)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.cfg = (causal, scale)
            ctx.set_materialize_grads(False)
            return o, lse

        @staticmethod
        def backward(ctx, do, dlse):
            q, k, v, o, lse = ctx.saved_tensors
            if do is None:
                do = torch.zeros_like(o)
            dq, dk, dv = backward(q, k, v, o, lse, do, dlse, *ctx.cfg)
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None

    return _Flash


def _flash_with(function, q, k, v, causal, scale, out):
    *_, scale = ta.check_args(q, k, v, causal, scale, out)
    if out is not None:
        return ta.flash_attention(q, k, v, causal, scale, out)
    return function.apply(q, k, v, bool(causal), scale)


_FlashDkUnscaled = _flash_function(_backward_dk_unscaled)
# the lse branch of the backward dropped: the upstream gradient of lse never reaches Δ
_FlashIgnoresDlse = _flash_function(
    lambda q, k, v, o, lse, do, dlse, causal, scale:
    ta.backward(q, k, v, o, lse, do, None, causal, scale))


def torch_flash_dk_unscaled_scores(q, k, v, causal=True, scale=None, out=None):
    """The project's tiled flash_attention (torch) with dK built from unscaled scores: the
    forward, lse, dQ and dV are right, so only a gradient check on flash_attention itself
    (not on `attention`, which torch routes to SDPA) can see it."""
    return _flash_with(_FlashDkUnscaled, q, k, v, causal, scale, out)


def torch_flash_ignores_dlse(q, k, v, causal=True, scale=None, out=None):
    """flash_attention (torch) whose backward ignores dlse: o, lse and the o-only gradients
    are exactly right, so only a gradient check that puts an upstream gradient on lse fails."""
    return _flash_with(_FlashIgnoresDlse, q, k, v, causal, scale, out)


@triton.jit
def attn_bwd_preprocess_kernel_adds_dlse(o_ptr, do_ptr, dlse_ptr, delta_ptr,
                                         sob, soh, sos, sod, sdob, sdoh, sdos, sdod,
                                         H, S, D,
                                         HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr,
                                         BLOCK_D: tl.constexpr):
    """The backward preprocess with the sign of the lse term flipped: Δ = rowsum(dO ⊙ O) +
    dlse instead of − dlse."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < S
    mask = mask_m[:, None] & (offs_d < D)[None, :]
    o = tl.load(o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod,
                mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :] * sdod,
                 mask=mask, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:
        delta += tl.load(dlse_ptr + bh.to(tl.int64) * S + offs_m, mask=mask_m, other=0.0)
    tl.store(delta_ptr + bh.to(tl.int64) * S + offs_m, delta, mask=mask_m)


class _FlashAddsDlseTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = xa.launch_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cfg = (causal, scale)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        do = torch.zeros_like(o) if do is None else do.to(o.dtype)
        dq, dk, dv = xa.launch_backward(q, k, v, o, lse, do, dlse, *ctx.cfg,
                                        preprocess_kernel=attn_bwd_preprocess_kernel_adds_dlse)
        return dq, dk, dv, None, None


def triton_flash_adds_dlse(q, k, v, causal=True, scale=None, out=None):
    """flash_attention (Triton) whose backward preprocess adds dlse to Δ instead of
    subtracting it: with dlse = None (a loss on o only) the kernel is the right one, so only a
    gradient check that puts an upstream gradient on lse fails."""
    *_, scale = ta.check_args(q, k, v, causal, scale, out, max_head_dim=xa.MAX_HEAD_DIM)
    causal = bool(causal)
    if out is not None or not (torch.is_grad_enabled()
                               and any(t.requires_grad for t in (q, k, v))):
        return xa.flash_attention(q, k, v, causal, scale, out)
    return _FlashAddsDlseTriton.apply(q, k, v, causal, scale)


# ---------------------------------------------------------------- second order
class _SecondOrderOnDetachedStatistics(ta._FlashAttentionTorch):
    """The real tiled forward and backward, with the saved o and lse detached before use: the
    first derivatives are the same numbers, but to autograd P = exp(S − lse) and Δ = Σ dO·O no
    longer depend on q, k, v, so the double backward drops those terms."""

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale = ctx.cfg
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = ta.backward(q, k, v, o.detach(), lse.detach(), do, dlse, causal,
                                         scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def flash_second_order_on_detached_statistics(q, k, v, causal=True, scale=None, out=None):
    *_, scale = ta.check_args(q, k, v, causal, scale, out)
    return _SecondOrderOnDetachedStatistics.apply(q, k, v, bool(causal), scale)
