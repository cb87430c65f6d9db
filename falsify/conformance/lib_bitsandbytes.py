"""bitsandbytes 0.50.2 (PyPI `bitsandbytes`): its NF4 4-bit quantizer against nf4-kernel-v1.

Bound: `bitsandbytes.functional.quantize_4bit(quant_type="nf4")` for `nf4_quantize`, with
`compress_statistics` as the contract's `double_quant`; `dequantize_4bit(quant_type="nf4")`
for `nf4_dequantize`, from a `QuantState` assembled from the contract's buffers; the two in a
row for `nf4_roundtrip`. Both run on the CPU here: the native CPU library where it has a kernel
(the double quantization's 8-bit `quantize_blockwise` / `dequantize_blockwise`, `dequantize_4bit`
for even last dims and blocksizes < 2048), bitsandbytes' pure-torch default backend otherwise
(`quantize_4bit`; `dequantize_4bit`'s fallback).

Layouts: bitsandbytes stores the packed bytes as a [⌈n/2⌉, 1] column and the double
quantization's offset as a 0-d tensor; the contract has a flat [⌈n/2⌉] and a [1]. The adapters
reshape (views, no copy). Its CPU dequantize returns a 1-D shape (n,) as
[1, n]. The nested state's second level uses bitsandbytes' own 8-bit dynamic
map (`create_dynamic_map()`, blocksize 256), as `quantize_4bit` builds it.
"""

from __future__ import annotations

import torch

from falsify.conformance.registry import Binding, Finding, Library


def nf4_quantize(w, blocksize=64, double_quant=False, out=None):
    """quantize_4bit(w, blocksize, compress_statistics=double_quant, quant_type="nf4"):
    (packed, absmax), or (packed, qabsmax, absmax2, offset) with double quantization."""
    import bitsandbytes.functional as F

    packed, st = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=bool(double_quant),
                                 quant_type="nf4",
                                 out=None if out is None else out.view(-1, 1))
    packed = out if out is not None else packed.reshape(-1)
    if not double_quant:
        return packed, st.absmax
    return packed, st.absmax, st.state2.absmax, st.offset.reshape(1)


def nf4_dequantize(packed, absmax, shape, blocksize=64, absmax2=None, offset=None, dtype=None,
                   out=None):
    """dequantize_4bit(packed, QuantState(...), quant_type="nf4") in `dtype` (default: `out`'s,
    else float32, as the contract's)."""
    import bitsandbytes.functional as F

    dt = dtype if dtype is not None else (out.dtype if out is not None else torch.float32)
    if isinstance(dt, str):
        dt = getattr(torch, dt)
    state2 = None
    if absmax2 is not None or offset is not None:
        state2 = F.QuantState(absmax=absmax2, code=F.create_dynamic_map().to(packed.device),
                              blocksize=256, dtype=torch.float32)
    st = F.QuantState(absmax=absmax, shape=torch.Size(shape), blocksize=blocksize,
                      quant_type="nf4", dtype=dt, offset=offset, state2=state2,
                      code=F.get_4bit_type("nf4", device=packed.device))
    return F.dequantize_4bit(packed.reshape(-1, 1), st, out=out, quant_type="nf4")


def nf4_roundtrip(w, blocksize=64, double_quant=False):
    """dequantize_4bit(*quantize_4bit(w)): bitsandbytes' own state, in w's dtype."""
    import bitsandbytes.functional as F

    packed, st = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=bool(double_quant),
                                 quant_type="nf4")
    return F.dequantize_4bit(packed, st, quant_type="nf4")


_M = "falsify.conformance.lib_bitsandbytes"

_TAIL_FLOOR = (
    "bitsandbytes stores the 1e-38 floor as the absmax of an all-zero tail block: its "
    "default backend's quantize_4bit (backends/default/ops.py) keeps the full blocks' "
    "absmax unclamped and clamps only their reciprocal, but for the tail block it stores "
    "`am = A_flat[full:].abs().max().clamp(min=1e-38)` itself. w = [[0.0]] at blocksize 32 "
    "(one tail block) gives absmax 9.99999935e-39 where the contract's a_b = max|x| = 0; a "
    "zero full block gives 0. The packed codes (0x77) and the decoded zeros agree.")
_ROW_T = (
    "dequantize_4bit transposes its result when the packed tensor has one row "
    "(functional.py: `if A.shape[0] == 1: return out.t()`, a shim for callers passing the "
    "packed weight as [1, (N·K+1)//2]); bitsandbytes' own layout is [⌈n/2⌉, 1], so any "
    "weight of n ≤ 2 elements, one packed byte, comes back transposed: shape (1, 2) decodes "
    "to a (2, 1) tensor (the values are right).")
_EMPTY = {"m": "empty", "n": "empty"}  # verified: size-0 results of the right shapes
_BF16 = ("bfloat16",)  # quantize_4bit / dequantize_4bit document and compute bf16

LIBRARY = Library(
    name="bitsandbytes",
    distribution="bitsandbytes",
    bindings=(
        Binding(
            name="functional.quantize_4bit(nf4)",
            contract="nf4-kernel-v1",
            binds={"nf4_quantize": f"{_M}:nf4_quantize"},
            dtypes=_BF16,
            zero_size=_EMPTY,
            findings={
                "FALSIFY-NF4-003": Finding(kind="deviation", evidence=_TAIL_FLOOR,
                                           repro="bitsandbytes_nf4_tail_block_absmax_floor.py"),
                "FALSIFY-NF4-008": Finding(
                    kind="deviation",
                    repro="bitsandbytes_nf4_double_quant_codes.py",
                    evidence=(
                        "compress_statistics quantizes absmax − offset with the native CPU "
                        "quantize_blockwise (cquantize_blockwise_cpu_fp32), which does not "
                        "pick the nearest 8-bit code everywhere (one code off, measured in "
                        "tests/test_nf4_impl.py) and writes code 0 for a 256-block whose "
                        "absmax2 = 0: [m 1, n 5, bs 64] (one NF4 block, absmax = offset) "
                        "gives qabsmax 0 where the contract's nearest code is 127 (the zero "
                        "code); with absmax2 = 0 both decode to the offset.")),
                "FALSIFY-NF4-009": Finding(
                    kind="deviation",
                    repro="bitsandbytes_nf4_double_quant_offset.py",
                    evidence=(
                        "the offset is `_absmax.mean()`, a float32 reduction, not the exact "
                        "mean rounded once; absmax2 = max|absmax − offset| moves with it: "
                        "got absmax2 1.0070166588 where the contract's is 1.0070161819 "
                        "(4 fp32 ulps; the mean itself differs by ≤ 2 fp32 steps in "
                        "tests/test_nf4_impl.py). For a single all-zero tail block the "
                        "offset is the stored 1e-38 floor (see FALSIFY-NF4-003): " +
                        _TAIL_FLOOR)),
            },
        ),
        Binding(
            name="functional.dequantize_4bit(nf4)",
            contract="nf4-kernel-v1",
            binds={"nf4_dequantize": f"{_M}:nf4_dequantize"},
            dtypes=_BF16,
            zero_size=_EMPTY,
            findings={
                "FALSIFY-NF4-010": Finding(
                    kind="deviation", evidence=_ROW_T,
                    repro="bitsandbytes_dequantize_4bit_single_row_transpose.py"),
                "FALSIFY-NF4-004/float32": Finding(
                    kind="deviation", repro="bitsandbytes_dequantize_4bit_tail_block_absmax.py",
                    evidence=(
                        "a 2-D weight's partial tail block is scaled by absmax[0]: found with "
                        "fresh seeds (FALSIFY_SEED=215562980), [3, 64] at blocksize 128, "
                        "absmax [63.70, 26.98], codes 0: elements 128 … 191 (row 2) got "
                        "-63.696167 where code·absmax[1] = -26.978672 (64 of 192 off, bound one "
                        "fp32 rounding). [192] and [1, 192] decode right, as does any shape the "
                        "blocksize divides; [2, 96] at 128 and [3, 128] at 256 fail the same "
                        "way.")),
                "FALSIFY-NF4-026": Finding(
                    kind="deviation", repro="bitsandbytes_dequantize_4bit_zero_columns.py",
                    evidence=(
                        "n = 0 (a [m, 0] weight) decodes to the empty [m, 0] at blocksizes "
                        "below 2048 (the native CPU kernel) but raises RuntimeError \"cannot "
                        "reshape tensor of 0 elements into shape [-1, 0]\" at 2048 and above "
                        "(the pure-torch fallback); found with fresh seeds (FALSIFY_SEED="
                        "215562980: m = 7, blocksize 4096). The ci profile's examples draw a "
                        "small blocksize.")),
            },
        ),
        Binding(
            name="quantize_4bit → dequantize_4bit",
            contract="nf4-kernel-v1",
            binds={"nf4_roundtrip": f"{_M}:nf4_roundtrip"},
            dtypes=_BF16,
            findings={
                "FALSIFY-NF4-006/float16": Finding(
                    kind="deviation",
                    repro="bitsandbytes_dequantize_4bit_single_row_transpose.py",
                    evidence=_ROW_T + (
                    " Here [m 1, n 2, bs 32]: the (2, 1) result does not broadcast against "
                    "the (1, 2) weight in the bound's predicate.")),
                "FALSIFY-NF4-011": Finding(
                    kind="deviation",
                    repro="bitsandbytes_dequantize_4bit_single_row_transpose.py",
                    evidence=_ROW_T + (
                    " Hypothesis drew weights of two elements; the contract's examples "
                    "[3, 3001] bs 32, [4, 4096] bs 64, [1, 5] bs 64 are within the bound.")),
            },
        ),
    ),
)
