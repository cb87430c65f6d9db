"""RoPE mutants: the bugs the rope contract's checks must catch (same signatures as the
bindings they replace)."""

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch

from falsify.kernels.torch import rope as rope_torch
from falsify.kernels.triton import rope as rope_triton


def sin_sign_flipped(x, pos, theta, out=None):
    """y = x·cos − rotate_half(x)·sin: rotates by −a (the inverse rotation). Norms and relative
    positions survive; only parity with the reference sees it."""
    rope_torch.check_args(x, pos, theta, out)
    cos, sin = rope_torch.rope_tables(pos, x.shape[-1], theta)
    y = rope_torch.rotate(x, cos, -sin)
    return out.copy_(y) if out is not None else y


def triton_wrong_frequency_exponent(x, pos, theta, out=None):
    """f_k = theta^(−k/D) instead of theta^(−2k/D) (the factor 2 of the pair index dropped),
    then the real Triton kernel."""
    rope_triton.check_args(x, pos, theta, out)
    cos, sin = rope_torch.rope_tables(pos, x.shape[-1], theta, inv_freq_exponent=1.0)
    if out is not None:
        return rope_triton.launch(x, cos, sin, out=out)
    return rope_triton.RoPETriton.apply(x, cos, sin)


class _BackwardNotInverted(torch.autograd.Function):
    """Backward reuses the forward rotation R(a) instead of its transpose R(−a)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return rope_torch.rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return rope_torch.rotate(dy, cos, sin), None, None


def backward_not_inverted(x, pos, theta, out=None):
    rope_torch.check_args(x, pos, theta, out)
    cos, sin = rope_torch.rope_tables(pos, x.shape[-1], theta)
    y = _BackwardNotInverted.apply(x, cos, sin)
    return out.copy_(y) if out is not None else y


def triton_grouped_tables_in_activation_dtype(x, pos, theta):
    """The grouped launch reads a cos/sin cache stored in the activation dtype (as HF caches
    it) while the per-head launch uses the fp32 table: equal in fp32, not bit-equal in fp16."""
    rope_triton.check_args(x, pos, theta)
    cos, sin = rope_torch.rope_tables(pos, x.shape[-1], theta)
    with torch.no_grad():
        grouped = rope_triton.launch(x, cos.to(x.dtype).float(), sin.to(x.dtype).float())
        return grouped, rope_triton.launch(x, cos, sin, group=1)
