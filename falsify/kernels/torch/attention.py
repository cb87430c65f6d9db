"""Attention in torch, memory-efficient: never materializing the [S, S] score matrix, forward
and backward.

Two paths. `attention` (o only; what the model calls) is torch's fused
scaled_dot_product_attention restricted to its flash / memory-efficient kernels (see
_SDPA_BACKENDS). `flash_attention` (o and a differentiable lse) is the Python-tiled
implementation below, as a torch.autograd.Function; it documents the algorithm both follow.

q: [B, Hq, S, D], k and v: [B, Hkv, S, D], Hq a multiple of Hkv (GQA: query head h reads key
head h // G). The G query heads that share a key/value head are folded into the rows of one
matmul against that head's keys ([B, Hkv, G·rows, D] @ [B, Hkv, D, keys]): K/V are never
repeated in memory, and the products that reduce over rows (dK, dV) sum over the group.

Forward, per query tile, over key tiles j (Milakov & Gimelshein online softmax; the
accumulator rescale is the step a naive fused-attention update leaves out):
    m_new = max(m, rowmax(S_j))
    l     = l·exp(m − m_new) + rowsum(exp(S_j − m_new))
    acc   = acc·exp(m − m_new) + exp(S_j − m_new)·V_j
    o = acc / l,   lse = m + log(l)   (saved for the backward: [B, H, S] fp32)

Backward from the saved lse (FlashAttention-2): P_j = exp(S_j − lse) is recomputed per tile;
    Δ_i = Σ_d dO_id·O_id − dlse_i      (= Σ_j P_ij·dP_ij − dlse_i, since O = P·V)
    dV_j += P_jᵀ·dO,  dP = dO·V_jᵀ,  dS = P ⊙ (dP − Δ),  dQ += scale·dS·K_j,  dK_j += scale·dSᵀ·Q
The dlse term makes lse itself differentiable (∂lse_i/∂s_ij = P_ij), so flash_attention's
second output can feed a loss.

Peak extra memory is O(B·Hq·MAX_BLOCK²) for one score tile plus O(B·Hq·S·D) for the outputs
and fp32 accumulators: linear in S (measured in falsify/probes/attention.py).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from falsify.kernels.dtypes import CHECKED, require
from falsify.kernels.launch import next_power_of_2_clamped
from falsify.kernels.torch.gemm import internal_overlap, may_overlap

__all__ = ["attention", "flash_attention"]

MAX_BLOCK = 128  # largest query/key tile: peak memory per step is B·Hq·MAX_BLOCK² fp32 scores


def block_size(s):
    """Query and key tile for sequence length s: about half of s (so even short sequences run
    the multi-tile online-softmax path the contract's small shapes test), at least 16 and at
    most MAX_BLOCK, so the score tile — and with it peak memory — stops growing with s."""
    return next_power_of_2_clamped((s + 1) // 2, 16, MAX_BLOCK)


def check_args(q, k, v, causal, scale, out, max_head_dim=None, dtypes: tuple = CHECKED):
    """Validate; returns (B, Hq, Hkv, S, D, scale as a float)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"attention: {name} must be a 4-D tensor [B, H, S, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    require("attention", dtypes, q=q, k=k, v=v)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"attention: q, k, v must share one dtype, got {q.dtype}, "
                        f"{k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("attention: q, k, v are on different devices")
    b, hq, s, d = q.shape
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != b or tuple(k.shape[2:]) != (s, d):
        raise ValueError(f"attention: k {tuple(k.shape)} and v {tuple(v.shape)} must be "
                         f"[B, Hkv, S, D] matching q {tuple(q.shape)}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"attention: Hq = {hq} must be a positive multiple of Hkv = {hkv}")
    if not isinstance(causal, bool) and type(causal).__name__ != "bool_":
        raise TypeError(f"attention: causal must be a bool, got {type(causal).__name__}")
    if max_head_dim is not None and d > max_head_dim:
        raise ValueError(f"attention: head dim {d} > {max_head_dim} (one tile holds a whole row)")
    if d == 0:  # q·k is an empty sum and the default scale 1/√d infinite
        raise ValueError(f"attention: head dim D = 0 (q {tuple(q.shape)})")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif isinstance(scale, numbers.Real) and math.isfinite(scale):
        scale = float(scale)
    else:
        raise ValueError(f"attention: scale must be a finite real or None, got {scale!r}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
            raise ValueError(f"attention: out must have q's shape {tuple(q.shape)}, got "
                             f"{tuple(out.shape) if isinstance(out, torch.Tensor) else out}")
        if out.dtype != q.dtype or out.device != q.device:
            raise TypeError(f"attention: out must be {q.dtype} on {q.device}")
        if internal_overlap(out):
            raise ValueError(f"attention: out has overlapping elements (strides {out.stride()})")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if may_overlap(out, t):
                raise ValueError(f"attention: out overlaps {name}")
    return b, hq, hkv, s, d, scale


def _grouped(x, hkv):
    """[B, Hq, S, ...] → [B, Hkv, G, S, ...] (a view when x allows it)."""
    return x.reshape(x.shape[0], hkv, x.shape[1] // hkv, *x.shape[2:])


def _rows(xg, qs, qe):
    """Rows qs..qe of every head of a group, folded into one [B, Hkv, G·(qe − qs), ...] block:
    the G query heads that share a key/value head become extra rows of one plain matmul
    against that head's keys (no broadcast, no K/V copies), and the products that reduce over
    rows (dK, dV) sum over the group by themselves."""
    b, hkv, g = xg.shape[:3]
    return xg[:, :, :, qs:qe].float().reshape(b, hkv, g * (qe - qs), *xg.shape[4:])


def _mask_tile(t, g, qs, qe, ks, ke, value):
    """Apply the causal mask to a folded [B, Hkv, G·bq, bk] tile (viewed per head)."""
    b, hkv = t.shape[:2]
    t5 = t.view(b, hkv, g, qe - qs, ke - ks)
    return t5.masked_fill(_causal_mask(qs, qe, ks, ke, t.device), value).view(t.shape)


def _causal_mask(qs, qe, ks, ke, device):
    """True where key j > query i (masked), for the tile [qs, qe) × [ks, ke)."""
    qi = torch.arange(qs, qe, device=device)[:, None]
    kj = torch.arange(ks, ke, device=device)[None, :]
    return kj > qi


def forward(q, k, v, causal, scale, block=None):
    """(o fp32 [B, Hq, S, D], lse fp32 [B, Hq, S]), tiled; never builds [S, S]."""
    b, hq, s, d = q.shape
    block = block or block_size(s)
    hkv = k.shape[1]
    g = hq // hkv
    qg = _grouped(q, hkv)
    o = torch.empty(qg.shape, dtype=torch.float32, device=q.device)
    lse = torch.empty(qg.shape[:-1], dtype=torch.float32, device=q.device)
    for qs in range(0, s, block):
        qe = min(s, qs + block)
        qc = _rows(qg, qs, qe)
        m = torch.full(qc.shape[:-1], float("-inf"), device=q.device)
        l = torch.zeros(qc.shape[:-1], device=q.device)
        acc = torch.zeros(qc.shape, device=q.device)
        k_end = qe if causal else s  # keys after the tile's last query are all masked
        for ks in range(0, k_end, block):
            ke = min(k_end, ks + block)
            sc = (qc @ k[:, :, ks:ke].float().transpose(-1, -2)) * scale
            if causal and ke - 1 > qs:
                sc = _mask_tile(sc, g, qs, qe, ks, ke, float("-inf"))
            m_new = torch.maximum(m, sc.amax(dim=-1))
            # Key 0 is visible to every query, so m_new is finite from the first tile on and
            # exp(m − m_new) = exp(−inf) = 0 there: no NaN from −inf − (−inf).
            alpha = torch.exp(m - m_new)
            p = torch.exp(sc - m_new[..., None])
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ v[:, :, ks:ke].float()
            m = m_new
        o[:, :, :, qs:qe] = (acc / l[..., None]).view(b, hkv, g, qe - qs, d)
        lse[:, :, :, qs:qe] = (m + torch.log(l)).view(b, hkv, g, qe - qs)
    return o.reshape(b, hq, s, d), lse.reshape(b, hq, s)


def backward(q, k, v, o, lse, do, dlse, causal, scale, block=None):
    """(dq, dk, dv) in fp32 from the saved lse; P is recomputed one [block, block] tile at a
    time. dlse may be None (lse not used by the loss)."""
    b, hq, s, d = q.shape
    block = block or block_size(s)
    hkv = k.shape[1]
    g = hq // hkv
    qg, dog = _grouped(q, hkv), _grouped(do, hkv)
    lse_g = _grouped(lse, hkv)
    delta = _grouped((do.float() * o.float()).sum(dim=-1), hkv)
    if dlse is not None:
        delta = delta - _grouped(dlse.float(), hkv)
    dq = torch.zeros(qg.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    for ks in range(0, s, block):
        ke = min(s, ks + block)
        kc, vc = k[:, :, ks:ke].float(), v[:, :, ks:ke].float()
        q_start = (ks // block) * block if causal else 0  # earlier queries never see these keys
        for qs in range(q_start, s, block):
            qe = min(s, qs + block)
            qc, doc = _rows(qg, qs, qe), _rows(dog, qs, qe)
            sc = (qc @ kc.transpose(-1, -2)) * scale
            p = torch.exp(sc - _rows(lse_g[..., None], qs, qe))
            if causal and ke - 1 > qs:
                p = _mask_tile(p, g, qs, qe, ks, ke, 0.0)
            dv[:, :, ks:ke] += p.transpose(-1, -2) @ doc
            dp = doc @ vc.transpose(-1, -2)
            ds = p * (dp - _rows(delta[..., None], qs, qe))
            dq[:, :, :, qs:qe] += (ds @ kc).view(b, hkv, g, qe - qs, d) * scale
            dk[:, :, ks:ke] += (ds.transpose(-1, -2) @ qc) * scale
    return dq.reshape(b, hq, s, d), dk, dv


class _FlashAttentionTorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        o32, lse = forward(q, k, v, causal, scale)
        o = o32.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.cfg = (causal, scale)
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scale = ctx.cfg
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = backward(q, k, v, o, lse, do, dlse, causal, scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                    scale: float | None = None, out: torch.Tensor | None = None):
    """(o, lse): o like q, lse fp32 [B, Hq, S] (natural log of the softmax normalizer)."""
    b, hq, hkv, s, d, scale = check_args(q, k, v, causal, scale, out)
    causal = bool(causal)
    if out is not None:
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise RuntimeError("attention: out= does not support autograd (inputs require grad)")
        o32, lse = forward(q, k, v, causal, scale)
        out.copy_(o32)
        return out, lse
    return _FlashAttentionTorch.apply(q, k, v, causal, scale)


# torch's own fused attention kernels that never build the [S, S] scores: the CPU flash kernel
# (tiled online softmax, fp32 accumulation, GQA without repeating K/V), and on CUDA the flash or
# memory-efficient kernel (the latter also takes fp32). MATH, the S²-memory formulation, is
# deliberately not in the list: a call no fused kernel accepts raises instead of silently
# materializing the scores (ATT-BND-003).
_SDPA_BACKENDS = {"cpu": [SDPBackend.FLASH_ATTENTION],
                  "cuda": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]}


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
              scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """o only (no lse): torch's fused scaled_dot_product_attention, forward and backward in
    one C++ kernel each. Measured on the 2-core CPU (tiny and 50m attention shapes, fwd + bwd,
    1 and 2 threads): 1.6-2.1x faster than the Python-tiled `flash_attention` below, which
    remains the path that also returns a differentiable lse. The contract's parity, gradient,
    causality, GQA and memory checks run against this function, so they pin the library
    kernel's semantics."""
    b, hq, hkv, s, d, scale = check_args(q, k, v, causal, scale, out)
    if q.device.type not in _SDPA_BACKENDS:
        return flash_attention(q, k, v, causal, scale, out)[0]
    if out is not None and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("attention: out= does not support autograd (inputs require grad)")
    # the flash / memory-efficient kernels need a unit last stride ("No available kernel"
    # for a transposed or stepped view): such an input is copied, any other view passes as is.
    # Not .contiguous(): it keeps the strides of a view whose dims are all 1.
    q, k, v = (t if t.stride(-1) == 1 else t.clone(memory_format=torch.contiguous_format)
               for t in (q, k, v))
    if q.device.type == "cuda" and hq != hkv and q.dtype == torch.float32:
        # on CUDA only the flash kernel takes enable_gqa, and it has no fp32 path: the
        # memory-efficient kernel gets K/V repeated per query head (G× the K/V memory, still
        # no [S, S] scores) rather than "No available kernel"
        k, v = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))
        hkv = hq
    d_pad = -d % _CUDA_HEAD_DIM_MULTIPLE if q.device.type == "cuda" else 0
    if d_pad:
        q, k, v = _pad_head_dim(q, k, v, d_pad)
    with sdpa_kernel(_SDPA_BACKENDS[q.device.type]):
        # Under torch.compile with dynamic shapes the default 1/√d and hq != hkv are symbolic,
        # which SDPA's `scale` and `enable_gqa` refuse (a TypeError that breaks the graph):
        # float() makes the scale concrete, and branching on the grouping guards on it
        if hq != hkv:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                               scale=float(scale), enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                               scale=float(scale))
    if d_pad:
        y = y[..., :d]
    return out.copy_(y) if out is not None else y


# The CUDA fused kernels want the head dim in whole 16-byte vectors (8 halves, 4 floats): for
# another d no kernel in _SDPA_BACKENDS accepts the call ("No available kernel" at d = 1 on an
# H200). 8 covers both dtypes.
_CUDA_HEAD_DIM_MULTIPLE = 8


def _pad_head_dim(q, k, v, pad: int):
    """q, k, v with `pad` zero columns appended to the head dim: q·kᵀ is unchanged (the zeros
    add nothing), the output's extra columns are zero (sliced off by the caller), and autograd
    slices the gradients back. The caller passes the scale explicitly: the default 1/√d would
    otherwise read the padded d."""
    return tuple(F.pad(t, (0, pad)) for t in (q, k, v))


def attention_naive(q, k, v, causal=True, scale=None, out=None):
    """The textbook formulation, materializing [B, Hq, S, S]: the baseline the peak-memory
    check compares against (and a readable statement of what the tiled code computes)."""
    b, hq, hkv, s, d, scale = check_args(q, k, v, causal, scale, out)
    g = hq // hkv
    kk = k.repeat_interleave(g, dim=1).float()
    vv = v.repeat_interleave(g, dim=1).float()
    sc = (q.float() @ kk.transpose(-1, -2)) * scale
    if causal:
        sc = sc.masked_fill(_causal_mask(0, s, 0, s, q.device), float("-inf"))
    y = (torch.softmax(sc, dim=-1) @ vv).to(q.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
