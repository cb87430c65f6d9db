"""LoRA linear layer (pure numpy, float64): y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ.

Layout as HF / PEFT: W [out, in] (frozen), A [r, in], B [out, r], x [..., in]. Scale
s = α / r, or α / √r with rsLoRA (PEFT `use_rslora`). PEFT's default init: A Kaiming-uniform with
a = √5 over fan_in = in, i.e. U(−1/√in, 1/√in); B = 0, so the adapted layer equals the base
layer at step 0.

Backward, with g = ∂L/∂y [..., out], t = x·Aᵀ [..., r], u = g·B [..., r] (leading dims flattened
into M rows):
    ∂L/∂x = g·W + s·u·A                 (base path + adapter path)
    ∂L/∂B = s·gᵀ·t                      ([out, r])
    ∂L/∂A = s·uᵀ·x  = s·(g·B)ᵀ·x        ([r, in])
    ∂L/∂W = none: W is frozen.
Derivation: y = x·Wᵀ + s·t·Bᵀ with t = x·Aᵀ. For a scalar loss, dL = ⟨g, dy⟩ and
dy = dx·Wᵀ + s·(dx·Aᵀ)·Bᵀ + s·(x·dAᵀ)·Bᵀ + s·t·dBᵀ, so ⟨g, s·t·dBᵀ⟩ = ⟨s·gᵀ·t, dB⟩,
⟨g, s·x·dAᵀ·Bᵀ⟩ = ⟨s·(g·B)ᵀ·x, dA⟩, ⟨g, dx·(Wᵀ + s·Aᵀ·Bᵀ)⟩ = ⟨g·W + s·g·B·A, dx⟩.
At init B = 0 ⇒ u = 0 ⇒ ∂L/∂A = 0 exactly, while ∂L/∂B = s·gᵀ·(x·Aᵀ) ≠ 0: only B moves on the
first step.
"""

import math

import numpy as np


def lora_scale(alpha, r, rslora=False):
    """α / r, or α / √r for rsLoRA."""
    r = int(r)
    if r < 1:
        raise ValueError(f"LoRA rank r = {r}: must be ≥ 1")
    return float(alpha) / (math.sqrt(r) if rslora else r)


def check_shapes(x, w, a, b, r):
    """Raise a clear error unless x [..., in], w [out, in], a [r, in], b [out, r]."""
    r = int(r)
    if np.ndim(w) != 2 or np.ndim(a) != 2 or np.ndim(b) != 2 or np.ndim(x) < 1:
        raise ValueError(f"expected x [..., in], w [out, in], a [r, in], b [out, r]; got "
                         f"{np.shape(x)}, {np.shape(w)}, {np.shape(a)}, {np.shape(b)}")
    out_f, in_f = np.shape(w)
    if np.shape(x)[-1] != in_f:
        raise ValueError(f"x has {np.shape(x)[-1]} features, w expects {in_f}")
    if np.shape(a) != (r, in_f):
        raise ValueError(f"a must be [r={r}, in={in_f}], got {np.shape(a)}")
    if np.shape(b) != (out_f, r):
        raise ValueError(f"b must be [out={out_f}, r={r}], got {np.shape(b)}")
    return out_f, in_f


def lora_linear(x, w, a, b, alpha, r, rslora=False):
    x, w, a, b = (np.asarray(v, np.float64) for v in (x, w, a, b))
    check_shapes(x, w, a, b, r)
    s = lora_scale(alpha, r, rslora)
    return x @ w.T + s * (x @ a.T) @ b.T


def lora_linear_backward(x, w, a, b, alpha, r, rslora=False, dy=None):
    """Gradients of ⟨dy, lora_linear(...)⟩ for the trainable arguments x, a, b."""
    x, w, a, b, dy = (np.asarray(v, np.float64) for v in (x, w, a, b, dy))
    check_shapes(x, w, a, b, r)
    s = lora_scale(alpha, r, rslora)
    in_f = w.shape[1]
    x2 = x.reshape(-1, in_f)
    g = dy.reshape(-1, w.shape[0])
    t = x2 @ a.T
    u = g @ b
    return {
        "x": (g @ w + s * u @ a).reshape(x.shape),
        "a": s * u.T @ x2,
        "b": s * g.T @ t,
    }


def lora_merge(w, a, b, alpha, r, rslora=False):
    """W' = W + s·B·A: the plain linear layer with the same outputs as the adapted one."""
    w, a, b = (np.asarray(v, np.float64) for v in (w, a, b))
    check_shapes(np.zeros((1, w.shape[1])), w, a, b, r)
    return w + lora_scale(alpha, r, rslora) * b @ a


def lora_init(in_features, out_features, r, seed):
    """(A [r, in] ~ U(−1/√in, 1/√in), B [out, r] = 0): PEFT's default. kaiming_uniform_ with
    a = √5 has gain √(2 / (1 + 5)) and bound gain·√(3 / fan_in) = 1/√in."""
    in_features, out_features, r = int(in_features), int(out_features), int(r)
    if min(in_features, out_features, r) < 1:
        raise ValueError("in_features, out_features and r must be ≥ 1")
    bound = 1.0 / math.sqrt(in_features)
    a = np.random.default_rng(int(seed)).uniform(-bound, bound, size=(r, in_features))
    return a, np.zeros((out_features, r))
