"""Scaled dot-product attention, causal and grouped-query (GQA), float64, materialized.

q: [B, Hq, S, D], k and v: [B, Hkv, S, D], Hq = G·Hkv. Query head h reads key/value head
h // G (GQA; G = 1 is multi-head attention, Hkv = 1 multi-query).

    s_ij = scale·q_i·k_j  (scale = 1/√D unless given),  masked to −∞ for j > i when causal
    P_ij = exp(s_ij − lse_i),  lse_i = log Σ_j exp(s_ij)
    o_i  = Σ_j P_ij·v_j

Backward (G_o = ∂L/∂o; dP = G_o·vᵀ; Δ_i = Σ_j P_ij·dP_ij; the softmax Jacobian gives
dS = P ⊙ (dP − Δ)):
    ∂L/∂v_j = Σ_i P_ij·G_o,i        ∂L/∂q_i = scale·Σ_j dS_ij·k_j
    ∂L/∂k_j = scale·Σ_i dS_ij·q_i   summed over the G query heads that share a key/value head.
When the loss also reads lse (G_lse = ∂L/∂lse = dlse): ∂lse_i/∂s_ij = P_ij adds dlse_i·P_ij to
dS_ij, i.e. Δ_i = Σ_j P_ij·dP_ij − dlse_i in the same formula (v does not enter lse).
"""

import math

import numpy as np


def _check(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"attention: q, k, v must be [B, H, S, D], got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    b, hq, s, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[2:] != (s, d):
        raise ValueError(f"attention: k {k.shape} and v {v.shape} must be [B, Hkv, S, D] "
                         f"matching q {q.shape}")
    hkv = k.shape[1]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"attention: Hq = {hq} is not a multiple of Hkv = {hkv}")
    if d == 0:  # q·k is an empty sum and the default scale 1/√d infinite
        raise ValueError(f"attention: head dim D = 0 (q {q.shape})")
    return hq // hkv, d


def probabilities(q, k, causal=True, scale=None):
    """(P, lse, scale) with P: [B, Hq, S, S] and lse: [B, Hq, S]."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    g, d = _check(q, k, k)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    kk = np.repeat(k, g, axis=1)  # query head h reads key head h // g
    s = scale * (q @ np.swapaxes(kk, -1, -2))
    if causal:
        n = q.shape[2]
        s = np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, s)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # S = 0: no rows, nothing to reduce
    lse = m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True))
    return np.exp(s - lse), lse[..., 0], scale


def flash_attention(q, k, v, causal=True, scale=None, out=None):
    """(o, lse): the output and the per-row log-normalizer the tiled kernels save."""
    v = np.asarray(v, np.float64)
    g, _ = _check(np.asarray(q), np.asarray(k), v)
    p, lse, _ = probabilities(q, k, causal, scale)
    o = p @ np.repeat(v, g, axis=1)
    if out is not None:
        out[...] = o
        o = out
    return o, lse


def attention(q, k, v, causal=True, scale=None, out=None):
    return flash_attention(q, k, v, causal, scale, out)[0]


def attention_backward(q, k, v, causal=True, scale=None, out=None, dy=None, dlse=None):
    """{q, k, v} gradients for upstream dy = ∂L/∂o and, when given, dlse = ∂L/∂lse
    ([B, Hq, S]; flash_attention's second output), from the explicit softmax Jacobian."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    g, _ = _check(q, k, v)
    p, _, scale = probabilities(q, k, causal, scale)
    go = np.asarray(dy, np.float64)
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    dp = go @ np.swapaxes(vv, -1, -2)
    delta = (p * dp).sum(axis=-1, keepdims=True)
    if dlse is not None:  # ∂lse_i/∂s_ij = P_ij: dS_ij += P_ij·dlse_i
        delta = delta - np.asarray(dlse, np.float64)[..., None]
    ds = p * (dp - delta)
    dq = scale * (ds @ kk)
    dk_rep = scale * (np.swapaxes(ds, -1, -2) @ q)
    dv_rep = np.swapaxes(p, -1, -2) @ go
    b, hkv, s, d = k.shape

    def group_sum(x):  # [B, Hq, S, D] → [B, Hkv, S, D]: heads h = j·g + t for t < g
        return x.reshape(b, hkv, g, s, d).sum(axis=2)

    return {"q": dq, "k": group_sum(dk_rep), "v": group_sum(dv_rep)}
