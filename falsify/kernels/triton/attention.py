"""Flash attention in Triton: causal / GQA forward with the online softmax, and the
FlashAttention-2 backward from the saved logsumexp. The [S, S] score matrix exists only as one
BLOCK_M × BLOCK_N tile in registers.

Forward, one program per (query tile, batch·query head); query head h reads key/value head
h // G. Over key tiles j (only j·BLOCK_N < (tile + 1)·BLOCK_M when causal):
    s     = scale·q·k_jᵀ, masked to −∞ for keys ≥ S and, causal, keys after the query
    m_new = max(m, rowmax(s))
    l     = l·exp(m − m_new) + rowsum(exp(s − m_new))
    acc   = acc·exp(m − m_new) + exp(s − m_new)·v_j      ← the rescale a naive update omits
    o = acc / l,  lse = m + log(l)  (fp32, [B, Hq, S], the only extra tensor saved)
exp(m − m_new) is exactly 0 on the first tile (m = −∞, and key 0 is never masked for a real
query row), so the −∞ start never produces NaN.

Backward (G_o = dO; derivation in falsify/reference/attention.py and the contract):
    preprocess:  Δ_i = Σ_d dO_id·O_id − dlse_i        (= Σ_j P_ij·dP_ij − dlse_i since O = P·V)
    dK/dV kernel, one program per (key tile, batch·kv head), looping over the G query heads of
    its group and the query tiles that can see it (causal: from the key tile's first row on):
        P = exp(s − lse) recomputed,  dV += Pᵀ·dO,  dS = P ⊙ (dO·Vᵀ − Δ),  dK += scale·dSᵀ·Q
    the GQA group sum happens in registers: no atomics, deterministic.
    dQ kernel, one program per (query tile, batch·query head): dQ = scale·Σ_j dS_j·K_j.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_clamped
from falsify.kernels.torch.attention import check_args
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["attention", "flash_attention"]

MAX_HEAD_DIM = 256  # one tile spans the whole head dimension


def launch_config(s, d):
    """Pure integer launch arithmetic (also run on z3 bit-vectors in falsify/proofs/attention.py).
    Square BLOCK_M = BLOCK_N tiles in [16, 64] (tl.dot needs ≥ 16), BLOCK_D ≥ d padded to a
    power of two, at least 16."""
    block = next_power_of_2_clamped(s, 16, 64)
    return {"BLOCK_M": block, "BLOCK_N": block,
            "BLOCK_D": next_power_of_2_clamped(d, 16, MAX_HEAD_DIM),
            "q_tiles": cdiv(s, block), "k_tiles": cdiv(s, block)}


@triton.jit
def attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                    sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                    sob, soh, sos, sod,
                    H, GROUP, S, D, scale,
                    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr):
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
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :] * svd,
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(o_ptr + b * sob + h * soh + offs_m[:, None] * sos + offs_d[None, :] * sod,
             o.to(o_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_d[None, :])
    tl.store(lse_ptr + bh.to(tl.int64) * S + offs_m, m_i + tl.log(l_i), mask=mask_m)


@triton.jit
def attn_bwd_preprocess_kernel(o_ptr, do_ptr, dlse_ptr, delta_ptr,
                               sob, soh, sos, sod, sdob, sdoh, sdos, sdod,
                               H, S, D,
                               HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_D: tl.constexpr):
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
        delta -= tl.load(dlse_ptr + bh.to(tl.int64) * S + offs_m, mask=mask_m, other=0.0)
    tl.store(delta_ptr + bh.to(tl.int64) * S + offs_m, delta, mask=mask_m)


@triton.jit
def attn_bwd_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                         sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                         sdob, sdoh, sdos, sdod, sdkb, sdkh, sdks, sdkd, sdvb, sdvh, sdvs, sdvd,
                         H, GROUP, S, D, scale,
                         CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    hkv = H // GROUP
    b = (bhk // hkv).to(tl.int64)
    hk = (bhk % hkv).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < S
    mask_d = offs_d < D
    mask_nd = mask_n[:, None] & mask_d[None, :]
    k = tl.load(k_ptr + b * skb + hk * skh + offs_n[:, None] * sks + offs_d[None, :] * skd,
                mask=mask_nd, other=0.0)
    v = tl.load(v_ptr + b * svb + hk * svh + offs_n[:, None] * svs + offs_d[None, :] * svd,
                mask=mask_nd, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        lo = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M
    else:
        lo = 0
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = q_ptr + b * sqb + h * sqh
        do_base = do_ptr + b * sdob + h * sdoh
        row_base = (b * H + h) * S
        for start_m in range(lo, S, BLOCK_M):
            rows = start_m + offs_m
            mask_m = rows < S
            mask_md = mask_m[:, None] & mask_d[None, :]
            q = tl.load(q_base + rows[:, None] * sqs + offs_d[None, :] * sqd,
                        mask=mask_md, other=0.0)
            do = tl.load(do_base + rows[:, None] * sdos + offs_d[None, :] * sdod,
                         mask=mask_md, other=0.0)
            lse = tl.load(lse_ptr + row_base + rows, mask=mask_m, other=0.0)
            delta = tl.load(delta_ptr + row_base + rows, mask=mask_m, other=0.0)
            st = tl.dot(k, tl.trans(q), input_precision="ieee") * scale  # [BLOCK_N, BLOCK_M]
            valid = mask_n[:, None] & mask_m[None, :]
            if CAUSAL:
                valid = valid & (offs_n[:, None] <= rows[None, :])
            # Masked entries may overflow exp (their s is garbage-free but unbounded by lse):
            # tl.where selects, so an inf there never reaches the sums.
            pt = tl.where(valid, tl.exp(st - lse[None, :]), 0.0)
            dv = tl.dot(pt.to(do.dtype), do, dv, input_precision="ieee")
            dpt = tl.dot(v, tl.trans(do), input_precision="ieee")
            dst = pt * (dpt - delta[None, :])
            dk = tl.dot(dst.to(q.dtype), q, dk, input_precision="ieee")
    dk = dk * scale
    tl.store(dk_ptr + b * sdkb + hk * sdkh + offs_n[:, None] * sdks + offs_d[None, :] * sdkd,
             dk.to(dk_ptr.dtype.element_ty), mask=mask_nd)
    tl.store(dv_ptr + b * sdvb + hk * sdvh + offs_n[:, None] * sdvs + offs_d[None, :] * sdvd,
             dv.to(dv_ptr.dtype.element_ty), mask=mask_nd)


@triton.jit
def attn_bwd_dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
                       sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                       sdob, sdoh, sdos, sdod, sdqb, sdqh, sdqs, sdqd,
                       H, GROUP, S, D, scale,
                       CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr):
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
    mask_md = mask_m[:, None] & mask_d[None, :]
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None] * sqs + offs_d[None, :] * sqd,
                mask=mask_md, other=0.0)
    do = tl.load(do_ptr + b * sdob + h * sdoh + offs_m[:, None] * sdos + offs_d[None, :] * sdod,
                 mask=mask_md, other=0.0)
    lse = tl.load(lse_ptr + bh.to(tl.int64) * S + offs_m, mask=mask_m, other=0.0)
    delta = tl.load(delta_ptr + bh.to(tl.int64) * S + offs_m, mask=mask_m, other=0.0)
    k_base = k_ptr + b * skb + hk * skh
    v_base = v_ptr + b * svb + hk * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        hi = tl.minimum((pid_m + 1) * BLOCK_M, S)
    else:
        hi = S
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < S
        mask_nd = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_base + cols[:, None] * sks + offs_d[None, :] * skd, mask=mask_nd,
                    other=0.0)
        v = tl.load(v_base + cols[:, None] * svs + offs_d[None, :] * svd, mask=mask_nd,
                    other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        valid = mask_m[:, None] & mask_n[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= offs_m[:, None])
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision="ieee")
    dq = dq * scale
    tl.store(dq_ptr + b * sdqb + h * sdqh + offs_m[:, None] * sdqs + offs_d[None, :] * sdqd,
             dq.to(dq_ptr.dtype.element_ty), mask=mask_md)


def launch_forward(q, k, v, causal, scale, out=None, kernel=None):
    """(o, lse): o written into `out` when given (any strides). `kernel` lets mutants swap the
    forward kernel and keep the launch."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    o = out if out is not None else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((b, hq, s), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    cfg = launch_config(s, d)
    (kernel or attn_fwd_kernel)[(cfg["q_tiles"], b * hq)](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        hq, hq // hkv, s, d, float(scale), CAUSAL=bool(causal), BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"])
    return o, lse


def launch_backward(q, k, v, o, lse, do, dlse, causal, scale, dkdv_kernel=None,
                    preprocess_kernel=None):
    """(dq, dk, dv) in the input dtype. `dkdv_kernel` and `preprocess_kernel` let mutants swap
    the dK/dV kernel and the Δ preprocess kernel."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if q.numel() == 0:
        return dq, dk.zero_(), dv.zero_()
    cfg = launch_config(s, d)
    blocks = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=cfg["BLOCK_D"])
    delta = torch.empty((b, hq, s), dtype=torch.float32, device=q.device)
    dl = dlse.float().contiguous() if dlse is not None else delta
    (preprocess_kernel or attn_bwd_preprocess_kernel)[(cfg["q_tiles"], b * hq)](
        o, do, dl, delta, *o.stride(), *do.stride(), hq, s, d, HAS_DLSE=dlse is not None,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_D=cfg["BLOCK_D"])
    (dkdv_kernel or attn_bwd_dkdv_kernel)[(cfg["k_tiles"], b * hkv)](
        q, k, v, do, lse, delta, dk, dv, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dk.stride(), *dv.stride(), hq, hq // hkv, s, d, float(scale), CAUSAL=bool(causal),
        **blocks)
    attn_bwd_dq_kernel[(cfg["q_tiles"], b * hq)](
        q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
        *dq.stride(), hq, hq // hkv, s, d, float(scale), CAUSAL=bool(causal), **blocks)
    return dq, dk, dv


class _FlashAttentionTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o, lse = launch_forward(q, k, v, causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cfg = (causal, scale)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    @once_differentiable("flash_attention (Triton)")
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale = ctx.cfg
        do = torch.zeros_like(o) if do is None else do.to(o.dtype)
        dq, dk, dv = launch_backward(q, k, v, o, lse, do, dlse, causal, scale)
        return dq, dk, dv, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    scale: float | None = None, out: torch.Tensor | None = None):
    """(o, lse): o like q (written into `out` when given), lse fp32 [B, Hq, S]."""
    *_, scale = check_args(q, k, v, causal, scale, out, max_head_dim=MAX_HEAD_DIM,
                             dtypes=triton_dtypes())
    causal = bool(causal)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if out is not None:
        if needs_grad:
            raise RuntimeError("attention: out= does not support autograd (inputs require grad)")
        return launch_forward(q, k, v, causal, scale, out)
    # Always through the Function, even when nothing requires grad: forward-mode AD does not
    # set requires_grad (nor need grad mode), and a bare kernel launch would drop the inputs'
    # tangents silently; the Function refuses forward mode with a clear error instead.
    return _FlashAttentionTriton.apply(q, k, v, causal, scale)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    return flash_attention(q, k, v, causal, scale, out)[0]
