"""Hand-written edge tests for weight quantization (the contract covers the rules on drawn
inputs; these pin them on explicit examples, cover the API — errors, dtypes, storage — and
compare with an independent implementation, torchao's affine quantization primitives)."""

import numpy as np
import pytest
import torch

from falsify.kernels.dtypes import UnsupportedDtype
from falsify.kernels.torch import quantize as qt
from falsify.reference import quantize as qr

IDS = ["reference", "torch"]


def _call(backend, name, w, *args):
    """Call `name` on a backend: float64 numpy for the reference, fp32 tensors for torch;
    returns a tuple of float64 numpy arrays."""
    if backend == "reference":
        outs = getattr(qr, name)(np.asarray(w, np.float64), *args)
    else:
        outs = getattr(qt, name)(torch.tensor(w, dtype=torch.float32), *args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return tuple(np.asarray(o, dtype=np.float64) if backend == "reference"
                 else o.double().numpy() for o in outs)


# ---------------------------------------------------------------- int8 per channel
@pytest.mark.parametrize("backend", IDS)
def test_int8_ties_to_even_and_exact_scale(backend):
    # max 127 -> scale 1 exactly; 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, 0.5 -> 0, -1.5 -> -2
    q, s = _call(backend, "int8_per_channel", [[127.0, 2.5, 3.5, -2.5, 0.5, -1.5, 126.5]])
    assert s.tolist() == [1.0]
    assert q.tolist() == [[127.0, 2.0, 4.0, -2.0, 0.0, -2.0, 126.0]]


@pytest.mark.parametrize("backend", IDS)
def test_int8_zero_row_and_empty_row(backend):
    q, s = _call(backend, "int8_per_channel", [[0.0, -0.0, 0.0], [1.0, -2.0, -0.001]])
    assert s[0] == 0.0 and q[0].tolist() == [0.0, 0.0, 0.0]
    assert q[1].tolist() == [64.0, -127.0, 0.0]
    assert not np.signbit(q[q == 0]).any()  # zero codes are +0.0, never -0.0
    assert s[1] == np.float32(2.0 / 127)
    q, s = _call(backend, "int8_per_channel", np.zeros((3, 0)))
    assert q.shape == (3, 0) and s.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("backend", IDS)
def test_int8_row_max_maps_to_127_without_clamping(backend):
    rng = np.random.default_rng(5)
    w = rng.uniform(-3, 3, (16, 97)).astype(np.float32)
    q, s = _call(backend, "int8_per_channel", w)
    assert np.abs(q).max(axis=1).tolist() == [127.0] * 16
    assert np.all(np.abs(w) < 127.5 * s[:, None])  # the quotient never reaches the clamp
    assert np.all(s == s.astype(np.float32))       # stored in float32


# ---------------------------------------------------------------- int4 groupwise
@pytest.mark.parametrize("backend", IDS)
def test_int4_asymmetric_tie_clamps_top_code(backend):
    # range [-7.5, 7.5]: scale 1, zero round(7.5) = 8; 7.5 -> round(7.5) + 8 = 16 -> 15 (the
    # one clamp QNT-CLP-001 allows), -7.5 -> -8 + 8 = 0, 0.5 -> 0 + 8, 1.5 -> 2 + 8
    q, s, z = _call(backend, "int4_groupwise", [[-7.5, 7.5, 0.5, 1.5]], 4, False)
    assert s.tolist() == [[1.0]] and z.tolist() == [[8.0]]
    assert q.tolist() == [[0.0, 15.0, 8.0, 10.0]]


@pytest.mark.parametrize("backend", IDS)
def test_int4_asymmetric_range_includes_zero(backend):
    # all-positive group: min is taken as 0, so zero = 0 and 0.0 stays representable
    q, s, z = _call(backend, "int4_groupwise", [[1.0, 3.0, 2.0, 0.0]], 4, False)
    assert z.tolist() == [[0.0]] and s.tolist() == [[np.float32(3.0 / 15)]]
    assert q[0, 3] == 0.0
    # all-negative group: max is taken as 0, zero = 15
    q, s, z = _call(backend, "int4_groupwise", [[-1.0, -3.0, 0.0, -2.0]], 4, False)
    assert z.tolist() == [[15.0]] and q[0, 2] == 15.0


@pytest.mark.parametrize("backend", IDS)
def test_int4_zero_weights_dequantize_to_exact_zero(backend):
    rng = np.random.default_rng(11)
    w = rng.uniform(-1.3, 2.9, (8, 64)).astype(np.float32)
    w[rng.random(w.shape) < 0.3] = 0.0
    for symmetric in (True, False):
        (y,) = _call(backend, "int4_roundtrip", w, 16, symmetric)
        assert np.all(y[w == 0] == 0.0)


@pytest.mark.parametrize("backend", IDS)
def test_int4_symmetric_codes_and_groups_run_along_columns(backend):
    w = [[7.0, -3.5, 1.0, 0.0], [0.7, 0.35, -0.7, 0.1]]
    q, s, z = _call(backend, "int4_groupwise", w, 2, True)
    assert s.tolist() == [[1.0, np.float32(1.0 / 7)], [np.float32(0.1), np.float32(0.1)]]
    assert q[0].tolist() == [7.0, -4.0, 7.0, 0.0]   # -3.5 -> -4 (even)
    assert np.all(z == 0.0)


@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("i, group", [(10, 4), (3, 2), (7, 8)])
def test_int4_group_must_divide_columns(backend, i, group):
    with pytest.raises(ValueError, match=rf"i = {i} is not a multiple of group = {group}"):
        _call(backend, "int4_groupwise", np.ones((2, i)), group, True)


@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("group", [0, -4, 2.0, True])
def test_int4_group_must_be_a_positive_integer(backend, group):
    with pytest.raises(ValueError, match="group"):
        _call(backend, "int4_groupwise", np.ones((2, 4)), group, False)


# ---------------------------------------------------------------- dequantize
def test_dequantize_shapes_and_dtypes():
    q = torch.tensor([[1.0, -2.0, 3.0, 15.0]])
    s = torch.tensor([[0.5, 0.25]])
    z = torch.tensor([[1.0, 3.0]])
    y = qt.dequantize(q, s, z, 2)
    assert y.dtype == torch.float32 and y.tolist() == [[0.0, -1.5, 0.0, 3.0]]
    assert qt.dequantize(q, s, z, 2, torch.float16).dtype == torch.float16
    assert np.array_equal(qr.dequantize(q.numpy(), s.numpy(), z.numpy(), 2), y.numpy())
    with pytest.raises(ValueError, match=r"\[1, 2\]"):
        qt.dequantize(q, s[:, :1], z[:, :1], 2)
    with pytest.raises(TypeError, match="float64"):
        qt.dequantize(q, s, z, 2, torch.float64)


@pytest.mark.parametrize("name, args", [("int8_per_channel", ()), ("int8_roundtrip", ()),
                                        ("int4_groupwise", (2, True)),
                                        ("int4_roundtrip", (2, False))])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.int32])
def test_undeclared_dtypes_refused(name, args, dtype):
    w = torch.ones(2, 4, dtype=dtype)
    with pytest.raises(UnsupportedDtype, match=str(dtype).removeprefix("torch.")):
        getattr(qt, name)(w, *args)


def test_fp16_weights_give_fp16_dequantized_weights_and_fp32_scales():
    w = torch.randn(4, 32, generator=torch.Generator().manual_seed(0)).half()
    q, s = qt.int8_per_channel(w)
    assert q.dtype == torch.float32 and s.dtype == torch.float32
    assert qt.int8_roundtrip(w).dtype == torch.float16
    assert torch.equal(q.to(torch.int8).float(), q)  # packing into int8 is lossless


def test_no_autograd_graph():
    w = torch.randn(3, 8, requires_grad=True)
    for out in (*qt.int8_per_channel(w), *qt.int4_groupwise(w, 4, False),
                qt.int4_roundtrip(w, 4, True)):
        assert not out.requires_grad


# ---------------------------------------------------------------- oracle: torchao
# torchao's affine primitives (quant_primitives.py) implement the same formats with three
# deliberate differences, each measured below:
#  - the scale is clamped to eps = finfo(dtype).smallest_normal (an all-zero group gets scale
#    2^-126 instead of 0; the codes are still 0 = zero);
#  - the quotient is input * (1.0 / scale) in float32, not w / s in float64: near a
#    half-integer the float32 product can land on the other side, one code apart;
#  - the asymmetric scale is (max − min)/15 with the subtraction and the division each rounded
#    to float32 (ours: both in float64, one float32 rounding at the end): one float32 ulp
#    apart wherever max − min is not exact in float32 (a fifth of the groups here), and then
#    the codes may differ too; zero = quant_min − round(min/scale) in float32.
# And one difference of convention: torchao's symmetric scale is max|w| / ((qmax − qmin)/2),
# max/7.5 for its int4 range [−8, 7] (the max maps to 7.5 and clamps at 7, the negative max to
# −7.5 → −8); ours is max/7 over [−7, 7] (−8 unused). With quant_min = −7 the formats agree.
def _torchao():
    pytest.importorskip("torchao", reason="torchao not installed: pip install 'falsify[oracles]'")
    from torchao.quantization import quant_primitives as qp

    return qp


def _weights(seed, o=64, i=256):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(o, i, generator=g) * torch.rand(o, 1, generator=g) * 3
    w[:, ::17] = 0.0                   # exact zeros in every row
    w[0] = 0.0                         # one all-zero row (the eps-clamp difference)
    return w


def _ao(qp, w, block, mapping, qmin, qmax):
    scale, zero = qp.choose_qparams_affine(w, mapping, block, torch.int8, qmin, qmax,
                                           scale_dtype=torch.float32,
                                           zero_point_dtype=torch.int32)
    q = qp.quantize_affine(w, block, scale, zero, torch.int8, qmin, qmax)
    deq = qp.dequantize_affine(q, block, scale, zero, torch.int8, qmin, qmax,
                               output_dtype=torch.float32)
    return q, scale, zero, deq


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_torchao_int8_symmetric(seed):
    qp = _torchao()
    w = _weights(seed)
    q_ao, s_ao, z_ao, deq_ao = _ao(qp, w, (1, w.shape[1]), qp.MappingType.SYMMETRIC, -127, 127)
    q, s = qt.int8_per_channel(w)
    nonzero = s > 0
    # scales: bit-identical wherever the row is not all zero (fl32(amax/127) both ways:
    # float32 division is correctly rounded, ours double-rounds innocuously)
    assert torch.equal(s_ao.reshape(-1)[nonzero], s[nonzero])
    assert torch.all(s_ao.reshape(-1)[~nonzero] == torch.finfo(torch.float32).smallest_normal)
    assert torch.all(z_ao == 0)
    # codes: equal except where w·fl32(1/s) and w/s round to different integers
    diff = (q_ao.float() != q)
    assert diff.float().mean() < 1e-3
    assert torch.all((q_ao.float() - q).abs() <= 1)
    deq = qt.int8_roundtrip(w)
    err = (deq - deq_ao).abs()
    # where the codes agree the dequantized values are bit-identical: (q·s) in float32 both
    assert torch.equal(deq[~diff], deq_ao[~diff])
    assert err.max() <= s.max()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group", [32, 128])
def test_oracle_torchao_int4_symmetric(seed, group):
    qp = _torchao()
    w = _weights(seed)
    # quant range [−7, 7]: torchao's scale is then max/7, ours
    q_ao, s_ao, z_ao, deq_ao = _ao(qp, w, (1, group), qp.MappingType.SYMMETRIC, -7, 7)
    q, s, z = qt.int4_groupwise(w, group, True)
    s_ao = s_ao.reshape(s.shape)
    nonzero = s > 0
    assert torch.equal(s_ao[nonzero], s[nonzero])
    assert torch.all(z_ao == 0) and torch.all(z == 0)
    diff = q_ao.float() != q
    assert diff.float().mean() < 1e-3 and torch.all((q_ao.float() - q).abs() <= 1)
    deq = qt.int4_roundtrip(w, group, True)
    assert torch.equal(deq[~diff], deq_ao[~diff])


def test_oracle_torchao_int4_symmetric_default_range_is_another_format():
    qp = _torchao()
    w = _weights(0)
    _, s_ao, _, _ = _ao(qp, w, (1, 128), qp.MappingType.SYMMETRIC, -8, 7)
    _, s, _ = qt.int4_groupwise(w, 128, True)
    amax = w.double().abs().reshape(64, 2, 128).amax(-1)
    nonzero = s > 0
    assert torch.equal(s_ao.reshape(s.shape)[nonzero], (amax / 7.5).float()[nonzero])
    assert torch.equal(s[nonzero], (amax / 7).float()[nonzero])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("group", [32, 128])
def test_oracle_torchao_int4_asymmetric(seed, group):
    qp = _torchao()
    w = _weights(seed)
    q_ao, s_ao, z_ao, deq_ao = _ao(qp, w, (1, group), qp.MappingType.ASYMMETRIC, 0, 15)
    q, s, z = qt.int4_groupwise(w, group, False)
    s_ao, z_ao = s_ao.reshape(s.shape), z_ao.reshape(z.shape).float()
    nonzero = s > 0
    # torchao's scale: fl32(fl32(max − min)/15) — equal to ours where max − min is exact in
    # float32; its zero point: −round(fl32(min/scale)), ours round(fl64(−min/s))
    scale_same = (s_ao == s) | ~nonzero
    assert torch.all(((s_ao - s).abs() <= s * 2.0 ** -23)[nonzero])  # ≤ one float32 ulp
    assert torch.equal(z_ao[nonzero & scale_same], z[nonzero & scale_same])
    assert torch.all(z_ao[~nonzero] == 0)
    diff = q_ao.float() != q
    assert diff.float().mean() < 1e-3 and torch.all((q_ao.float() - q).abs() <= 1)
    deq = qt.int4_roundtrip(w, group, False)
    # a scale one ulp apart moves a dequantized value by ≤ 15 ulps of the scale
    assert torch.all(((deq - deq_ao).abs() <= 15 * s.repeat_interleave(group, 1) * 2.0 ** -23
                      + 2.0 ** -24 * deq.abs())[~diff])
    same_group = scale_same.repeat_interleave(group, dim=1) & ~diff
    assert torch.equal(deq[same_group], deq_ao[same_group])
    # both keep 0.0 exact
    assert torch.all(deq[w == 0] == 0) and torch.all(deq_ao[w == 0] == 0)


def test_oracle_torchao_report():
    """The measured differences (printed with -s; asserted loosely above)."""
    qp = _torchao()
    w = _weights(0)
    lines = []
    for label, block, mapping, lo, hi, ours in [
            ("int8 sym", (1, 256), qp.MappingType.SYMMETRIC, -127, 127,
             lambda: (*qt.int8_per_channel(w), qt.int8_roundtrip(w))),
            ("int4 sym g128 [-7, 7]", (1, 128), qp.MappingType.SYMMETRIC, -7, 7,
             lambda: (*qt.int4_groupwise(w, 128, True)[:2], qt.int4_roundtrip(w, 128, True))),
            ("int4 asym g128", (1, 128), qp.MappingType.ASYMMETRIC, 0, 15,
             lambda: (*qt.int4_groupwise(w, 128, False)[:2],
                      qt.int4_roundtrip(w, 128, False)))]:
        q_ao, s_ao, _, deq_ao = _ao(qp, w, block, mapping, lo, hi)
        q, s, deq = ours()
        s_ao = s_ao.reshape(s.shape)
        lines.append(f"{label}: codes differ {(q_ao.float() != q).sum().item()}/{q.numel()}, "
                     f"scales differ {(s_ao != s).sum().item()}/{s.numel()} "
                     f"(zero groups {(s == 0).sum().item()}), "
                     f"max |deq − deq_ao| = {(deq - deq_ao).abs().max().item():.3g}")
    print("\n".join(lines))
