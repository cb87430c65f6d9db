"""Hand-written edge tests for AdamW (the contract's generated checks cover the math)."""

import numpy as np
import pytest
import torch

from falsify.kernels.torch import adamw as ta
from falsify.kernels.triton import adamw as tr
from falsify.reference import adamw as ref

HP = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _state(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g), torch.randn(shape, generator=g),
            torch.randn(shape, generator=g) * 0.1, torch.rand(shape, generator=g) * 0.01)


@pytest.mark.parametrize("impl", [ta, tr])
def test_shape_and_dtype_errors_before_launch(impl):
    p, g, m, v = _state((3, 5))
    with pytest.raises(ValueError, match="shape mismatch"):
        impl.adamw_step(p, g[:, :4], m, v, 1, **HP)
    with pytest.raises(TypeError, match="optimizer state must be float32"):
        impl.adamw_step(p, g, m.half(), v, 1, **HP)
    with pytest.raises(TypeError, match="grad dtype"):
        impl.adamw_step(p, g.half(), m, v, 1, **HP)


def test_reference_rejects_bad_hyperparameters():
    p = np.zeros(3)
    for bad in (dict(step=0), dict(beta2=1.0), dict(eps=0.0), dict(lr=float("nan"))):
        kw = {"step": 1, **HP, **bad}
        with pytest.raises(ValueError):
            ref.adamw_step(p, p, p, p, **kw)


def test_triton_in_place_and_strided_views_match_torch():
    p, g, m, v = _state((6, 9))
    want = ta.adamw_step(p, g, m, v, 4, **HP)
    big = torch.full((8, 30), float("nan"))
    pv = big[1:7, 2:29:3]  # non-unit column stride, offset start
    pv.copy_(p)
    gt = g.t().contiguous().t()  # column-major
    m2, v2 = m.clone(), v.clone()
    tr.adamw_step(pv, gt, m2, v2, 4, **HP, out=pv, m_out=m2, v_out=v2)
    for got, exp in zip((pv, m2, v2), want):
        torch.testing.assert_close(got, exp, rtol=8 * 1.2e-7, atol=16 * 1.2e-7)
    margin = torch.ones_like(big, dtype=torch.bool)
    margin[1:7, 2:29:3] = False
    assert torch.isnan(big[margin]).all(), "kernel wrote outside the view"


def test_triton_rejects_partial_overlap():
    p, g, m, v = _state((4, 8))
    buf = p.clone().reshape(-1)
    with pytest.raises(ValueError, match="overlap"):
        tr.adamw_step(buf[:16].view(4, 4), g[:, :4], m[:, :4], v[:, :4], 1, **HP,
                      out=buf[8:24].view(4, 4))


@pytest.mark.parametrize("impl", [ta, tr])
def test_empty_tensor_is_a_no_op(impl):
    e = torch.zeros(0, 3)
    out = impl.adamw_step(e, e, e, e, 1, **HP)
    assert all(o.shape == (0, 3) for o in out)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_optimizer_class_trains_like_torch_adamw(backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    twin.load_state_dict(model.state_dict())
    ours = ta.AdamW(model.parameters(), lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8,
                    weight_decay=0.1, backend=backend)
    theirs = torch.optim.AdamW(twin.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                               weight_decay=0.1, fused=True)
    x, y = torch.randn(16, 7), torch.randn(16, 3)
    for _ in range(20):
        for net, opt in ((model, ours), (twin, theirs)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        if backend == "torch":
            assert torch.equal(a, b), "the torch path runs torch's fused AdamW kernel"
        else:
            torch.testing.assert_close(a, b, rtol=0, atol=20 * 8 * 1.2e-7)


def test_optimizer_class_requires_every_hyperparameter():
    w = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(TypeError):
        ta.AdamW([w], lr=1e-3, beta1=0.9, eps=1e-8, weight_decay=0.0, backend="torch")
    with pytest.raises(ValueError, match="backend"):
        ta.AdamW([w], lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0,
                 backend="auto")


@pytest.mark.parametrize("k", [0, 10, 20])
def test_eps_placement_is_visible_only_at_small_second_moments(k):
    """Why FALSIFY-AW-001 draws g, m, v scaled by 2^-k, 4^-k: ε inside the square root
    (falsify.mutants.adamw:eps_inside_sqrt) moves θ' by |u|·ε/(2v̂) for v̂ ≫ ε. Unscaled (k = 0)
    that exceeds AW-001's fp32 tolerance 16·eps + 8·eps·|θ'| only near one corner of the input
    box (t = 1000, β2 = 0.95, g ≈ 0, |m| = 0.125, v = 2^-13: v̂ = 1.2e-4, 2.2× the tolerance)
    and is far below it at a typical draw, so random inputs rarely kill it. At k = 10, 20
    (v̂ ≲ 1e-6, down to √v̂ ≲ ε) it is above 10× the tolerance at both points."""
    from falsify.mutants.adamw import eps_inside_sqrt

    eps32 = float(np.finfo(np.float32).eps)
    ratios = []
    for step, beta2, g0, m0, v0 in [(1000, 0.95, 0.0, 0.125, 2.0**-13),  # the corner
                                    (10, 0.999, 0.5, 0.05, 0.004)]:       # a typical draw
        hp = dict(lr=0.01, beta1=0.9, beta2=beta2, eps=1e-8, weight_decay=0.1)
        p = torch.tensor([0.0, 0.5, -1.0])
        g, m, v = (torch.full((3,), x) for x in (g0 * 2.0**-k, m0 * 2.0**-k, v0 * 4.0**-k))
        want = ref.adamw_step(*(t.double().numpy() for t in (p, g, m, v)), step, **hp)[0]
        tol = 16 * eps32 + 8 * eps32 * np.abs(want)
        bug = eps_inside_sqrt(p, g, m, v, step, **hp)[0].double().numpy()
        ratios.append(float((np.abs(bug - want) / tol).max()))
        # the correct kernel passes in every regime
        got = ta.adamw_step(p, g, m, v, step, **hp)[0].double().numpy()
        assert np.all(np.abs(got - want) <= tol)
    corner, typical = ratios
    if k == 0:
        assert 1 < corner < 3 and typical < 0.1, ratios
    else:
        assert min(ratios) > 10, ratios
