"""llama.cpp's LLaMA graph (llm_build_llama) in numpy float64, on tensors as a GGUF file names
and lays them out: the independent reading of a GGUF export (falsify/contracts/export-v1.yaml).

It differs from falsify/reference/model.py where llama.cpp differs from HF LLaMA: q and k are
roped in GGML's interleaved layout (rope mode 0, LLAMA_ROPE_TYPE_NORM: adjacent pairs
(2i, 2i+1) rotated), not rotate-half (i, i + D/2); tensors carry llama.cpp's names
(`blk.N.attn_q.weight`); a file without `output.weight` uses `token_embd.weight` as the head.
So our rotate-half model, written with its q/k rows permuted as llama.cpp's converter permutes
HF's, computes the same logits here; written unpermuted, it computes another model.
"""

from __future__ import annotations

import numpy as np


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_ggml_norm(x: np.ndarray, theta: float) -> np.ndarray:
    """GGML rope mode 0 (LLaMA): rotate adjacent pairs (2i, 2i+1) by pos·theta^(-2i/D).
    x [S, heads, D], positions 0..S−1."""
    s, _, d = x.shape
    ang = np.arange(s)[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]
    c, sn = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = np.empty_like(x)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out[..., 0::2] = x0 * c - x1 * sn
    out[..., 1::2] = x0 * sn + x1 * c
    return out


def ggml_llama_logits(w: dict, cfg, ids: np.ndarray) -> np.ndarray:
    """Logits [S, V] of one sequence `ids` [S] under llama.cpp's LLaMA graph, from GGUF-named
    float64 tensors `w` (rows as stored: ggml's [cols, rows] read back as [rows, cols]); `cfg`
    gives num_layers, num_heads, num_kv_heads, head_dim, rms_norm_eps and rope_theta. GQA:
    query head h reads kv head h // (n_head / n_head_kv); the head is tied when the file has
    no output.weight."""
    hq, hkv, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    s = len(ids)
    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((s, s), -np.inf), 1)
    for i in range(cfg.num_layers):
        def b(n, i=i):
            return w[f"blk.{i}.{n}.weight"]

        h = _rms(x, b("attn_norm"), eps)
        q = rope_ggml_norm((h @ b("attn_q").T).reshape(s, hq, d), cfg.rope_theta)
        k = rope_ggml_norm((h @ b("attn_k").T).reshape(s, hkv, d), cfg.rope_theta)
        v = (h @ b("attn_v").T).reshape(s, hkv, d)
        kv = np.arange(hq) // (hq // hkv)
        att = np.einsum("qhd,khd->hqk", q, k[:, kv]) / np.sqrt(d) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", att, v[:, kv]).reshape(s, hq * d)
        x = x + o @ b("attn_output").T
        h = _rms(x, b("ffn_norm"), eps)
        g = h @ b("ffn_gate").T
        x = x + ((g / (1 + np.exp(-g))) * (h @ b("ffn_up").T)) @ b("ffn_down").T
    return _rms(x, w["output_norm.weight"], eps) @ w.get("output.weight",
                                                            w["token_embd.weight"]).T
