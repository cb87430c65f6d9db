"""Hand-written edge tests for pruning (the contract covers the mask rule on drawn inputs; these
pin it on explicit examples and cover the API: errors, dtypes, other N:M patterns)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from falsify.kernels.torch import pruning as prn_torch
from falsify.reference import pruning as prn_ref

IDS = ["reference", "torch"]


def _call(backend, name, *args):
    """Call `name` on a backend: float64 numpy for the reference, fp32 tensors for torch;
    returns (w_pruned, keep) as float64 numpy arrays."""
    if backend == "reference":
        outs = getattr(prn_ref, name)(*[np.asarray(a, np.float64) if isinstance(a, list) else a
                                        for a in args])
        return tuple(np.asarray(o) for o in outs)
    outs = getattr(prn_torch, name)(*[torch.tensor(a, dtype=torch.float32)
                                      if isinstance(a, list) else a for a in args])
    return tuple(o.double().numpy() for o in outs)


# ---------------------------------------------------------------- the tie rule, explicitly
@pytest.mark.parametrize("backend", IDS)
def test_equal_scores_prune_lower_columns_first(backend):
    # every score is 1 (|w|·xnorm = 0.5·2 = 1·1 = 2·0.5): k = 2 prunes columns 0 and 1
    _, keep = _call(backend, "wanda", [[0.5, 1.0, 2.0, -1.0]], [2.0, 1.0, 0.5, 1.0], 0.5)
    assert keep.tolist() == [[0.0, 0.0, 1.0, 1.0]]


@pytest.mark.parametrize("backend", IDS)
def test_magnitude_ties_ignore_sign(backend):
    _, keep = _call(backend, "magnitude", [[-1.0, 1.0, -1.0, 1.0, 3.0]], 0.6)
    assert keep.tolist() == [[0.0, 0.0, 0.0, 1.0, 1.0]]


@pytest.mark.parametrize("backend", IDS)
def test_n_m_ties_within_a_group_prune_lower_columns_first(backend):
    # group 0: scores [3, 1, 1, 2] -> prune the two 1s (cols 1, 2); group 1: all equal -> 4, 5
    _, keep = _call(backend, "n_m", [[3.0, 1.0, 1.0, 2.0, 7.0, -7.0, 7.0, 7.0]], [1.0] * 8, 2, 4)
    assert keep.tolist() == [[1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]]


@pytest.mark.parametrize("backend", IDS)
def test_wanda_norm_reorders_where_magnitude_does_not(backend):
    # |w| = [1, 2] but xnorm = [4, 1]: wanda scores [4, 2] and prunes column 1
    _, keep_w = _call(backend, "wanda", [[1.0, 2.0]], [4.0, 1.0], 0.5)
    _, keep_m = _call(backend, "magnitude", [[1.0, 2.0]], 0.5)
    assert keep_w.tolist() == [[1.0, 0.0]]
    assert keep_m.tolist() == [[0.0, 1.0]]


# ---------------------------------------------------------------- values and k
@pytest.mark.parametrize("backend", IDS)
def test_pruned_are_positive_zero_and_kept_negative_zero_survives(backend):
    # scores [0, 0, 3, 1]: k = 2 prunes the two zeros (cols 0, 1); then sparsity 0 keeps all
    y, keep = _call(backend, "magnitude", [[-0.0, -0.0, -3.0, -1.0]], 0.5)
    assert keep.tolist() == [[0.0, 0.0, 1.0, 1.0]]
    assert not np.signbit(y[0, :2]).any()
    y, _ = _call(backend, "wanda", [[-0.0, -2.0]], [1.0, 1.0], 0.0)
    assert np.signbit(y).all() and y.tolist() == [[0.0, -2.0]]


@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("sparsity, n_in, pruned", [
    (0.0, 5, 0), (1.0, 5, 5), (0.5, 3, 1), (0.7, 10, 7), (0.25, 7, 1), (0.999, 4, 3),
    # the decimal product, not the float64 one: 0.7·90 = 62.99999999999999 in float64
    (0.7, 90, 63), (0.7, 170, 119), (0.7, 180, 126)])
def test_k_is_floor_of_sparsity_times_in(backend, sparsity, n_in, pruned):
    assert prn_ref.n_pruned(sparsity, n_in) == pruned
    assert math.floor(Fraction(str(sparsity)) * n_in) == pruned  # the decimal rule itself
    w = (np.arange(2 * n_in, dtype=np.float64).reshape(2, n_in) + 1).tolist()
    _, keep = _call(backend, "magnitude", w, sparsity)
    assert (keep == 0).sum(-1).tolist() == [pruned, pruned]


@pytest.mark.parametrize("n, m", [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4), (4, 8), (1, 1), (1, 2)])
def test_other_n_m_patterns_match_the_reference(n, m):
    rng = np.random.default_rng(n * 10 + m)
    w = rng.choice([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0], size=(5, 4 * m)).astype(np.float32)
    x = rng.choice([0.0, 0.5, 1.0, 2.0], size=4 * m).astype(np.float32)
    y_ref, k_ref = prn_ref.n_m(w, x, n, m)
    y_t, k_t = prn_torch.n_m(torch.from_numpy(w), torch.from_numpy(x), n, m)
    assert np.array_equal(k_t.double().numpy(), k_ref)
    assert np.array_equal(y_t.double().numpy(), y_ref)
    assert (k_ref.reshape(5, 4, m) == 0).sum(-1).tolist() == [[n] * 4] * 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_torch_outputs_keep_the_input_dtype_and_no_graph(dtype):
    w = torch.randn(3, 8, dtype=dtype, requires_grad=True)
    x = torch.rand(8, dtype=dtype)
    for y, keep in (prn_torch.wanda(w, x, 0.5), prn_torch.magnitude(w, 0.5),
                    prn_torch.n_m(w, x, 2, 4)):
        assert y.dtype == keep.dtype == dtype
        assert y.shape == keep.shape == w.shape
        assert not y.requires_grad and not keep.requires_grad


def test_torch_mixed_input_dtypes_match_the_reference():
    # fp32 weights with fp16 norms: scores are float64 either way, so the mask is the reference's
    w = torch.tensor([[1.0, 1.0009765625, 1.0]])
    x = torch.tensor([1.0009765625, 1.0, 1.0], dtype=torch.float16)
    _, keep = prn_torch.wanda(w, x, 2 / 3)
    _, keep_ref = prn_ref.wanda(w.double().numpy(), x.double().numpy(), 2 / 3)
    assert np.array_equal(keep.double().numpy(), keep_ref)


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("sparsity", [-0.1, 1.5, float("nan"), float("inf")])
def test_bad_sparsity_raises(backend, sparsity):
    with pytest.raises(ValueError, match=r"sparsity = .*: must be in \[0, 1\]"):
        _call(backend, "wanda", [[1.0, 2.0]], [1.0, 1.0], sparsity)
    with pytest.raises(ValueError, match=r"sparsity = .*: must be in \[0, 1\]"):
        _call(backend, "magnitude", [[1.0, 2.0]], sparsity)


@pytest.mark.parametrize("backend", IDS)
def test_n_m_width_not_a_multiple_of_m_raises(backend):
    with pytest.raises(ValueError, match=r"n_m: in = 6 is not a multiple of m = 4"):
        _call(backend, "n_m", [[1.0] * 6], [1.0] * 6, 2, 4)


@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("n, m", [(5, 4), (-1, 4), (0, 0)])
def test_n_m_bad_pattern_raises(backend, n, m):
    with pytest.raises(ValueError, match=rf"n_m: n = {n}, m = {m}: need 0 <= n <= m, m >= 1"):
        _call(backend, "n_m", [[1.0] * 4], [1.0] * 4, n, m)


@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("name, extra", [("wanda", (0.5,)), ("n_m", (2, 4))])
def test_mismatched_xnorm_shape_raises(backend, name, extra):
    with pytest.raises(ValueError, match=r"xnorm must be \[in\] = \[4\], got \(?3"):
        _call(backend, name, [[1.0] * 4], [1.0] * 3, *extra)
    with pytest.raises(ValueError, match=r"xnorm must be \[in\] = \[4\], got \(?1, 4"):
        _call(backend, name, [[1.0] * 4], [[1.0] * 4], *extra)


@pytest.mark.parametrize("backend", IDS)
@pytest.mark.parametrize("w", [[1.0, 2.0], [[[1.0, 2.0]]]])
def test_w_not_2d_raises(backend, w):
    with pytest.raises(ValueError, match=r"w must be \[out, in\]"):
        _call(backend, "magnitude", w, 0.5)
    with pytest.raises(ValueError, match=r"w must be \[out, in\]"):
        _call(backend, "wanda", w, [1.0, 2.0], 0.5)


def test_torch_refuses_non_tensors_and_unchecked_dtypes():
    with pytest.raises(TypeError, match="w must be a tensor"):
        prn_torch.wanda([[1.0, 2.0]], torch.ones(2), 0.5)
    with pytest.raises(TypeError, match="xnorm must be a tensor"):
        prn_torch.n_m(torch.ones(1, 4), [1.0] * 4, 2, 4)
    with pytest.raises(TypeError, match="w must be a tensor"):
        prn_torch.magnitude(np.ones((2, 2), np.float32), 0.5)
    for dt in (torch.float64, torch.bfloat16, torch.int64):
        with pytest.raises(TypeError, match=str(dt).removeprefix("torch.")):
            prn_torch.magnitude(torch.ones(2, 4, dtype=dt), 0.5)
        with pytest.raises(TypeError, match=str(dt).removeprefix("torch.")):
            prn_torch.wanda(torch.ones(2, 4), torch.ones(4, dtype=dt), 0.5)
