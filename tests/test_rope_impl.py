"""Hand-written edge tests for rope (the contract covers the math; these cover the API)."""

import numpy as np
import pytest
import torch

from falsify.kernels.torch import rope as rope_torch
from falsify.kernels.triton import rope as rope_triton
from falsify.reference import rope as rope_ref

BACKENDS = [rope_torch, rope_triton]
IDS = ["torch", "triton"]
POS = torch.arange(3)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
@pytest.mark.parametrize("bad", [
    dict(x=torch.ones(1, 3, 2, 5)),                      # odd head dim
    dict(x=torch.ones(3, 2, 4)),                         # [S, H, D]: the layout is [B, S, H, D]
    dict(pos=torch.arange(3, dtype=torch.int32)),        # positions must be int64
    dict(pos=torch.arange(4)),                           # pos length != S
    dict(theta=1.0), dict(theta=-10000.0), dict(theta=True),
])
def test_bad_arguments_raise_before_launch(mod, bad):
    args = dict(x=torch.ones(1, 3, 2, 4), pos=POS, theta=10000.0)
    args.update(bad)
    with pytest.raises((ValueError, TypeError)):
        mod.rope(**args)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_strided_out_and_margins(mod):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 8, 5, generator=g).transpose(2, 3)  # [2, 3, 5, 8], head stride 1
    pos = torch.tensor([7, 0, 4095])
    ref = rope_ref.rope(x.double().numpy(), pos.numpy(), 500000.0)
    buf = torch.full((2, 3, 5, 12), float("nan"))
    out = buf[..., 2:10]
    assert mod.rope(x, pos, 500000.0, out=out) is out
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert torch.isnan(buf[..., :2]).all() and torch.isnan(buf[..., 10:]).all()


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_out_with_autograd_raises(mod):
    x = torch.randn(1, 3, 2, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="autograd"):
        mod.rope(x, POS, 10000.0, out=torch.empty(1, 3, 2, 4))


def test_angle_table_is_float64_accurate_at_long_positions():
    """pos·f_k in fp32 would err by ~pos·2^-24 rad; the table is exact to fp32 rounding."""
    pos = torch.tensor([8191, 131071])
    cos, sin = rope_torch.rope_tables(pos, 64, 10000.0)
    a = rope_ref.angles(pos.numpy(), 64, 10000.0)
    np.testing.assert_allclose(cos.double().numpy(), np.cos(a), atol=6e-8)
    np.testing.assert_allclose(sin.double().numpy(), np.sin(a), atol=6e-8)


def test_triton_backward_is_inverse_rotation():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, 6, 10, generator=g, requires_grad=True)
    pos = torch.tensor([0, 5, 100, 9000])
    y = rope_triton.rope(x, pos, 10000.0)
    (gx,) = torch.autograd.grad(y, [x], y.detach())  # R(−a)·R(a)·x = x
    torch.testing.assert_close(gx, x.detach(), rtol=0, atol=4e-6)
