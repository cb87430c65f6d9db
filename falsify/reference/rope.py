"""Rotary position embedding, rotate-half convention (HF LLaMA / GPT-NeoX layout).

x has shape [B, S, H, D] (D even), pos has shape [S] (integer positions, shared by the batch).
With half = D/2, frequencies f_k = theta^(−2k/D) for k < half, angles a[s, k] = pos[s]·f_k,
and x split into halves x1 = x[..., :half], x2 = x[..., half:]:

    y1 = x1·cos(a) − x2·sin(a)
    y2 = x2·cos(a) + x1·sin(a)

i.e. y = x·cos + rotate_half(x)·sin with rotate_half(x) = [−x2, x1] and cos/sin repeated over
both halves. Each pair (x1_k, x2_k) is rotated by a[s, k] in its own plane, so the map is
orthogonal: its backward is its transpose, the rotation by −a, i.e. rope at positions −pos.
"""

import numpy as np


def angles(pos, d, theta):
    """a[s, k] = pos[s] · theta^(−2k/d), float64, shape [S, d/2]."""
    k = np.arange(d // 2, dtype=np.float64)
    inv_freq = float(theta) ** (-2.0 * k / d)
    return np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]


def rope(x, pos, theta):
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    if d == 0:
        raise ValueError("rope: head dim D = 0: no rotation pairs (half = 0)")
    half = d // 2
    a = angles(pos, d, theta)[None, :, None, :]  # broadcast over batch and heads
    c, s = np.cos(a), np.sin(a)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def rope_backward(x, pos, theta, dy):
    """dx = R(−a)·dy: the transpose of a rotation is the rotation by the negative angle."""
    return {"x": rope(dy, -np.asarray(pos, dtype=np.int64), theta)}
