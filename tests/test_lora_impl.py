"""Hand-written LoRA tests: PEFT interop (forward, rsLoRA, merge, default init), the init-step
probe, strided / poisoned outputs, N-D inputs and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from falsify.kernels.torch import lora as T
from falsify.kernels.triton import lora as X
from falsify.probes.lora import init_step_probe
from falsify.reference import lora as R

peft = pytest.importorskip("peft")

BACKENDS = {"torch": T, "triton": X}


class _One(torch.nn.Module):
    def __init__(self, in_f, out_f):
        super().__init__()
        self.proj = torch.nn.Linear(in_f, out_f, bias=False)

    def forward(self, x):
        return self.proj(x)


def _peft_layer(in_f, out_f, r, alpha, rslora, init=False, seed=0):
    """PEFT's own LoRA layer around a bias-free nn.Linear, through its public API."""
    torch.manual_seed(seed)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=["proj"], use_rslora=rslora,
                          init_lora_weights=init, lora_dropout=0.0)
    return peft.get_peft_model(_One(in_f, out_f), cfg).base_model.model.proj


@pytest.mark.parametrize("name", ["torch", "triton"])
@pytest.mark.parametrize("rslora", [False, True])
def test_matches_peft_lora_linear(name, rslora):
    in_f, out_f, r, alpha = 37, 19, 4, 24
    layer = _peft_layer(in_f, out_f, r, alpha, rslora)
    with torch.no_grad():  # init_lora_weights=False leaves B random: a non-trivial adapter
        layer.lora_B["default"].weight.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, in_f)
    want = layer(x)
    w = layer.base_layer.weight.detach().clone()  # merge() below rewrites it in place
    a = layer.lora_A["default"].weight.detach()
    b = layer.lora_B["default"].weight.detach()
    got = BACKENDS[name].lora_linear(x, w, a, b, alpha, r, rslora=rslora)
    assert layer.scaling["default"] == pytest.approx(R.lora_scale(alpha, r, rslora))
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    layer.merge()  # PEFT folds s·B·A into the base weight
    merged = BACKENDS[name].lora_merge(w, a, b, alpha, r, rslora=rslora)
    torch.testing.assert_close(merged, layer.base_layer.weight.detach(), rtol=1e-6, atol=1e-6)


def test_init_matches_peft_default_distribution():
    in_f, out_f, r = 256, 8, 16
    layer = _peft_layer(in_f, out_f, r, 8, False, init=True)
    a_peft = layer.lora_A["default"].weight.detach()
    assert torch.all(layer.lora_B["default"].weight == 0)
    a, b = T.lora_init(in_f, out_f, r, seed=3)
    bound = 1 / math.sqrt(in_f)
    for m in (a_peft, a):
        assert m.abs().max() <= bound and m.abs().max() > 0.9 * bound
        assert abs(m.var().item() * 3 * in_f - 1) < 7 * math.sqrt(0.8 / m.numel())
    assert torch.all(b == 0) and b.shape == (out_f, r) and a.shape == (r, in_f)
    ar, br = R.lora_init(in_f, out_f, r, seed=3)
    assert np.abs(ar).max() <= bound and np.all(br == 0)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_init_step_probe(backend, dtype):
    r = init_step_probe(backend, dtype, m=5, in_features=37, out_features=19, rank=4, alpha=8,
                        seed=3)
    assert r["delta"] == 0 and r["da_max"] == 0 and r["db_max"] > 0
    assert r["w_grad_none"] and r["a_bound_ok"]


def test_init_step_probe_sees_a_mutant():
    from falsify.mutants import lora as M

    r = init_step_probe("torch", "float32", m=5, in_features=37, out_features=19, rank=4,
                        alpha=8, seed=3, fns=(M.b_init_nonzero, T.lora_linear))
    assert r["delta"] > 0 and r["da_max"] > 0
    r = init_step_probe("torch", "float32", m=5, in_features=37, out_features=19, rank=4,
                        alpha=8, seed=3, fns=(T.lora_init, M.frozen_w_gets_gradient))
    assert not r["w_grad_none"]


def test_triton_out_view_poisoned_margins():
    x_buf = torch.full((9, 70), float("nan"))
    x = x_buf[1:6, 2:62:2]  # 5 x 30 strided view
    x.copy_(torch.rand(5, 30) * 2 - 1)
    w = (torch.rand(40, 30) * 2 - 1).T.contiguous().T  # column-major storage
    a = torch.rand(3, 30) * 2 - 1
    b = torch.rand(40, 3) * 2 - 1
    o_buf = torch.full((8, 100), float("nan"))
    out = o_buf[2:7, 10:90:2]
    X.lora_linear(x, w, a, b, 8, 3, out=out)
    margin = torch.ones_like(o_buf, dtype=torch.bool)
    margin[2:7, 10:90:2] = False
    assert torch.all(torch.isnan(o_buf[margin]))
    ref = R.lora_linear(*(v.double().numpy() for v in (x, w, a, b)), 8, 3)
    assert np.abs(out.double().numpy() - ref).max() < 1e-4


@pytest.mark.parametrize("name", ["torch", "triton"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_nd_input_and_gradients(name, seed):
    torch.manual_seed(seed)
    x = (torch.rand(2, 3, 17) * 2 - 1).requires_grad_(True)
    w = torch.rand(6, 17) * 2 - 1
    a = (torch.rand(2, 17) * 2 - 1).requires_grad_(True)
    b = (torch.rand(6, 2) * 2 - 1).requires_grad_(True)
    dy = torch.rand(2, 3, 6) * 2 - 1
    y = BACKENDS[name].lora_linear(x, w, a, b, 24, 2)
    y.backward(dy)
    args = [v.detach().double().numpy() for v in (x, w, a, b)]
    assert np.abs(y.detach().double().numpy() - R.lora_linear(*args, 24, 2)).max() < 1e-5
    want = R.lora_linear_backward(*args, 24, 2, dy=dy.double().numpy())
    # Each gradient is a sum of products; fp32 rounding is bounded relative to the sum of the
    # terms' magnitudes (the same backward on |x|, |w|, |a|, |b|, |dy|), not to the result,
    # which can cancel to near 0. Chains are at most 17 + 6 long: 64·eps32 covers them.
    mag = R.lora_linear_backward(*(np.abs(v) for v in args), 24, 2,
                                 dy=np.abs(dy.double().numpy()))
    for k, v in (("x", x), ("a", a), ("b", b)):
        err = np.abs(v.grad.double().numpy() - want[k])
        assert np.all(err <= 64 * 2.0**-23 * np.abs(mag[k])), (k, float(err.max()))


def test_reference_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, w, a, b = (rng.uniform(-1, 1, s) for s in ((3, 5), (4, 5), (2, 5), (4, 2)))
    dy = rng.uniform(-1, 1, (3, 4))
    g = R.lora_linear_backward(x, w, a, b, 8, 2, dy=dy)
    h = 1e-6
    for name, v in (("x", x), ("a", a), ("b", b)):
        num = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            v[idx] += h
            up = (R.lora_linear(x, w, a, b, 8, 2) * dy).sum()
            v[idx] -= 2 * h
            dn = (R.lora_linear(x, w, a, b, 8, 2) * dy).sum()
            v[idx] += h
            num[idx] = (up - dn) / (2 * h)
        assert np.abs(num - g[name]).max() < 1e-6, name


@pytest.mark.parametrize("mod", [R, T, X], ids=["reference", "torch", "triton"])
def test_bad_shapes_raise(mod):
    def arr(s):
        z = np.zeros(s, np.float32)
        return z if mod is R else torch.from_numpy(z)

    with pytest.raises(ValueError, match="features"):
        mod.lora_linear(arr((2, 5)), arr((3, 4)), arr((2, 4)), arr((3, 2)), 8, 2)
    with pytest.raises(ValueError, match="a must be"):
        mod.lora_linear(arr((2, 4)), arr((3, 4)), arr((2, 4)), arr((3, 2)), 8, 3)
    with pytest.raises(ValueError, match="rank"):
        mod.lora_linear(arr((2, 4)), arr((3, 4)), arr((0, 4)), arr((3, 0)), 8, 0)
