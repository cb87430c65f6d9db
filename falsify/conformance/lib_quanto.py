"""optimum-quanto 0.2.7 (PyPI `optimum-quanto`): its int8 weight quantizer against
quantize-kernel-v1.

Bound: `qint8` weights per output channel, as `quantize(model, weights=qint8)` quantizes a
Linear weight: `AbsmaxOptimizer()(w, qint8, axis=0)` (scale = max|w| / 127 per row) and
`quantize_weight(w, qint8, axis=0, scale)` (`torch.ops.quanto.quantize_symmetric`:
clamp(round(w / scale), −128, 127), round half to even), kernel-agnostic (`optimized=False`);
the codes are the tensor's int8 `_data`, the scale its `_scale` [o, 1] viewed as [o];
`WeightQBytesTensor.dequantize()` is the round trip.

Not bound: quanto's 4-bit weights (`qint4`/`quint4`) are asymmetric only (`MaxOptimizer`: scale
(max − min)/15 and a shift −min over the group's own [min, max], not extended to contain 0; a
float shift, or an integer one with `zeropoint=True`), with no symmetric 4-bit quantizer, so
int4_groupwise, whose cases draw `symmetric` true and false, has no counterpart.
"""

from __future__ import annotations

from falsify.conformance.registry import Binding, Finding, Library


def _qint8(w):
    from optimum.quanto import qint8
    from optimum.quanto.tensor.optimizers import AbsmaxOptimizer
    from optimum.quanto.tensor.weights import quantize_weight

    scale = AbsmaxOptimizer()(w, qint8, axis=0)
    return quantize_weight(w, qint8, axis=0, scale=scale, optimized=False)


def int8_per_channel(w):
    """(q int8 [o, i], scale [o]) in quanto's storage: the scale in w's dtype."""
    t = _qint8(w)
    return t._data, t._scale.reshape(-1)


def int8_roundtrip(w):
    """WeightQBytesTensor.dequantize(): q · scale in w's dtype."""
    return _qint8(w).dequantize()


_M = "falsify.conformance.lib_quanto"

_FP16 = (
    "for fp16 weights quanto keeps the scale in the weight's dtype (SymmetricOptimizer "
    "asserts scale.dtype == base.dtype: max|w| / 127 rounded to fp16) and quantize_symmetric "
    "divides and rounds in fp16 (round(base / scale)): a one-element row (example [o 1, "
    "i 1]) gives scale 0.0066680908 where the contract's fl32(max|w|/127) is 0.0066667693; "
    "[o 4, i 128]: the "
    "fp16 quotient w/scale rounds to a code more than half a step from the float64 w/s at "
    "11 elements, first (0, 32), and the dequantized values (fp16 q·scale) move by up to "
    "0.0322.")

LIBRARY = Library(
    name="quanto",
    distribution="optimum-quanto",
    bindings=(
        Binding(
            name="qint8 weights (absmax, axis 0)",
            contract="quantize-kernel-v1",
            binds={"int8_per_channel": f"{_M}:int8_per_channel",
                   "int8_roundtrip": f"{_M}:int8_roundtrip"},
            # verified: int8 codes, and the scale / the result in that dtype
            dtypes=("float64", "bfloat16"),
            not_claimed={c: (
                "quanto's weights are a torch.Tensor subclass (WeightQBytesTensor) built with "
                "_make_wrapper_subclass, which Dynamo does not trace (6 graph breaks): quanto "
                "quantizes once at load time, outside compiled code")
                for c in ("FALSIFY-QNT-040", "FALSIFY-QNT-042")} | {c: (
                "an int64 weight is refused, but by a bare `assert scale.dtype == base.dtype` in "
                "AbsmaxOptimizer.__call__ (optimizers/symmetric_optimizer.py: the absmax scale "
                "of an integer tensor is float), an AssertionError with no message, not an "
                "error naming the dtype before any work; quanto validates no dtype")
                for c in ("FALSIFY-QNT-028", "FALSIFY-QNT-030")},
            findings={
                **{c: Finding(kind="variant", variant="scale stored in the weight's dtype",
                              evidence=_FP16)
                   for c in ("FALSIFY-QNT-001/float16", "FALSIFY-QNT-003/float16",
                             "FALSIFY-QNT-005/float16", "FALSIFY-QNT-011/float16",
                             "FALSIFY-QNT-013/float16")},
                **{c: Finding(kind="deviation", repro="quanto_qint8_no_columns.py", evidence=(
                    "i = 0 (a weight of no columns) crashes in AbsmaxOptimizer: torch.amax "
                    "over an empty dim raises IndexError (amax(): Expected reduction dim 1 "
                    "to have non-zero size) where the contract returns [o, 0] codes and a "
                    "zero scale; o = 0 and the transposed, stepped and expanded views pass "
                    "by hand"))
                   for c in ("FALSIFY-QNT-036", "FALSIFY-QNT-038")},
            },
        ),
    ),
)
