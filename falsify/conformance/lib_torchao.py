"""torchao 0.18.0 (PyPI `torchao`): its affine quantization primitives against
quantize-kernel-v1, and its NF4 tensor against nf4-kernel-v1.

Bound (quantize-kernel-v1): `torchao.quantization.quant_primitives.choose_qparams_affine`,
`quantize_affine` and `dequantize_affine` with an integer zero point, `scale_dtype=float32`
(the contract's stored scale) and

- int8 per output channel: `MappingType.SYMMETRIC`, block_size (1, i), range [−127, 127];
- int4 per group of `group` columns: block_size (1, group); symmetric with range [−7, 7], for
  which torchao's scale max|w| / ((qmax − qmin)/2) is the contract's max|w| / 7 (its default
  int4 range [−8, 7] gives max|w| / 7.5, another format); asymmetric with range [0, 15]
  (torchao's min(min, 0), max(max, 0) range and its zero point quant_min − round(min/s) are the
  contract's). The codes come back as torchao's int8 tensor and the zero points as its int32
  tensor (the contract's float32 integers compare as equal numbers); the scale of int8 is
  torchao's [o, 1], viewed as [o].

Bound (nf4-kernel-v1): `torchao.quantization.quantize_.workflows.nf4.nf4_tensor.to_nf4`
(`NF4Tensor.from_tensor`) followed by `NF4Tensor.get_original_weight()`, for `nf4_roundtrip`
only. NF4Tensor always double-quantizes its block scalers (int8, linear, `scaler_block_size`
256, a mean offset) and stores no plain absmax, so neither `nf4_quantize` nor
`nf4_dequantize` has a counterpart with the contract's buffers; the round trip is the value a
frozen NF4Tensor weight stands for, with or without the contract's `double_quant`.
"""

from __future__ import annotations

import torch

from falsify.conformance.registry import Binding, Finding, Library


def _qp():
    from torchao.quantization import quant_primitives

    return quant_primitives


def _affine(w, block, symmetric, qmin, qmax):
    """(q int8, scale float32, zero int32) from choose_qparams_affine + quantize_affine."""
    qp = _qp()
    mapping = qp.MappingType.SYMMETRIC if symmetric else qp.MappingType.ASYMMETRIC
    scale, zero = qp.choose_qparams_affine(w, mapping, block, torch.int8, qmin, qmax,
                                           scale_dtype=torch.float32,
                                           zero_point_dtype=torch.int32)
    q = qp.quantize_affine(w, block, scale, zero, torch.int8, qmin, qmax)
    return q, scale, zero


def _int4_range(symmetric):
    return (-7, 7) if symmetric else (0, 15)


def int8_per_channel(w):
    """SYMMETRIC, block (1, i), [−127, 127]: (q [o, i], scale [o])."""
    q, scale, _ = _affine(w, (1, w.shape[1]), True, -127, 127)
    return q, scale.reshape(-1)


def int4_groupwise(w, group, symmetric):
    """block (1, group): SYMMETRIC [−7, 7] or ASYMMETRIC [0, 15]: (q, scale, zero), scale and
    zero [o, i / group]."""
    q, scale, zero = _affine(w, (1, group), symmetric, *_int4_range(symmetric))
    return q, scale.reshape(w.shape[0], -1), zero.reshape(w.shape[0], -1)


def int8_roundtrip(w):
    """dequantize_affine(quantize_affine(w)) in w's dtype."""
    block = (1, w.shape[1])
    q, scale, zero = _affine(w, block, True, -127, 127)
    return _qp().dequantize_affine(q, block, scale, zero, torch.int8, -127, 127,
                                   output_dtype=w.dtype)


def int4_roundtrip(w, group, symmetric):
    block = (1, group)
    lo, hi = _int4_range(symmetric)
    q, scale, zero = _affine(w, block, symmetric, lo, hi)
    return _qp().dequantize_affine(q, block, scale, zero, torch.int8, lo, hi,
                                   output_dtype=w.dtype)


def nf4_roundtrip(w, blocksize=64, double_quant=False):
    """to_nf4(w, blocksize, 256).get_original_weight(): NF4Tensor's only format (double
    quantized scalers) whatever `double_quant` asks."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    return to_nf4(w, blocksize, 256).get_original_weight()


_M = "falsify.conformance.lib_torchao"

_ONE_COLUMN = (
    "torchao cannot quantize a weight of one column: block_size (1, 1) (i = 1, per channel, "
    "or a group of 1) leaves _get_reduction_params no reduction dim, torch.amin/amax over "
    "dim=[] reduce the whole tensor, choose_qparams_affine returns one scale, and "
    "_quantize_affine_no_dtype_cast's scale.view([o, 1]) raises RuntimeError: shape '[2, 1]' "
    "is invalid for input of size 1 (w [2, 1]; the batch-invariance checks build [7, 1]).")
_FP16 = (
    "for fp16 weights choose_qparams_affine computes the statistics in the input dtype "
    "(max|w| / 127, or (max − min) / 15, rounded to fp16; scale_dtype only casts the result "
    "to float32) and quantize_affine forms w·(1/scale) from it: a one-element row "
    "(example [o 1, i 1]) gives scale 0.0066680908 where the contract's fl32(max|w|/127) "
    "is 0.0066667693; "
    "[o 1, g 1, group 2] gives 0.48779297 for 0.48772320; the codes and dequantized values "
    "follow that scale.")
_ASYM = (
    "the asymmetric scale is (max_val_pos − min_val_neg) / 15 with the subtraction and the "
    "division each rounded to float32 (_choose_qparams_affine), where the contract rounds "
    "the float64 quotient once: [o 3, g 5, group 4] scale 0.38117439 for 0.38117436 (one "
    "float32 ulp), and the dequantized values move with it (1.48458588 for 1.48458600).")
_COMPILE16 = (
    "torch.compile's Inductor computes the fp16 statistics in float32 (fp16 arithmetic "
    "upcast), eager torchao rounds them to fp16 (see FALSIFY-QNT-001/float16): compiled "
    "scale 0.0066667693 vs eager 0.0066680908 for the one-element row of FALSIFY-QNT-040, "
    "and the codes and dequantized values follow.")
_EMPTY_O = (
    "o = 0: quantize_affine drops a zero point of no elements (`zero_point.numel() > 0` "
    "else None) and then adds None: TypeError: unsupported operand type(s) for +: 'Tensor' "
    "and 'NoneType'; i = 0: torch.amin over an empty dim raises IndexError.")
_NF4_SHAPES = (
    "NF4Tensor.from_tensor takes only weights whose element count is a multiple of "
    "block_size · scaler_block_size (asserts in from_tensor and double_quantize_scalers: "
    "'Number of scalers must be divisible by scaler block size, got 16 scaler_block_size "
    "256'), no tail block and no weight below 16384 elements at blocksize 64: [m 1, n 5, "
    "bs 64] and the other small examples raise AssertionError. The [256, 256] Gaussian "
    "weights of the statistical check quantize, and pass.")


def _f(evidence, kind="deviation", variant=None, repro=None):
    return Finding(kind=kind, evidence=evidence, variant=variant, repro=repro)


_AFFINE_FINDINGS = {
    **{c: _f(_ONE_COLUMN, repro="torchao_affine_one_column.py") for c in (
        "FALSIFY-QNT-003/float32", "FALSIFY-QNT-005", "FALSIFY-QNT-007", "FALSIFY-QNT-009",
        "FALSIFY-QNT-011", "FALSIFY-QNT-013", "FALSIFY-QNT-015", "FALSIFY-QNT-019",
        "FALSIFY-QNT-020", "FALSIFY-QNT-022", "FALSIFY-QNT-024", "FALSIFY-QNT-026")},
    "FALSIFY-QNT-001/float32": _f(
        "choose_qparams_affine clamps the scale to eps = finfo(float32).smallest_normal: an "
        "all-zero row gets scale 1.1754944e-38 where the contract's is 0 (codes 0 in both).",
        kind="variant", variant="scale clamped to the dtype's smallest normal"),
    **{c: _f(_FP16, repro="torchao_affine_fp16_qparams.py")
       for c in ("FALSIFY-QNT-001/float16", "FALSIFY-QNT-002/float16",
                              "FALSIFY-QNT-003/float16", "FALSIFY-QNT-004/float16",
                              "FALSIFY-QNT-014/float16")},
    "FALSIFY-QNT-002/float32": _f(_ASYM, repro="torchao_affine_asymmetric_scale_rounding.py"),
    "FALSIFY-QNT-004/float32": _f(_ASYM, repro="torchao_affine_asymmetric_scale_rounding.py"),
    **{c: _f(_COMPILE16, repro="torchao_affine_fp16_qparams.py")
       for c in ("FALSIFY-QNT-040/float16", "FALSIFY-QNT-041/float16",
                                   "FALSIFY-QNT-042/float16", "FALSIFY-QNT-043/float16")},
    "FALSIFY-QNT-036": _f(_EMPTY_O + " " + _ONE_COLUMN, repro="torchao_affine_empty_weight.py"),
    "FALSIFY-QNT-037": _f(_EMPTY_O, repro="torchao_affine_empty_weight.py"),
    "FALSIFY-QNT-038": _f(_EMPTY_O + " " + _ONE_COLUMN, repro="torchao_affine_empty_weight.py"),
    "FALSIFY-QNT-039": _f(_EMPTY_O, repro="torchao_affine_empty_weight.py"),
}
_F64 = ("torchao refuses float64 before any work, but with AssertionError('Unsupported input "
        "dtype: torch.float64') from _quantize_affine_no_dtype_cast (an assert, not a "
        "TypeError/ValueError)")

LIBRARY = Library(
    name="torchao",
    distribution="torchao",
    bindings=(
        Binding(
            name="quant_primitives (affine)",
            contract="quantize-kernel-v1",
            binds={"int8_per_channel": f"{_M}:int8_per_channel",
                   "int4_groupwise": f"{_M}:int4_groupwise",
                   "int8_roundtrip": f"{_M}:int8_roundtrip",
                   "int4_roundtrip": f"{_M}:int4_roundtrip"},
            not_claimed={c: _F64 for c in ("FALSIFY-QNT-028", "FALSIFY-QNT-029",
                                           "FALSIFY-QNT-030", "FALSIFY-QNT-031")},
            findings=_AFFINE_FINDINGS,
        ),
        Binding(
            name="NF4Tensor",
            contract="nf4-kernel-v1",
            binds={"nf4_roundtrip": f"{_M}:nf4_roundtrip"},
            not_claimed={"FALSIFY-NF4-022": (
                "NF4Tensor validates no dtype; its shape asserts fire first on the probe "
                "(AssertionError: 'Number of scalers must be divisible by scaler block "
                "size')")},
            findings={"FALSIFY-NF4-006": _f(_NF4_SHAPES, repro="torchao_nf4_small_weight.py"),
                      "FALSIFY-NF4-011": _f(_NF4_SHAPES, repro="torchao_nf4_small_weight.py")},
        ),
    ),
)
