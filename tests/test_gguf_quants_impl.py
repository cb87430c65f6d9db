"""GGUF q8_0 / q4_k / q6_k against an independent oracle: the gguf package (llama.cpp's gguf-py,
extra `interop`, pinned 0.19.0), whose numpy (de)quantizers follow ggml's C code. Dequantized
values are compared as bit patterns (uint32), so −0.0 against 0.0 fails, on seeded random blocks
and on every edge value the contract names; q8_0 quantization byte for byte. Also the refusals
the contract's generated checks cannot express (non-uint8 blocks, ragged rows, `out`)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from falsify.kernels.torch import gguf_quants as T
from falsify.kernels.triton import gguf_quants as X
from falsify.reference import gguf_quants as R

gguf = pytest.importorskip("gguf", reason="gguf (extra `interop`)")
QT = gguf.GGMLQuantizationType

# format → (bytes per block, values per block, byte offsets of its fp16 fields, gguf type)
FORMATS = {
    "q8_0": (34, 32, (0,), QT.Q8_0),
    "q4_k": (144, 256, (0, 2), QT.Q4_K),
    "q6_k": (210, 256, (208,), QT.Q6_K),
}
BACKENDS = {
    "reference": lambda name, b: getattr(R, f"{name}_dequantize")(b),
    "torch": lambda name, b: getattr(T, f"{name}_dequantize")(torch.from_numpy(b)).numpy(),
    "triton": lambda name, b: getattr(X, f"{name}_dequantize")(torch.from_numpy(b)).numpy(),
}


def _oracle(name: str, blocks: np.ndarray) -> np.ndarray:
    out = gguf.quants.dequantize(blocks, FORMATS[name][3])
    assert out.dtype == np.float32 and out.shape == (blocks.shape[0],
                                                     blocks.shape[1] // FORMATS[name][0]
                                                     * FORMATS[name][1])
    return out


def _assert_bits_equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got = np.ascontiguousarray(got, dtype=np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=what)


def _random_blocks(name: str, rows: int, nb: int, seed: int) -> np.ndarray:
    """Uniform random bytes, each fp16 field's exponent kept below all-ones (finite), sign and
    every other bit random: zero, subnormal, normal, negative scales all occur."""
    nbytes, _, fields, _ = FORMATS[name]
    rng = np.random.default_rng(seed)
    b = rng.integers(0, 256, size=(rows, nb, nbytes), dtype=np.uint8)
    for off in fields:
        hi = b[..., off + 1]
        exp = (hi >> 2) & 31
        b[..., off + 1] = np.where(exp == 31, hi & 0x83, hi)  # exponent 31 → 0 (subnormal)
    return b.reshape(rows, nb * nbytes)


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_random_blocks_bit_identical_to_gguf(name, backend):
    rows, nb = (64, 64) if name == "q8_0" else (32, 16)  # 4096 / 512 blocks
    blocks = _random_blocks(name, rows, nb, seed=len(name) + rows)
    want = _oracle(name, blocks)
    assert np.all(np.isfinite(want))
    _assert_bits_equal(BACKENDS[backend](name, blocks), want, f"{name} on {backend}")


# The contract's edge values, as fp16 bit patterns: 0, −0, the smallest and the largest
# subnormal, the smallest normal, 1, the largest finite (65504) and their negatives
EDGE_SCALES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF, 0x8001, 0xBC00]


def _quant_patterns(name: str, rng) -> dict[str, np.ndarray]:
    """The bytes after (q8_0) or around (k-quants) the fp16 fields: all zero, all max, all
    0xFF, random."""
    nbytes = FORMATS[name][0]
    return {"zero": np.zeros(nbytes, np.uint8), "ff": np.full(nbytes, 255, np.uint8),
            "max": np.full(nbytes, 0x7F if name == "q8_0" else 0xFF, np.uint8),
            "min": np.full(nbytes, 0x80, np.uint8),
            "random": rng.integers(0, 256, nbytes, dtype=np.uint8)}


def _edge_blocks(name: str) -> tuple[np.ndarray, list[str]]:
    """Every fp16 field at every edge scale (d and dmin independently for q4_k: a negative dmin,
    a zero d with a non-zero min, ...) over every quant pattern: one block each."""
    nbytes, _, fields, _ = FORMATS[name]
    rng = np.random.default_rng(7)
    rows, labels = [], []
    for (pname, pat), scales in itertools.product(
            _quant_patterns(name, rng).items(),
            itertools.product(EDGE_SCALES, repeat=len(fields))):
        blk = pat.copy()
        for off, s in zip(fields, scales):
            blk[off], blk[off + 1] = s & 255, s >> 8
        rows.append(blk)
        labels.append(f"{pname} {[hex(s) for s in scales]}")
    return np.stack(rows), labels


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_edge_values_bit_identical_to_gguf(name, backend):
    blocks, labels = _edge_blocks(name)  # one block per row
    want = _oracle(name, blocks)
    got = BACKENDS[backend](name, blocks)
    for r, label in enumerate(labels):
        _assert_bits_equal(got[r], want[r], f"{name} on {backend}: {label}")
    if name == "q4_k":  # the min term's sign: 0 − dmin·m with dmin < 0 is positive
        neg = [r for r, lab in enumerate(labels)
               if lab.startswith("ff") and "'0x0', '0xfbff'" in lab]
        assert neg and np.all(want[neg] > 0) and np.all(got[neg] > 0)
    # −0.0 occurs (a negative scale times q = 0) and must keep its sign bit
    assert np.any(np.signbit(want) & (want == 0))


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_non_finite_scales_follow_ieee_like_gguf(name, backend):
    """Outside the oracle's bit-exact claim (NaN payloads are unspecified): inf and NaN scales
    give NaN exactly where gguf's do, and the same-signed infinities."""
    nbytes, _, fields, _ = FORMATS[name]
    rng = np.random.default_rng(11)
    rows = []
    for s in (0x7C00, 0xFC00, 0x7E00, 0xFFFF):
        for off in fields:
            blk = rng.integers(0, 256, nbytes, dtype=np.uint8)
            blk[off], blk[off + 1] = s & 255, s >> 8
            rows.append(blk)
    blocks = np.stack(rows)
    with np.errstate(invalid="ignore"):  # inf·0, on every side (the interpreter's numpy too)
        want = _oracle(name, blocks)
        got = BACKENDS[backend](name, blocks)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    np.testing.assert_array_equal(got[fin], want[fin])


def _q8_0_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    ties = np.tile(np.array([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5] * 4, np.float32),
                   (2, 1))
    tiny = np.stack([rng.standard_normal(32) * s for s in (1e-5, 1e-6, 1e-8, 1e-38, 1e-44)])
    return {
        "normal": (rng.standard_normal((48, 256)) * 3).astype(np.float32),
        "wide": (rng.standard_normal((8, 512)) * 10.0 ** rng.integers(-6, 6, (8, 1))).astype(
            np.float32),
        "ties": ties,
        "zeros": np.zeros((2, 64), np.float32),
        "one_value": np.full((1, 32), -3.0, np.float32),
        "fp16_subnormal_and_underflowing_scales": tiny.astype(np.float32),
        "largest": np.full((1, 32), 65504.0 * 127, np.float32),
    }


@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
@pytest.mark.parametrize("case", list(_q8_0_inputs()))
def test_q8_0_quantize_bytes_identical_to_gguf(backend, case):
    x = _q8_0_inputs()[case]
    fn = {"reference": R.q8_0_quantize,
          "torch": lambda a: T.q8_0_quantize(torch.from_numpy(a)).numpy(),
          "triton": lambda a: X.q8_0_quantize(torch.from_numpy(a)).numpy()}[backend]
    # the tiny case's reciprocal overflows (1/d = inf, quants 0): gguf and the interpreter warn
    with np.errstate(over="ignore", invalid="ignore"):
        want = gguf.quants.quantize(x, QT.Q8_0)
        got = fn(x)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
    if case == "ties":  # roundf: halves away from zero (0.5 → 1, 2.5 → 3, −2.5 → −3)
        q = got.reshape(-1, 34)[:, 2:].view(np.int8)
        assert list(q[0, :8]) == [127, 1, -1, 2, -2, 3, -3, 127]


@pytest.mark.parametrize("mod", [R, T, X], ids=["reference", "torch", "triton"])
def test_bad_inputs_raise_before_launch(mod):
    def arr(a):
        return a if mod is R else torch.from_numpy(a)

    with pytest.raises(ValueError, match="multiple"):
        mod.q4_k_dequantize(arr(np.zeros((2, 145), np.uint8)))
    with pytest.raises(ValueError, match="2-D"):
        mod.q8_0_dequantize(arr(np.zeros(34, np.uint8)))
    with pytest.raises(ValueError, match="non-finite"):
        mod.q8_0_quantize(arr(np.array([[np.nan] + [0.0] * 31], np.float32)))
    with pytest.raises(ValueError, match="overflows fp16"):
        mod.q8_0_quantize(arr(np.full((1, 32), 65520.0 * 127, np.float32)))
    with pytest.raises(ValueError, match="multiple of 32"):
        mod.q8_0_quantize(arr(np.zeros((1, 33), np.float32)))
    if mod is not R:
        for name in FORMATS:
            with pytest.raises(TypeError, match="int32"):
                getattr(mod, f"{name}_dequantize")(torch.zeros(1, FORMATS[name][0],
                                                               dtype=torch.int32))
        with pytest.raises(ValueError, match="out"):
            mod.q6_k_dequantize(torch.zeros(1, 210, dtype=torch.uint8),
                                out=torch.empty(1, 255))


def test_triton_writes_only_its_view_of_out():
    blocks = _random_blocks("q4_k", 3, 2, seed=1)
    buf = torch.full((5, 1100), float("nan"))
    out = buf[1:4, 3:1027:2]  # 3 x 512, stride (1100, 2)
    X.q4_k_dequantize(torch.from_numpy(blocks), out=out)
    _assert_bits_equal(out.numpy(), _oracle("q4_k", blocks), "q4_k into a strided out")
    margin = torch.ones_like(buf, dtype=torch.bool)
    margin[1:4, 3:1027:2] = False
    assert torch.all(torch.isnan(buf[margin]))


# --- dequant_matmul --------------------------------------------------------------------------

MM_BACKENDS = {"torch": T.dequant_matmul, "triton": X.dequant_matmul}
BOUNDED = {"q8_0": R.bounded_q8_0, "q4_k": R.bounded_q4_k, "q6_k": R.bounded_q6_k}


@pytest.mark.parametrize("name", FORMATS)
def test_dequant_matmul_reference_matches_gguf_oracle(name):
    """The reference's y = x·Wᵀ and dx = dy·W use gguf's dequantized W (flat bytes, as a GGUF
    file stores them), and the test-input builder leaves every W finite with |W| < 2."""
    nbytes, qk, _, qt = FORMATS[name]
    n, nb = 7, 2
    blocks = BOUNDED[name](_random_blocks(name, n, nb, seed=11))
    w = gguf.quants.dequantize(blocks, qt).astype(np.float64)
    assert np.all(np.abs(w) < R.W_BOUND)
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, 3, nb * qk))
    y = R.dequant_matmul(x, blocks.reshape(-1), name, n, nb * qk)
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-13, atol=1e-13)
    dy = rng.standard_normal((2, 3, n))
    dx = R.dequant_matmul_backward(x, blocks, name, n, nb * qk, dy)["x"]
    np.testing.assert_allclose(dx, dy @ w, rtol=1e-13, atol=1e-13)


def test_torch_dequant_matmul_decodes_at_most_one_chunk(monkeypatch):
    """Forward (row chunks) and backward (block-column chunks) decode at most CHUNK_BYTES of W
    at a time and together cover W exactly once each: the decoder is wrapped to record the
    [rows, columns] of every call. A 1 MiB budget makes a small weight take several chunks."""
    monkeypatch.setattr(T, "CHUNK_BYTES", 1 << 20)
    n, k = 300, 4096
    assert T.chunk_rows(n, k) == 64 and T.chunk_cols(n, k, 256) == 768
    seen = []
    real = T._DECODE["q4_k"]

    def counting(b, w):
        seen.append((b.shape[0], b.shape[1] // 144 * 256))
        return real(b, w)

    monkeypatch.setitem(T._DECODE, "q4_k", counting)
    blocks = torch.from_numpy(R.bounded_q4_k(_random_blocks("q4_k", n, k // 256, seed=5)))
    x = torch.randn(3, k, requires_grad=True)
    y = T.dequant_matmul(x, blocks, "q4_k", n, k)
    assert seen == [(64, k)] * 4 + [(44, k)]
    del seen[:]
    dy = torch.randn(3, n)
    y.backward(dy)
    assert seen == [(n, 768)] * 5 + [(n, 256)]
    w = R.weight(blocks.numpy(), "q4_k", n, k)
    np.testing.assert_allclose(y.detach().numpy(), x.detach().double().numpy() @ w.T, atol=1e-3)
    np.testing.assert_allclose(x.grad.numpy(), dy.double().numpy() @ w, rtol=0, atol=1e-3)


def test_chunks_are_bounded():
    for n, k, qk in [(0, 0, 32), (1, 256, 256), (5, 1 << 20, 32), (4096, 4096, 256),
                     (11008, 4096, 256), (4096, 11008, 256), (7, 32, 32)]:
        r, c = T.chunk_rows(n, k), T.chunk_cols(n, k, qk)
        assert 1 <= r <= max(n, 1) and (r == 1 or r * k * 4 <= T.CHUNK_BYTES)
        assert c % qk == 0 and qk <= c <= max(k, qk)
        assert c == qk or n * c * 4 <= T.CHUNK_BYTES


@pytest.mark.parametrize("backend", MM_BACKENDS)
def test_dequant_matmul_refuses_bad_arguments(backend):
    f = MM_BACKENDS[backend]
    b = torch.zeros(4, 144, dtype=torch.uint8)
    x = torch.zeros(2, 256)
    cases = [
        (dict(qtype="q4_0"), ValueError, "qtype must be one of"),
        (dict(k=255), ValueError, "k = 255 is not a multiple"),
        (dict(n=5), ValueError, "blocks must hold 5 rows"),
        (dict(x=torch.zeros(2, 128)), ValueError, "x must be"),
        (dict(blocks=b.to(torch.int16)), TypeError, "uint8"),
        (dict(x=x.double()), TypeError, "float64"),
        (dict(out=torch.empty(2, 3)), ValueError, "out must be"),
    ]
    for kw, err, msg in cases:
        args = dict(x=x, blocks=b, qtype="q4_k", n=4, k=256) | kw
        with pytest.raises(err, match=msg):
            f(**args)
    xg = x.clone().requires_grad_()
    with pytest.raises(ValueError, match="inference only"):
        f(xg, b, "q4_k", 4, 256, out=torch.empty(2, 4))


@pytest.mark.parametrize("backend", MM_BACKENDS)
def test_dequant_matmul_batched_x_and_out(backend):
    """x [..., k] with two leading axes, flat blocks, and out= give the 2-D result."""
    f = MM_BACKENDS[backend]
    blocks = R.bounded_q6_k(_random_blocks("q6_k", 5, 1, seed=9))
    x = torch.rand(2, 3, 256) * 2 - 1
    want = R.dequant_matmul(x.double().numpy(), blocks, "q6_k", 5, 256)
    got = f(x, torch.from_numpy(blocks).reshape(-1), "q6_k", 5, 256)
    assert got.shape == (2, 3, 5)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-4)
    out = torch.full((2, 3, 5), float("nan"))
    f(x, torch.from_numpy(blocks), "q6_k", 5, 256, out=out)
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-4)
