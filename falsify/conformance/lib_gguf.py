"""gguf 0.19.0 (llama.cpp's gguf-py, PyPI `gguf`): its numpy (de)quantizers against
gguf-quants-kernel-v1.

Bound, one binding each: `gguf.quants.dequantize(data, GGMLQuantizationType.{Q8_0, Q4_K,
Q6_K})` (the per-type classes `Q8_0` / `Q4_K` / `Q6_K`' `dequantize_blocks`, run over groups
of 16 rows) and `gguf.quants.quantize(data, GGMLQuantizationType.Q8_0)`
(`Q8_0.quantize_blocks`, ggml's `quantize_row_q8_0_ref` in numpy). gguf implements no
k-quant quantizer that the contract covers (the contract leaves ggml's iterative k-quant
scale search out) and no fused dequantize-matmul, so `dequant_matmul` is not bound.

gguf is numpy on the CPU: the adapters hand it the tensor's own memory (`Tensor.numpy()`, a
view, strides kept, dtype kept) and wrap its array back (`torch.from_numpy`, no copy). That is
a container mapping, not a conversion: whatever gguf does with the dtype it is given (its
`quantize_rows` casts any input to float32 with `astype(np.float32)`) is gguf's own policy and
is what the contract sees.
"""

from __future__ import annotations

import torch

from falsify.conformance.registry import Binding, Finding, Library, into

_into = into  # the shared out= helper (registry.into)


def _qt(name: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


def _np(t: torch.Tensor):
    """The tensor's own memory as a numpy array (a view: strides and dtype kept). numpy has no
    bfloat16, so such a tensor cannot reach gguf at all: say so instead of torch's
    'unsupported ScalarType BFloat16' from inside the conversion."""
    if t.dtype == torch.bfloat16:
        raise TypeError("gguf is numpy, which has no bfloat16: a bfloat16 tensor cannot be "
                        "handed to it")
    return t.numpy()


def _dequantize(blocks, out, qtype: str):
    from gguf import quants

    y = quants.dequantize(_np(blocks), _qt(qtype))
    return _into(out, torch.from_numpy(y))


def q8_0_dequantize(blocks, out=None):
    """gguf.quants.dequantize(bytes, Q8_0): y = fp16(d)·int8(q) in float32."""
    return _dequantize(blocks, out, "Q8_0")


def q4_k_dequantize(blocks, out=None):
    """gguf.quants.dequantize(bytes, Q4_K): (d·sc)·q − dmin·m, Q4_K.get_scale_min's unpacking."""
    return _dequantize(blocks, out, "Q4_K")


def q6_k_dequantize(blocks, out=None):
    """gguf.quants.dequantize(bytes, Q6_K): (d·sc)·(q − 32)."""
    return _dequantize(blocks, out, "Q6_K")


def q8_0_quantize(x, out=None):
    """gguf.quants.quantize(x, Q8_0): ggml's block_q8_0 bytes, [m, 34·nb] uint8."""
    from gguf import quants

    q = quants.quantize(_np(x), _qt("Q8_0"))
    return _into(out, torch.from_numpy(q))


_M = "falsify.conformance.lib_gguf"

_CPU_ONLY = ("gguf is numpy: it runs on the CPU only (a CUDA tensor has no numpy view), so it "
             "makes no GPU promise to compare with its CPU result")

# _apply_over_grouped_rows (gguf/quants.py) starts with arr.reshape((-1, arr.shape[-1])): with
# a row of 0 bytes, -1 is ambiguous and numpy raises; Q4_K/Q6_K.dequantize_blocks reshape to
# (n_blocks, -1, ...), ambiguous again when there are no rows (n_blocks = 0).
_NB0 = ("ValueError 'cannot reshape array of size 0 into shape (0)' from numpy, raised by "
        "_apply_over_grouped_rows (gguf/quants.py) at rows = arr.reshape((-1, arr.shape[-1])), "
        "where arr.shape[-1] = 0 makes -1 ambiguous")


def _m0(qtype: str, line: str) -> str:
    return (f"m = 0 ({qtype} blocks [0, nb·bytes]): gguf raises numpy's ValueError {line} in "
            f"{qtype}.dequantize_blocks (gguf/quants.py), a reshape to (n_blocks, -1, ...) with "
            "n_blocks = 0, where the contract's rule (GQ-LAY-001) and ggml decode it to an "
            "empty [0, 256·nb] float32 result; nb = 0 fails as for q8_0: " + _NB0)


_GQ_017 = Finding(
    kind="deviation",
    repro="gguf_zero_blocks_per_row.py",
    evidence=("nb = 0 (q8_0 blocks [m, 0]): the contract's rule is an empty [m, 0] float32 "
              "result (the reference's); gguf raises " + _NB0 + ". m = 0 passes (an empty "
              "[0, 32·nb] result)"))
_GQ_018 = Finding(
    kind="deviation",
    repro="gguf_kquants_zero_rows.py",
    evidence=_m0("Q4_K", "'cannot reshape array of size 0 into shape (0,newaxis,1)' at d = "
                         "(d * sc).reshape((n_blocks, -1, 1))"))
_GQ_019 = Finding(
    kind="deviation",
    repro="gguf_kquants_zero_rows.py",
    evidence=_m0("Q6_K", "'cannot reshape array of size 0 into shape (0,newaxis,1,64)' at "
                         "ql.reshape((n_blocks, -1, 1, 64))"))
_GQ_020 = Finding(
    kind="deviation",
    repro="gguf_zero_blocks_per_row.py",
    evidence=("nb = 0 (x [m, 0] float32): the contract's rule is an empty [m, 0] uint8 result; "
              "gguf.quants.quantize raises " + _NB0 + " (Q8_0.__quantize_array). m = 0 passes"))

# One binding per format and direction: each is its own code in gguf (Q8_0, Q4_K, Q6_K's
# dequantize_blocks; Q8_0.quantize_blocks), each an equation of the contract. They bind
# disjoint equations, so they share one pytest session.
LIBRARY = Library(
    name="gguf",
    distribution="gguf",
    bindings=(
        Binding(name="quants.dequantize(Q8_0)", contract="gguf-quants-kernel-v1",
                binds={"q8_0_dequantize": f"{_M}:q8_0_dequantize"},
                not_claimed={"FALSIFY-GQ-013": _CPU_ONLY},
                findings={"FALSIFY-GQ-017": _GQ_017}),
        Binding(name="quants.dequantize(Q4_K)", contract="gguf-quants-kernel-v1",
                binds={"q4_k_dequantize": f"{_M}:q4_k_dequantize"},
                not_claimed={"FALSIFY-GQ-014": _CPU_ONLY},
                findings={"FALSIFY-GQ-018": _GQ_018}),
        Binding(name="quants.dequantize(Q6_K)", contract="gguf-quants-kernel-v1",
                binds={"q6_k_dequantize": f"{_M}:q6_k_dequantize"},
                not_claimed={"FALSIFY-GQ-015": _CPU_ONLY},
                findings={"FALSIFY-GQ-019": _GQ_019}),
        Binding(name="quants.quantize(Q8_0)", contract="gguf-quants-kernel-v1",
                binds={"q8_0_quantize": f"{_M}:q8_0_quantize"},
                # Q8_0.quantize_rows casts any input with rows.astype(np.float32, copy=False) and
                # quantizes that: float64 (rounded to fp32 first), float16 and integer arrays
                # all give uint8 block_q8_0 bytes, the bytes of the float32 cast
                dtypes=("float64", "float16", "int64", "int32"),
                not_claimed={"FALSIFY-GQ-016": _CPU_ONLY},
                findings={"FALSIFY-GQ-020": _GQ_020}),
    ),
)
