"""RoPE in PyTorch, rotate-half convention (HF LLaMA): x [B, S, H, D], pos int64 [S].

    y1 = x1·cos(a) − x2·sin(a),   y2 = x2·cos(a) + x1·sin(a),   a[s, k] = pos[s]·theta^(−2k/D)

The angle table is computed in float64 and rounded once to fp32: an fp32 product pos·f_k would
carry an absolute angle error of pos·2^-24 (5e-4 rad at pos 8192), far above the rounding of the
result. The rotation itself runs in fp32 and rounds once to x's dtype.

Backward: the map is a rotation per pair, so dx = R(−a)·dy — the same kernel with sin negated
(exactly: negation is exact in floating point).
"""

from __future__ import annotations

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["rope", "rope_grouped_and_per_head"]


def check_args(x, pos, theta, out=None, dtypes: tuple = CHECKED):
    """Shape/dtype rules shared by the torch and Triton backends; raises before any work."""
    if not isinstance(x, torch.Tensor):
        raise TypeError("rope: x must be a tensor")
    require("rope", dtypes, x=x)
    if x.dim() != 4:
        raise ValueError(f"rope: x must be [B, S, H, D], got shape {tuple(x.shape)}")
    if x.shape[-1] == 0:
        raise ValueError("rope: head dim D = 0: no rotation pairs (half = 0)")
    if x.shape[-1] % 2:
        raise ValueError(f"rope: head dim D must be even and > 0, got {x.shape[-1]}")
    if not isinstance(pos, torch.Tensor) or pos.dtype != torch.int64:
        raise TypeError(f"rope: pos must be an int64 tensor, got "
                        f"{pos.dtype if isinstance(pos, torch.Tensor) else type(pos).__name__}")
    if pos.shape != (x.shape[1],):
        raise ValueError(f"rope: pos must have shape [S] = ({x.shape[1]},), got {tuple(pos.shape)}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        raise ValueError(f"rope: theta must be a number > 1, got {theta!r}")
    if out is not None:
        if out.shape != x.shape or out.dtype != x.dtype:
            raise ValueError(f"rope: out must be {tuple(x.shape)} {x.dtype}, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("rope: out= does not support autograd (x requires grad)")


def rope_tables(pos: torch.Tensor, d: int, theta: float, inv_freq_exponent: float = 2.0):
    """(cos, sin), fp32 [S, d/2], from float64 angles pos[s]·theta^(−2k/d).
    `inv_freq_exponent` exists for the wrong-exponent mutant only."""
    k = torch.arange(d // 2, dtype=torch.float64, device=pos.device)
    inv_freq = float(theta) ** (-inv_freq_exponent * k / d)
    a = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(a).float().contiguous(), torch.sin(a).float().contiguous()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """y = [x1·cos − x2·sin, x2·cos + x1·sin] in fp32, rounded once to x's dtype.
    cos/sin are [S, half] and broadcast over batch and heads. Each half is written straight
    into the output (a product, then addcmul_ adds ∓ the other product, each rounded once as
    before): 4 half-size passes into one buffer instead of 6 passes, 6 buffers and a cat."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if torch.compiler.is_compiling():
        # Dynamo cannot trace out= into a strided half view (a graph break), and Inductor
        # fuses the products into one pass anyway: the same roundings, written functionally
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)
    y = torch.empty(xf.shape, dtype=torch.float32, device=x.device)
    y1, y2 = y[..., :half], y[..., half:]
    torch.mul(x1, c, out=y1).addcmul_(x2, s, value=-1.0)
    torch.mul(x2, c, out=y2).addcmul_(x1, s)
    return y.to(x.dtype)


class _RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: `rotate` writes through out=, which
            return _rotate_differentiable(dy, cos, -sin), None, None  # autograd refuses
        return rotate(dy, cos, -sin), None, None  # R(a)ᵀ = R(−a)


def _rotate_differentiable(x, cos, sin):
    """`rotate` as out-of-place autograd ops (the same products and sums, so the same values),
    for a backward that is itself differentiated."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float, out=None) -> torch.Tensor:
    check_args(x, pos, theta, out)
    cos, sin = rope_tables(pos, x.shape[-1], theta)
    y = _RoPEFunction.apply(x, cos, sin)
    return out.copy_(y) if out is not None else y


def rope_grouped_and_per_head(x: torch.Tensor, pos: torch.Tensor, theta: float):
    """(all heads at once, one head at a time): rope-kernel-v1 requires these to be bit-equal."""
    check_args(x, pos, theta)
    cos, sin = rope_tables(pos, x.shape[-1], theta)
    with torch.no_grad():
        grouped = rotate(x, cos, sin)
        per_head = torch.cat([rotate(x[:, :, h:h + 1], cos, sin) for h in range(x.shape[2])],
                             dim=2)
    return grouped, per_head
