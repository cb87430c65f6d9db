"""The LLaMA-style decoder in numpy float64 with a hand-written backward (no autograd).

Same architecture and parameter names as falsify/llm/model.py (pre-norm, RMSNorm, rotate-half RoPE,
GQA causal attention, SwiGLU, tied embeddings, no biases). Params are a dict name -> ndarray,
linear weights stored [out, in]: y = x @ W.T, so dx = dy @ W and dW = dyᵀ @ x.

Backward rules used below (· is elementwise, Σ over the named axis):
  RMSNorm   y = x̂·g, x̂ = x·r, r = (mean x² + ε)^-½:
            dg = Σ_rows dy·x̂ ;  dx = r·(dy·g − x̂·mean(dy·g·x̂))
  RoPE      y = x·cos + R(x)·sin, R(x) = [−x₂, x₁] (a rotation, orthogonal):
            dx = dy·cos + Rᵀ(dy·sin), Rᵀ(z) = [z₂, −z₁]
  attention S = c·q kᵀ + causal mask, P = softmax(S), o = P v:
            dv = Pᵀ do ; dP = do vᵀ ; dS = P·(dP − Σ_j dP·P) ; dq = c·dS k ; dk = c·dSᵀ q
            GQA: query head h reads kv head h // (Hq/Hkv), so dk, dv sum over the group
  SwiGLU    s = silu(a)·u, silu(a) = a·σ(a):
            du = ds·silu(a) ; da = ds·u·σ(a)·(1 + a·(1 − σ(a)))
  residual  x + f(x): the gradient reaches both branches in full (duplicated, not split)
  tied head logits = x_f Eᵀ and x0 = E[ids]: dE = dlogitsᵀ x_f + scatter-add of dx0 by id
  CE        loss = Σ (lse(z) − z_y) over counted tokens: dz = softmax(z) − onehot(y)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RefModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_seq_len: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


TINY = RefModelConfig(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4,
                      num_kv_heads=2, intermediate_size=384, max_seq_len=128)


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    h, d, i = cfg.hidden_size, cfg.hidden_size // cfg.num_heads, cfg.intermediate_size
    shapes = {"embed_tokens.weight": (cfg.vocab_size, h)}
    for n in range(cfg.num_layers):
        p = f"layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.num_heads * d, h),
            p + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
            p + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
            p + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
    shapes["norm.weight"] = (h,)
    return shapes


# ------------------------------------------------------------------------------ pieces
def rmsnorm_fwd(x, g, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    xhat = x * r
    return xhat * g, (xhat, r)


def rmsnorm_bwd(dy, g, cache):
    xhat, r = cache
    dg = np.sum(dy * xhat, axis=tuple(range(dy.ndim - 1)))
    gy = dy * g
    dx = r * (gy - xhat * np.mean(gy * xhat, axis=-1, keepdims=True))
    return dx, dg


def rope_tables(seq_len: int, head_dim: int, theta: float):
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=-1)  # rotate-half: pair (i, i + D/2) shares angle i
    return np.cos(ang), np.sin(ang)  # [S, D]


def _rot(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rot_t(z):
    h = z.shape[-1] // 2
    return np.concatenate([z[..., h:], -z[..., :h]], axis=-1)


def rope_fwd(x, cos, sin):
    """x [B, S, H, D]; cos/sin [S, D]."""
    return x * cos[None, :, None, :] + _rot(x) * sin[None, :, None, :]


def rope_bwd(dy, cos, sin):
    return dy * cos[None, :, None, :] + _rot_t(dy * sin[None, :, None, :])


def attention_fwd(q, k, v, scale):
    """q [B, Hq, S, D], k/v [B, Hkv, S, D] -> o [B, Hq, S, D] (causal, GQA)."""
    group = q.shape[1] // k.shape[1]
    kr, vr = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = scale * q @ kr.transpose(0, 1, 3, 2)
    n = q.shape[2]
    s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return p @ vr, (p, kr, vr)


def attention_bwd(do, q, cache, scale, hkv):
    p, kr, vr = cache
    dvr = p.transpose(0, 1, 3, 2) @ do
    dp = do @ vr.transpose(0, 1, 3, 2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dq = scale * ds @ kr
    dkr = scale * ds.transpose(0, 1, 3, 2) @ q
    b, hq, s, d = q.shape
    group = hq // hkv
    dk = dkr.reshape(b, hkv, group, s, d).sum(2)
    dv = dvr.reshape(b, hkv, group, s, d).sum(2)
    return dq, dk, dv


def _sigmoid(a):
    return 0.5 * (1.0 + np.tanh(0.5 * a))  # no overflow for large |a|


# ---------------------------------------------------------------------------- the model
def forward(params: dict, ids: np.ndarray, cfg):
    """ids [B, S] -> logits [B, S, V] and the cache the backward needs."""
    b, s = ids.shape
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size // cfg.num_heads
    eps, scale = cfg.rms_norm_eps, 1.0 / np.sqrt(d)
    cos, sin = rope_tables(s, d, cfg.rope_theta)
    x = params["embed_tokens.weight"][ids]
    layers = []
    for n in range(cfg.num_layers):
        p = f"layers.{n}."
        c = {"x_in": x}
        a, c["n1"] = rmsnorm_fwd(x, params[p + "input_layernorm.weight"], eps)
        c["a"] = a
        q = (a @ params[p + "self_attn.q_proj.weight"].T).reshape(b, s, hq, d)
        k = (a @ params[p + "self_attn.k_proj.weight"].T).reshape(b, s, hkv, d)
        v = (a @ params[p + "self_attn.v_proj.weight"].T).reshape(b, s, hkv, d)
        q = rope_fwd(q, cos, sin).transpose(0, 2, 1, 3)
        k = rope_fwd(k, cos, sin).transpose(0, 2, 1, 3)
        v = v.transpose(0, 2, 1, 3)
        o, c["attn"] = attention_fwd(q, k, v, scale)
        c["q"] = q
        o = o.transpose(0, 2, 1, 3).reshape(b, s, hq * d)
        c["o"] = o
        x = x + o @ params[p + "self_attn.o_proj.weight"].T
        c["x_mid"] = x
        m, c["n2"] = rmsnorm_fwd(x, params[p + "post_attention_layernorm.weight"], eps)
        c["m"] = m
        gate = m @ params[p + "mlp.gate_proj.weight"].T
        up = m @ params[p + "mlp.up_proj.weight"].T
        sg = _sigmoid(gate)
        act = gate * sg * up
        c.update(gate=gate, up=up, sg=sg, act=act)
        x = x + act @ params[p + "mlp.down_proj.weight"].T
        layers.append(c)
    xf, nf = rmsnorm_fwd(x, params["norm.weight"], eps)
    logits = xf @ params["embed_tokens.weight"].T
    return logits, {"ids": ids, "layers": layers, "xf": xf, "nf": nf, "cos": cos, "sin": sin}


def cross_entropy(logits, targets, ignore_index=-100):
    """(sum of token losses, counted tokens, dloss_sum/dlogits)."""
    z = logits - logits.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    logp = z - lse
    mask = targets != ignore_index
    safe = np.where(mask, targets, 0)
    picked = np.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    total = -np.sum(picked[mask])
    dz = np.exp(logp)
    np.put_along_axis(dz, safe[..., None],
                      np.take_along_axis(dz, safe[..., None], axis=-1) - 1.0, axis=-1)
    dz *= mask[..., None]
    return total, int(mask.sum()), dz


def backward(params: dict, cache: dict, dlogits: np.ndarray, cfg) -> dict:
    """Gradients of sum(dlogits · logits) w.r.t. every parameter."""
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.hidden_size // cfg.num_heads
    eps, scale = cfg.rms_norm_eps, 1.0 / np.sqrt(d)
    cos, sin = cache["cos"], cache["sin"]
    emb = params["embed_tokens.weight"]
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    b, s, _ = dlogits.shape
    v_ = dlogits.reshape(-1, dlogits.shape[-1])
    grads["embed_tokens.weight"] += v_.T @ cache["xf"].reshape(-1, emb.shape[1])
    dxf = dlogits @ emb
    dx, grads["norm.weight"] = rmsnorm_bwd(dxf, params["norm.weight"], cache["nf"])
    del eps  # the norm caches hold r; eps is not needed again
    for n in reversed(range(cfg.num_layers)):
        p, c = f"layers.{n}.", cache["layers"][n]
        # FFN branch; dx flows on through the residual unchanged and into the branch
        dact = dx @ params[p + "mlp.down_proj.weight"]
        grads[p + "mlp.down_proj.weight"] += _wgrad(dx, c["act"])
        gate, up, sg = c["gate"], c["up"], c["sg"]
        dup = dact * gate * sg
        dgate = dact * up * sg * (1.0 + gate * (1.0 - sg))
        grads[p + "mlp.gate_proj.weight"] += _wgrad(dgate, c["m"])
        grads[p + "mlp.up_proj.weight"] += _wgrad(dup, c["m"])
        dm = dgate @ params[p + "mlp.gate_proj.weight"] + dup @ params[p + "mlp.up_proj.weight"]
        dxm, dg2 = rmsnorm_bwd(dm, params[p + "post_attention_layernorm.weight"], c["n2"])
        grads[p + "post_attention_layernorm.weight"] += dg2
        dx = dx + dxm
        # attention branch
        do = dx @ params[p + "self_attn.o_proj.weight"]
        grads[p + "self_attn.o_proj.weight"] += _wgrad(dx, c["o"])
        do = do.reshape(b, s, hq, d).transpose(0, 2, 1, 3)
        dq, dk, dv = attention_bwd(do, c["q"], c["attn"], scale, hkv)
        dq = rope_bwd(dq.transpose(0, 2, 1, 3), cos, sin).reshape(b, s, hq * d)
        dk = rope_bwd(dk.transpose(0, 2, 1, 3), cos, sin).reshape(b, s, hkv * d)
        dv = dv.transpose(0, 2, 1, 3).reshape(b, s, hkv * d)
        a = c["a"]
        grads[p + "self_attn.q_proj.weight"] += _wgrad(dq, a)
        grads[p + "self_attn.k_proj.weight"] += _wgrad(dk, a)
        grads[p + "self_attn.v_proj.weight"] += _wgrad(dv, a)
        da = (dq @ params[p + "self_attn.q_proj.weight"]
              + dk @ params[p + "self_attn.k_proj.weight"]
              + dv @ params[p + "self_attn.v_proj.weight"])
        dxa, dg1 = rmsnorm_bwd(da, params[p + "input_layernorm.weight"], c["n1"])
        grads[p + "input_layernorm.weight"] += dg1
        dx = dx + dxa
    np.add.at(grads["embed_tokens.weight"], cache["ids"].reshape(-1),
              dx.reshape(-1, dx.shape[-1]))
    return grads


def _wgrad(dy, x):
    """dW for y = x @ W.T: dyᵀ x summed over all leading axes."""
    return dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])


def loss_and_grads(params: dict, micro_batches, cfg, ignore_index: int = -100):
    """Token-weighted loss over all micro-batches (Σ token CE / total counted tokens) and its
    gradient: each micro-batch's dlogits is scaled by 1/N_total, not 1/N_micro."""
    n_total = sum(int((np.asarray(y) != ignore_index).sum()) for _, y in micro_batches)
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    total = 0.0
    for x, y in micro_batches:
        logits, cache = forward(params, np.asarray(x), cfg)
        s, _, dz = cross_entropy(logits, np.asarray(y), ignore_index)
        total += s
        for k, g in backward(params, cache, dz / n_total, cfg).items():
            grads[k] += g
    return total / n_total, grads, n_total
