"""NF4 4-bit blockwise quantization in bitsandbytes' format (pure numpy reference).

Compatibility with bitsandbytes (0.50.2, `functional.quantize_4bit(quant_type="nf4")`, CPU),
as tests/test_nf4_impl.py measures it: the packed 4-bit data and the float32 per-block absmax
are bit-identical, with or without double quantization. The double-quantization statistics are
not: they follow bitsandbytes' recipe with nearest rounding, while bitsandbytes reduces the
offset in float32 (at most 2 fp32 steps apart in the tests) and its native CPU blockwise
quantizer does not always pick the nearest 8-bit code (its qabsmax is then the adjacent code;
absmax2 moves with the offset). Half of the tested double-quantized states are bit-identical.

What "compatible" means here, pinned by value (bitsandbytes `functional.get_4bit_type("nf4")`,
`backends/default/ops.py::quantize_4bit`, `functional.quantize_4bit(compress_statistics=True)`):

* the 16-entry NF4 code table `NF4_CODE` below, float32, sorted; code 7 is exactly 0.0;
* flatten the tensor (row-major), round it to float32, cut it into blocks of `blocksize`
  elements; the last block may be shorter (tail block, its own absmax);
* absmax[b] = max |x| over block b (float32, exact);
* scaled = clamp(x * fl32(1 / max(absmax, 1e-38)), -1, 1), in float32 (a reciprocal multiply,
  as bitsandbytes' CUDA kernel and the full blocks of its default backend do; that backend's
  *tail* block divides instead, which can differ by one ulp at a bucket edge);
* nibble = the nearest code, ties to the LOWER code: the number of float32 midpoints
  (code[k] + code[k+1]) / 2 strictly below `scaled` (torch.bucketize(right=False));
* an odd element count is padded with one 0.0 (nibble 7) before packing;
* element 2i goes to the HIGH nibble of byte i, element 2i+1 to the low nibble;
* dequantize: code[nibble] * absmax[i // blocksize].

Double quantization (bitsandbytes `compress_statistics=True`): offset = mean(absmax) (we round the
exact mean to float32; bitsandbytes reduces in float32, which can differ by a step or two),
then the float32 values absmax - offset are quantized with the 8-bit signed dynamic
code `DYNAMIC_CODE` (`functional.create_dynamic_map()`), blocksize 256, by the same absmax /
nearest-midpoint rule. State: (qabsmax uint8 [nb], absmax2 float32 [cdiv(nb, 256)],
offset float32 [1]); decoded absmax[b] = DYNAMIC_CODE[qabsmax[b]] * absmax2[b // 256] + offset.

The reference decides nibbles in float32 on purpose (that is what makes the packed bytes
bit-identical to bitsandbytes); dequantized values are computed exactly in float64. The 8-bit
codes of double quantization are the nearest ones (ties low), which bitsandbytes' CPU path does
not always produce: see the compatibility note above.
"""

import numpy as np

from falsify.arguments import empty_weight

# bitsandbytes' NF4 table (create_normal_map(offset=0.9677083, use_extra_value=True), hard-coded
# there as float32). 7 negative values, an exact 0, 8 positive: the table is asymmetric.
NF4_CODE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=np.float32)
ZERO_CODE = 7  # NF4_CODE[7] == 0.0: what padding and all-zero blocks quantize to

# Decision boundaries, computed in float32 exactly as bitsandbytes does.
NF4_MIDPOINTS = ((NF4_CODE[:-1] + NF4_CODE[1:]) / np.float32(2)).astype(np.float32)

# The positive half of bitsandbytes' 8-bit signed dynamic map (create_dynamic_map(signed=True,
# max_exponent_bits=7, total_bits=8)): for i in 0..6 the means of torch.linspace(0.1, 1, 2^i+1)
# times 10^(i-6), computed by torch in float32, plus 1.0. The negative half mirrors the first
# 127 values; 0 sits in the middle. Copied by value because torch's linspace rounding is not
# reproducible in numpy; tests/test_nf4_impl.py rebuilds it with torch and compares bit for bit.
_DYNAMIC_POSITIVE = np.array([
    5.500000384017767e-07, 3.250000190746505e-06, 7.749999895168003e-06, 2.1249998098937795e-05,
    4.374999844003469e-05, 6.625000241911039e-05, 8.874999912222847e-05, 0.00015625001105945557,
    0.0002687500382307917, 0.0003812500217463821, 0.000493750034365803, 0.0006062500760890543,
    0.0007187500596046448, 0.0008312499849125743, 0.0009437500848434865, 0.001281249918974936,
    0.001843750011175871, 0.002406249986961484, 0.002968749962747097, 0.0035312497057020664,
    0.004093749914318323, 0.0046562496572732925, 0.0052187503315508366, 0.005781250074505806,
    0.006343749817460775, 0.006906250026077032, 0.0074687497690320015, 0.008031249977648258,
    0.008593750186264515, 0.009156249463558197, 0.009718749672174454, 0.011406250298023224,
    0.014218750409781933, 0.017031250521540642, 0.019843751564621925, 0.02265625074505806,
    0.025468749925494194, 0.028281250968575478, 0.031093750149011612, 0.033906251192092896,
    0.03671875223517418, 0.039531249552965164, 0.04234374687075615, 0.04515625163912773,
    0.047968748956918716, 0.05078125, 0.053593751043081284, 0.05640624836087227,
    0.05921875312924385, 0.062031250447034836, 0.06484375149011612, 0.0676562562584877,
    0.07046874612569809, 0.07328125089406967, 0.07609374821186066, 0.07890625298023224,
    0.08171875774860382, 0.08453124761581421, 0.08734375238418579, 0.09015624970197678,
    0.09296875447034836, 0.09578125923871994, 0.09859374910593033, 0.10703125596046448,
    0.12109375, 0.13515624403953552, 0.14921875298023224, 0.16328124701976776,
    0.17734375596046448, 0.19140625, 0.20546874403953552, 0.21953125298023224,
    0.23359374701976776, 0.24765624105930328, 0.26171875, 0.2757812738418579,
    0.28984373807907104, 0.30390626192092896, 0.3179687261581421, 0.33203125,
    0.3460937440395355, 0.36015623807907104, 0.37421876192092896, 0.3882812261581421,
    0.40234375, 0.4164062440395355, 0.43046873807907104, 0.44453126192092896,
    0.4585937261581421, 0.47265625, 0.48671871423721313, 0.500781238079071,
    0.5148437023162842, 0.5289062261581421, 0.54296875, 0.5570312738418579,
    0.5710937976837158, 0.585156261920929, 0.5992187261581421, 0.61328125,
    0.6273437738418579, 0.6414062976837158, 0.655468761920929, 0.6695312261581421,
    0.68359375, 0.6976562738418579, 0.7117187976837158, 0.725781261920929,
    0.7398437261581421, 0.75390625, 0.7679687738418579, 0.782031238079071,
    0.796093761920929, 0.8101562261581421, 0.82421875, 0.8382812738418579,
    0.852343738079071, 0.866406261920929, 0.8804687261581421, 0.89453125,
    0.9085937738418579, 0.922656238079071, 0.936718761920929, 0.9507812261581421,
    0.96484375, 0.9789062738418579, 0.992968738079071, 1.0,
], dtype=np.float32)
DYNAMIC_CODE = np.concatenate([-_DYNAMIC_POSITIVE[:127][::-1], np.zeros(1, np.float32),
                               _DYNAMIC_POSITIVE]).astype(np.float32)
DYNAMIC_MIDPOINTS = ((DYNAMIC_CODE[:-1] + DYNAMIC_CODE[1:]) / np.float32(2)).astype(np.float32)

BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
DQ_BLOCKSIZE = 256  # bitsandbytes quantizes the absmax vector with this blocksize
# bitsandbytes clamps absmax to this before taking the reciprocal, so an all-zero block gives
# scaled = 0 (nibble 7) instead of 0 * inf = NaN.
ABSMAX_FLOOR = np.float32(1e-38)


def _check_blocksize(blocksize):
    if blocksize not in BLOCKSIZES:
        raise ValueError(f"blocksize must be one of {BLOCKSIZES}, got {blocksize!r}")


def _blockwise_codes(x32, blocksize, midpoints):
    """Per-block absmax and nearest-code index of every element (float32 arithmetic)."""
    n = x32.size
    nblocks = -(-n // blocksize)
    padded = np.zeros(nblocks * blocksize, np.float32)
    padded[:n] = np.abs(x32)
    absmax = padded.reshape(nblocks, blocksize).max(axis=1)
    inv = np.float32(1) / np.maximum(absmax, ABSMAX_FLOOR)
    block_of = np.arange(n) // blocksize
    scaled = np.clip(x32 * inv[block_of], np.float32(-1), np.float32(1))
    # count of midpoints strictly below `scaled`: nearest code, exact ties to the lower code
    idx = np.searchsorted(midpoints, scaled, side="left")
    return idx.astype(np.uint8), absmax.astype(np.float32)


def nf4_quantize(w, blocksize=64, double_quant=False):
    """Quantize `w` (any shape) to NF4. Returns (packed uint8 [cdiv(n, 2)], absmax float32
    [cdiv(n, blocksize)]), or with double_quant=True (packed, qabsmax uint8 [nb], absmax2
    float32 [cdiv(nb, 256)], offset float32 [1])."""
    _check_blocksize(blocksize)
    w = np.asarray(w)
    if w.size == 0:
        raise empty_weight("nf4_quantize", w.shape)
    if not np.all(np.isfinite(w)):
        raise ValueError("nf4_quantize: input has non-finite values (absmax would be inf/NaN)")
    x32 = w.reshape(-1).astype(np.float32)
    idx, absmax = _blockwise_codes(x32, blocksize, NF4_MIDPOINTS)
    if idx.size % 2:
        idx = np.concatenate([idx, np.array([ZERO_CODE], np.uint8)])
    packed = ((idx[0::2] << 4) | idx[1::2]).astype(np.uint8)
    if not double_quant:
        return packed, absmax
    offset = np.float32(np.mean(absmax.astype(np.float64)))
    centered = (absmax - offset).astype(np.float32)
    qabsmax, absmax2 = _blockwise_codes(centered, DQ_BLOCKSIZE, DYNAMIC_MIDPOINTS)
    return packed, qabsmax, absmax2, np.array([offset], np.float32)


def decode_absmax(qabsmax, absmax2, offset):
    """Double-quantized absmax back to real values: DYNAMIC_CODE[q] * absmax2[b // 256] + offset."""
    q = np.asarray(qabsmax).astype(np.int64).reshape(-1)
    absmax2 = np.asarray(absmax2, np.float64).reshape(-1)
    offset = np.asarray(offset, np.float64).reshape(-1)
    if offset.size != 1:
        raise ValueError(f"offset must hold one value, got {offset.size}")
    if absmax2.size != -(-q.size // DQ_BLOCKSIZE):
        raise ValueError(f"absmax2 has {absmax2.size} values, expected cdiv({q.size}, 256)")
    return DYNAMIC_CODE[q].astype(np.float64) * absmax2[np.arange(q.size) // DQ_BLOCKSIZE] \
        + offset[0]


def nf4_dequantize(packed, absmax, shape, blocksize=64, absmax2=None, offset=None, dtype=None):
    """Decode NF4: out[i] = NF4_CODE[nibble(i)] * absmax[i // blocksize], reshaped to `shape`.
    Nibble(i) is the high nibble of byte i // 2 for even i, the low nibble for odd i. With
    double quantization pass the uint8 qabsmax as `absmax` plus `absmax2` and `offset`.
    `dtype` (the backends' output dtype) is accepted and ignored: the reference is float64."""
    _check_blocksize(blocksize)
    if dtype is not None and str(dtype).replace("torch.", "") not in (
            "float32", "float16", "bfloat16", "float64"):
        raise ValueError(f"unsupported output dtype {dtype!r}")
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        raise empty_weight("nf4_dequantize", shape)
    packed = np.asarray(packed).reshape(-1)
    if packed.size != -(-n // 2):
        raise ValueError(f"packed has {packed.size} bytes, shape {shape} needs cdiv({n}, 2)")
    nested = absmax2 is not None or offset is not None
    if nested:
        if absmax2 is None or offset is None:
            raise ValueError("double quantization needs both absmax2 and offset")
        absmax = decode_absmax(absmax, absmax2, offset)
    absmax = np.asarray(absmax, np.float64).reshape(-1)
    if absmax.size != -(-n // blocksize):
        raise ValueError(f"absmax has {absmax.size} values, expected cdiv({n}, {blocksize})")
    p = packed.astype(np.int64)
    nibbles = np.stack([p >> 4, p & 15], axis=1).reshape(-1)[:n]
    values = NF4_CODE[nibbles].astype(np.float64) * absmax[np.arange(n) // blocksize]
    return values.reshape(shape)


def nf4_roundtrip(w, blocksize=64, double_quant=False):
    """dequantize(quantize(w)) with w's shape: the value a frozen NF4 weight stands for."""
    state = nf4_quantize(w, blocksize, double_quant)
    extra = {"absmax2": state[2], "offset": state[3]} if double_quant else {}
    return nf4_dequantize(state[0], state[1], np.shape(w), blocksize, **extra)


def nf4_code():
    """The NF4 code table (float32, sorted)."""
    return NF4_CODE.copy()
