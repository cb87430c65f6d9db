"""QLoRA linear layer (pure numpy, float64): a LoRA layer whose frozen base weight is stored in
NF4 and dequantized for use.

    W̃ = nf4_dequantize(packed, absmax, shape, blocksize[, absmax2, offset])   (reference.nf4)
    y  = x·W̃ᵀ + s·(x·Aᵀ)·Bᵀ                                                  (reference.lora)

Everything about the layer is the LoRA layer on W̃ (same backward formulas with W = W̃); the NF4
state (packed bytes, absmax, and with double quantization qabsmax / absmax2 / offset) is a
constant: it receives no gradient and an optimizer step leaves it bit-identical.
"""

from falsify.reference.lora import lora_linear, lora_linear_backward
from falsify.reference.nf4 import empty_weight, nf4_dequantize


def dequantized_base(packed, absmax, shape, blocksize, absmax2=None, offset=None):
    return nf4_dequantize(packed, absmax, shape, blocksize, absmax2=absmax2, offset=offset)


def qlora_linear(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                 absmax2=None, offset=None):
    if len(tuple(shape)) == 2 and 0 in tuple(int(s) for s in shape):
        raise empty_weight("qlora_linear", shape, ("o", "i"))
    w = dequantized_base(packed, absmax, shape, blocksize, absmax2, offset)
    return lora_linear(x, w, a, b, alpha, r, rslora)


def qlora_linear_backward(x, packed, absmax, shape, blocksize, a, b, alpha, r, rslora=False,
                          absmax2=None, offset=None, dy=None):
    """{x, a, b} gradients: lora_linear_backward with W = W̃ (the base path of dx goes
    through the dequantized weight; the NF4 state has no gradient)."""
    w = dequantized_base(packed, absmax, shape, blocksize, absmax2, offset)
    return lora_linear_backward(x, w, a, b, alpha, r, rslora, dy=dy)
