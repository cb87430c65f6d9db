"""Hand-written edge cases for the merging kernels (falsify/kernels/torch/merging.py,
falsify/reference/merging.py)
and the oracle test against mergekit 0.1.5's own implementations."""

import math

import numpy as np
import pytest
import torch

from falsify.kernels.torch import merging as tm
from falsify.reference import merging as rm


def _t(x, dtype=torch.float32):
    return torch.tensor(np.asarray(x, np.float64), dtype=dtype)


# ---- edge cases ----------------------------------------------------------------------------


def test_n_kept_rule():
    assert rm.n_kept(0.7, 30) == 21          # int(0.7 * 30) = int(21.000000000000004)
    assert rm.n_kept(0.1, 5) == 1            # at least one entry of a nonempty tensor
    assert rm.n_kept(1.0, 7) == 7
    assert rm.n_kept(0.5, 0) == 0
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="density"):
            rm.n_kept(bad, 4)


def test_trim_tie_rule_lower_index_first():
    x = _t([[1.0, -1.0, 1.0, 0.5]])
    y, keep = tm.trim(x, 0.5)
    assert keep.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    assert y.tolist() == [[1.0, -1.0, 0.0, 0.0]]
    ry, rkeep = rm.trim(x.numpy(), 0.5)
    assert np.array_equal(rkeep, keep.numpy()) and np.array_equal(ry, y.numpy())


def test_trim_transposed_view_uses_logical_order():
    x = torch.tensor([[1.0, 1.0], [1.0, 1.0]]).t()  # all ties, noncontiguous
    _, keep = tm.trim(x, 0.5)
    assert keep.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_slerp_endpoints_exact_and_fallback():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    assert torch.equal(tm.slerp(0.0, a, b), a)
    assert torch.equal(tm.slerp(1.0, a, b), b)
    # exactly parallel and antiparallel: the linear interpolation, finite
    for b2 in (2.0 * a, -3.0 * a):
        y = tm.slerp(0.3, a, b2)
        assert torch.isfinite(y).all()
        torch.testing.assert_close(y, 0.7 * a + 0.3 * b2, rtol=0, atol=1e-6)


def test_slerp_orthogonal_unit_vectors():
    a = _t([[1.0, 0.0]])
    b = _t([[0.0, 1.0]])
    y = tm.slerp(0.5, a, b)
    torch.testing.assert_close(y, _t([[math.sqrt(0.5), math.sqrt(0.5)]]), rtol=0, atol=1e-7)


def test_slerp_zero_tensor_is_not_normalised():
    a = torch.zeros(2, 2)
    b = torch.ones(2, 2)
    # dot = 0 (mergekit's rule): θ₀ = π/2, s1 = sin(t·π/2)
    y = tm.slerp(0.5, a, b)
    torch.testing.assert_close(y, b * math.sin(math.pi / 4), rtol=0, atol=1e-7)


def test_ties_exact_cancellation_elects_nothing():
    base = torch.zeros(1, 2)
    thetas = _t([[[1.0, 2.0]], [[-1.0, 1.0]]])
    w = torch.ones(2)
    y = tm.ties(base, thetas, w, 1.0, 1.0)
    # element 0: mass 1 − 1 = 0 → stays at base; element 1: both agree → mean 1.5
    assert y.tolist() == [[0.0, 1.5]]
    assert np.array_equal(rm.ties(base.numpy(), thetas.numpy(), w.numpy(), 1.0, 1.0), y.numpy())


def test_ties_mass_beats_count():
    base = torch.zeros(1, 1)
    thetas = _t([[[0.1]], [[0.2]], [[-5.0]]])
    y = tm.ties(base, thetas, torch.ones(3), 1.0, 1.0)
    assert y.item() == -5.0


def test_dare_mask_seeded_and_drawn_as_specified():
    base = torch.zeros(4, 8)
    thetas = torch.ones(2, 4, 8)
    w = torch.ones(2)
    y1 = tm.dare_linear(base, thetas, w, 0.5, 123)
    assert torch.equal(y1, tm.dare_linear(base, thetas, w, 0.5, 123))
    assert not torch.equal(y1, tm.dare_linear(base, thetas, w, 0.5, 124))
    ref = rm.dare_linear(base.numpy(), thetas.numpy(), w.numpy(), 0.5, 123)
    np.testing.assert_allclose(y1.numpy(), ref, rtol=0, atol=1e-6)
    # each survivor is 1/(1 − 0.5) = 2, each drop 0; the mean of two models: the keep count
    keep = rm.dare_keep(123, (2, 4, 8), 0.5)
    np.testing.assert_array_equal(ref, keep.sum(0))
    # each backend draws its own mask; both are PCG64(seed).random(shape) >= p
    spec = np.random.default_rng(123).random((2, 4, 8)) >= 0.5
    np.testing.assert_array_equal(tm.dare_keep(123, (2, 4, 8), 0.5).numpy(), spec)
    np.testing.assert_array_equal(keep, spec)


def test_dare_refuses_p_one():
    with pytest.raises(ValueError, match="p = 1"):
        tm.dare_linear(torch.zeros(1, 1), torch.ones(1, 1, 1), torch.ones(1), 1.0, 0)


@pytest.mark.parametrize("fn,args", [
    (tm.linear, (torch.ones(2, 3, 4, dtype=torch.float64), torch.ones(2, dtype=torch.float64))),
    (tm.slerp, (0.5, torch.ones(2, 2, dtype=torch.bfloat16), torch.ones(2, 2,
                                                                     dtype=torch.bfloat16))),
    (tm.trim, (torch.ones(2, 2, dtype=torch.int64), 0.5)),
])
def test_unchecked_dtypes_refused(fn, args):
    with pytest.raises(TypeError, match="unsupported dtype"):
        fn(*args)


def test_zero_models_refused_by_name():
    for fn in (lambda: tm.linear(torch.ones(0, 2, 2), torch.ones(0)),
               lambda: rm.linear(np.ones((0, 2, 2)), np.ones(0))):
        with pytest.raises(ValueError, match="k = 0"):
            fn()


def test_fp16_rounds_once():
    thetas = torch.tensor([[[1.0]], [[1.0009765625]]], dtype=torch.float16)  # 1 and 1 + 2^-10
    w = torch.tensor([1.0, 1.0], dtype=torch.float16)
    y = tm.linear(thetas, w)
    assert y.dtype == torch.float16
    # exact mean 1 + 2^-11 is a tie: round-half-even gives 1.0 from the float32 value
    assert y.item() == float(torch.tensor(1.00048828125).half())


# ---- oracle: mergekit 0.1.5 ----------------------------------------------------------------

MK_REASON = ("mergekit is not importable: scripts/install.sh installs it with the 'oracles' "
             "extra (pip install -e '.[dev]'); the oracle comparison needs it")


def _mk():
    return pytest.importorskip("mergekit", reason=MK_REASON)


def _rand(seed, *shape):
    return torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32))


def _report(name, diff, what="max |ours − mergekit|"):
    print(f"oracle {name}: {what} = {diff:.3e}")


def test_oracle_linear():
    _mk()
    from mergekit.merge_methods.base import TensorBatch
    from mergekit.merge_methods.linear import linear_merge

    worst = 0.0
    for seed in range(5):
        thetas = _rand(seed, 3, 16, 24)
        w = torch.tensor([0.2, 0.5, 0.9])
        theirs = linear_merge.implementation(
            TensorBatch(tensors=tuple(t[None] for t in thetas)), weight=w[None],
            normalize=True)[0]
        worst = max(worst, (tm.linear(thetas, w) - theirs).abs().max().item())
    _report("linear", worst)
    assert worst <= 8 * 2 * 4 * torch.finfo(torch.float32).eps  # both within 2(k+1)·eps


def test_oracle_slerp():
    _mk()
    from mergekit.merge_methods.slerp import slerp as mk_slerp

    worst = 0.0
    g = torch.Generator().manual_seed(0)
    for seed in range(8):
        a = _rand(seed, 16, 24)
        b = _rand(seed + 100, 16, 24)
        if seed % 4 == 3:   # near parallel, inside the fallback
            b = (2.0 * a + 0.01 * torch.randn(16, 24, generator=g)).float()
        for t in (0.0, 0.25, 0.5, 0.9, 1.0):
            theirs = mk_slerp(torch.tensor([t]), a[None], b[None])[0]
            worst = max(worst, (tm.slerp(t, a, b) - theirs).abs().max().item())
    _report("slerp", worst)
    # mergekit works in float32 (dot, arccos, coefficients): a few eps32 of |a|, |b| ≤ 2
    assert worst <= 64 * torch.finfo(torch.float32).eps


def test_oracle_magnitude_trim():
    _mk()
    from mergekit.sparsify import magnitude

    worst = 0.0
    for seed in range(5):
        x = _rand(seed, 16, 24)  # continuous values: no ties, mergekit's unstable sort agrees
        for d in (0.1, 0.25, 0.5, 0.7, 1.0):
            ours, keep = tm.trim(x, d)
            theirs = magnitude(x, d)
            worst = max(worst, (ours - theirs).abs().max().item())
            assert int(keep.sum()) == int((theirs != 0).sum())
    _report("magnitude trim", worst)
    assert worst == 0.0


def _gta(name, base, thetas, w, **params):
    from mergekit.merge_methods import registry
    from mergekit.merge_methods.base import TensorGroup

    group = TensorGroup.from_tensors([base, *thetas], base_index=0)
    ids = [e.id for e in group.non_base]
    density = params.pop("density", 1.0)
    return registry.get(name).merge_group(
        group, weight=dict(zip(ids, w.tolist())), density=dict.fromkeys(ids, density),
        int8_mask=False, **params)


def test_oracle_ties():
    _mk()
    worst = 0.0
    for seed in range(5):
        base = _rand(seed, 16, 24)
        thetas = base + 0.1 * _rand(seed + 50, 3, 16, 24)
        w = torch.tensor([0.3, 1.0, 0.6])
        for d in (0.25, 0.5, 1.0):
            for lam in (0.5, 1.0):
                theirs = _gta("ties", base, thetas, w, density=d, normalize=True,
                              rescale=False, **{"lambda": lam})
                ours = tm.ties(base, thetas, w, d, lam)
                worst = max(worst, (ours - theirs).abs().max().item())
    _report("ties", worst)
    assert worst <= 16 * torch.finfo(torch.float32).eps


def test_oracle_dare_linear_shared_mask(monkeypatch):
    """mergekit draws its mask with torch.bernoulli and (by default) rescales by the L1-norm
    ratio; with torch.bernoulli patched to return our keep mask, rescale off and
    lambda = 1/(1 − p), its dare_linear (normalize: true) is exactly our formula."""
    _mk()
    import mergekit.sparsify as sp

    worst = 0.0
    for seed in range(5):
        base = _rand(seed, 16, 24)
        thetas = base + 0.1 * _rand(seed + 50, 3, 16, 24)
        w = torch.tensor([0.3, 1.0, 0.6])
        for p in (0.1, 0.5, 0.9):
            keep = torch.from_numpy(rm.dare_keep(seed, tuple(thetas.shape), p)).float()
            masks = iter(keep)
            monkeypatch.setattr(sp.torch, "bernoulli", lambda probs, _m=masks: next(_m))
            theirs = _gta("dare_linear", base, thetas, w, density=1 - p, normalize=True,
                          rescale=False, **{"lambda": 1.0 / (1.0 - p)})
            monkeypatch.undo()
            ours = tm.dare_linear(base, thetas, w, p, seed)
            worst = max(worst, (ours - theirs).abs().max().item())
    _report("dare_linear (shared mask)", worst)
    assert worst <= 64 * torch.finfo(torch.float32).eps


def test_oracle_dare_distribution():
    """Unshared RNGs: mergekit's default dare_linear (L1 rescale) and ours, averaged over 200
    seeds each, both approach the linear merge (the expectation DARE preserves)."""
    _mk()
    base = _rand(0, 8, 16)
    thetas = base + 0.1 * _rand(1, 2, 8, 16)
    w = torch.tensor([0.5, 1.0])
    p, n = 0.5, 200
    lin = tm.linear(thetas, w)
    ours = torch.stack([tm.dare_linear(base, thetas, w, p, s) for s in range(n)]).mean(0)
    torch.manual_seed(0)
    theirs = torch.stack([_gta("dare_linear", base, thetas, w, density=1 - p, normalize=True,
                                rescale=True, **{"lambda": 1.0}) for _ in range(n)]).mean(0)
    # per element: sd of one draw ≤ √(p/(1−p))·Σ(w/W)|τ| ≤ 0.1·1·1 → sd of the mean ≤ 0.1/√n;
    # 6 sd for the max over 128 elements
    bound = 6 * 0.1 / math.sqrt(n)
    d_ours, d_theirs = (ours - lin).abs().max().item(), (theirs - lin).abs().max().item()
    _report("dare_linear, ours", d_ours, f"max |mean over {n} seeds − linear|")
    _report("dare_linear, mergekit (L1 rescale)", d_theirs, f"max |mean over {n} draws − linear|")
    assert d_ours <= bound and d_theirs <= bound
