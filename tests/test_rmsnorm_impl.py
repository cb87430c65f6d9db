"""Hand-written edge tests for rmsnorm (the contract covers the math; these cover the API)."""

import numpy as np
import pytest
import torch

from falsify.kernels.torch import rmsnorm as rn_torch
from falsify.kernels.triton import rmsnorm as rn_triton
from falsify.reference import rmsnorm as rn_ref

BACKENDS = [rn_torch, rn_triton]
IDS = ["torch", "triton"]


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
@pytest.mark.parametrize("bad", [
    dict(w=torch.ones(7)),                    # w length != hidden
    dict(w=torch.ones(8, 1)),                 # w not 1-D
    dict(eps=0.0), dict(eps=-1e-6), dict(eps=True),
    dict(x=torch.ones(3, 8, dtype=torch.int32)),
])
def test_bad_arguments_raise_before_launch(mod, bad):
    args = dict(x=torch.ones(3, 8), w=torch.ones(8), eps=1e-6)
    args.update(bad)
    with pytest.raises((ValueError, TypeError)):
        mod.rmsnorm(**args)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_out_with_autograd_raises(mod):
    x = torch.randn(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="autograd"):
        mod.rmsnorm(x, torch.ones(8), 1e-6, out=torch.empty(2, 8))


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_wrong_out_shape_raises(mod):
    with pytest.raises(ValueError, match="out"):
        mod.rmsnorm(torch.randn(2, 8), torch.ones(8), 1e-6, out=torch.empty(2, 9))


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_batched_and_strided_inputs(mod):
    """[B, S, H] activations, a transposed (non-contiguous) view and a strided 3-D `out`."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 48, 5, generator=g).transpose(1, 2)  # [2, 5, 48], stride 1 on dim 1
    w = torch.randn(48, generator=g)
    ref = rn_ref.rmsnorm(x.double().numpy(), w.double().numpy(), 1e-5)
    np.testing.assert_allclose(mod.rmsnorm(x, w, 1e-5).numpy(), ref, rtol=1e-5, atol=1e-7)
    buf = torch.full((2, 5, 60), float("nan"))
    out = buf[..., 6:54]
    mod.rmsnorm(x, w, 1e-5, out=out)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-7)
    assert torch.isnan(buf[..., :6]).all() and torch.isnan(buf[..., 54:]).all()
    y, inv = mod.rmsnorm_forward(x, w, 1e-5)
    assert inv.shape == (2, 5) and inv.dtype == torch.float32


def test_triton_batched_backward_matches_reference():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 40, generator=g).requires_grad_()
    w = torch.randn(40, generator=g).requires_grad_()
    dy = torch.randn(3, 7, 40, generator=g)
    rn_triton.rmsnorm(x, w, 1e-6).backward(dy)
    ref = rn_ref.rmsnorm_backward(x.detach().double().numpy(), w.detach().double().numpy(), 1e-6,
                                  dy.double().numpy())
    np.testing.assert_allclose(x.grad.numpy(), ref["x"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), ref["w"], rtol=1e-4, atol=1e-5)


def test_triton_backward_many_rows_uses_partial_sums():
    """m > MAX_BWD_PROGRAMS: programs own several rows; every row's dW must be counted."""
    m = rn_triton.MAX_BWD_PROGRAMS * 2 + 3
    cfg = rn_triton.launch_config(m, 16)
    assert cfg["rows_per_program"] == 3 and cfg["programs"] * 3 >= m
    x = torch.rand(m, 16).add_(0.5).requires_grad_()
    w = torch.ones(16, requires_grad=True)
    rn_triton.rmsnorm(x, w, 1e-6).backward(torch.ones(m, 16))
    ref = rn_ref.rmsnorm_backward(x.detach().double().numpy(), np.ones(16), 1e-6, np.ones((m, 16)))
    np.testing.assert_allclose(w.grad.numpy(), ref["w"], rtol=1e-5)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_zero_row_is_zero_and_empty_batch(mod):
    y = mod.rmsnorm(torch.zeros(2, 8), torch.ones(8), 1e-6)
    assert torch.equal(y, torch.zeros(2, 8))
    assert mod.rmsnorm(torch.zeros(0, 8), torch.ones(8), 1e-6).shape == (0, 8)
