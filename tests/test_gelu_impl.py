"""Hand-written edge tests for gelu (the contract covers the math; these cover the API)."""

import numpy as np
import pytest
import torch

from falsify.kernels.torch import gelu as gelu_torch
from falsify.kernels.triton import gelu as gelu_triton
from falsify.reference import gelu as gelu_ref

BACKENDS = [gelu_torch, gelu_triton]
IDS = ["torch", "triton"]


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
@pytest.mark.parametrize("approximate", ["tanh ", "erf", None, True])
def test_unknown_form_raises(mod, approximate):
    with pytest.raises(ValueError, match="approximate"):
        mod.gelu(torch.randn(2, 3), approximate)


def test_reference_unknown_form_raises():
    with pytest.raises(ValueError):
        gelu_ref.gelu(np.ones(3), "fast")


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_matches_torch_builtin(mod, approximate):
    x = torch.linspace(-10, 10, 2001).view(3, 667)
    want = torch.nn.functional.gelu(x.double(), approximate=approximate).float()
    torch.testing.assert_close(mod.gelu(x, approximate), want, rtol=8e-7, atol=2e-6)


def test_true_gap_between_forms_and_pv_claim():
    x = np.linspace(-10, 10, 400001)
    gap = np.abs(gelu_ref.gelu_gap(x))
    assert abs(gap.max() - 4.7324e-4) < 1e-8
    assert abs(abs(x[gap.argmax()]) - 2.6989) < 1e-3
    assert gap.max() > 1e-4  # pv's activation-kernel ACT-002 bound is false


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_strided_out(mod):
    x = torch.randn(4, 30)
    buf = torch.full((4, 40), float("nan"))
    out = buf[:, 5:35]
    mod.gelu(x, "tanh", out=out)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x, approximate="tanh"))
    assert torch.isnan(buf[:, :5]).all() and torch.isnan(buf[:, 35:]).all()
