"""QLoRA linear layer in PyTorch: frozen NF4 base (falsify/kernels/torch/nf4.py) + LoRA
(falsify/kernels/torch/lora.py).

    W̃ = fl32(code[nibble] · absmax) rounded to x's dtype (bitsandbytes dequantizes to the
         compute dtype the same way), then y = x·W̃ᵀ + s·(x·Aᵀ)·Bᵀ with the LoRA autograd
         Function, whose backward is dx = g·W̃ + s·(g·B)·A, dA = s·(g·B)ᵀ·x, dB = s·gᵀ·(x·Aᵀ).

The NF4 state never enters the autograd graph: it is decoded under no_grad and W̃ is a plain
tensor argument for which the Function returns no gradient, so even a quantization state that
someone registered with requires_grad=True gets none, and an optimizer step cannot move it.
"""

from __future__ import annotations

import torch

from falsify.arguments import empty_weight
from falsify.kernels.dtypes import CHECKED
from falsify.kernels.torch import lora as _lora
from falsify.kernels.torch import nf4 as _nf4
from falsify.kernels.torch.lora import lora_scale

__all__ = ["qlora_linear"]


def check_args(x, packed, absmax, shape, blocksize, a, b, r, absmax2, offset,
               dtypes: tuple = CHECKED):
    """Validate the NF4 state against shape/blocksize and the LoRA shapes, before any work."""
    blocksize = _nf4.check_blocksize(blocksize)
    if len(tuple(shape)) == 2 and 0 in tuple(int(s) for s in shape):
        raise empty_weight("qlora_linear", shape, ("o", "i"))
    shape = _nf4.check_shape(shape)
    if len(shape) != 2:
        raise ValueError(f"the base weight shape must be [out, in], got {shape}")
    _nf4.check_state(packed, absmax, shape, blocksize, absmax2, offset)
    probe = torch.empty((), dtype=x.dtype).expand(*shape)  # shape/dtype stand-in for W̃
    out_f, in_f = _lora.check_args(x, probe, a, b, r, dtypes)
    return shape, blocksize, out_f, in_f


def dequantized_base(packed, absmax, shape, blocksize, absmax2, offset, dtype):
    with torch.no_grad():
        return _nf4.nf4_dequantize(packed, absmax, shape, blocksize, absmax2=absmax2,
                                   offset=offset, dtype=dtype)


def qlora_linear(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                 absmax2=None, offset=None, out=None):
    shape, blocksize, out_f, _ = check_args(x, packed, absmax, shape, blocksize, a, b, r,
                                            absmax2, offset)
    s = lora_scale(alpha, r, rslora)
    needs_grad = torch.is_grad_enabled() and any(v.requires_grad for v in (x, a, b))
    _lora.check_out(out, (*x.shape[:-1], out_f), x.dtype, needs_grad)
    w = dequantized_base(packed, absmax, shape, blocksize, absmax2, offset, x.dtype)
    y = _lora._LoraLinear.apply(x, w, a, b, s)
    return y if out is None else out.copy_(y)
