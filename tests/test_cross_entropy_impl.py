"""Hand-written edge tests for cross-entropy and fused linear cross-entropy (the contracts'
generated checks cover the math)."""

import pytest
import torch

from falsify.kernels.torch import cross_entropy as tce
from falsify.kernels.torch import fused_linear_cross_entropy as tfl
from falsify.kernels.triton import cross_entropy as xce
from falsify.kernels.triton import fused_linear_cross_entropy as xfl


@pytest.mark.parametrize("impl", [tce, xce])
def test_labels_out_of_range_raise_before_launch(impl):
    z = torch.randn(3, 5)
    with pytest.raises(ValueError, match="labels outside"):
        impl.cross_entropy(z, torch.tensor([0, 5, 1]))
    with pytest.raises(ValueError, match="labels outside"):
        impl.cross_entropy(z, torch.tensor([0, -1, 1]))  # -1 is not the default ignore_index
    with pytest.raises(ValueError, match="reduction"):
        impl.cross_entropy(z, torch.tensor([0, 1, 1]), reduction="avg")


def test_triton_out_is_for_inference_only():
    z = torch.randn(3, 5, requires_grad=True)
    with pytest.raises(ValueError, match="inference"):
        xce.cross_entropy(z, torch.tensor([0, 1, 2]), reduction="none", out=torch.empty(3))


@pytest.mark.parametrize("impl", [tce, xce])
def test_all_ignored_mean_is_nan_like_torch(impl):
    z = torch.randn(2, 4, requires_grad=True)
    y = torch.tensor([-100, -100])
    ours = impl.cross_entropy(z, y)
    ref = torch.nn.functional.cross_entropy(z, y)
    assert torch.isnan(ours) and torch.isnan(ref)
    ours.backward()
    assert torch.equal(z.grad, torch.zeros_like(z))  # ignored rows: exactly zero gradient


@pytest.mark.parametrize("impl", [tfl, xfl])
def test_flce_precomputed_backward_runs_once(impl):
    x = torch.randn(5, 3, requires_grad=True)
    w = torch.randn(7, 3, requires_grad=True)
    loss = impl.fused_linear_cross_entropy(x, w, torch.tensor([0, 1, 2, 3, 4]),
                                           chunk_size=2)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward runs once"):
        loss.backward()


def test_flce_rejects_mixed_dtypes_and_bad_chunk():
    x = torch.randn(4, 3)
    with pytest.raises(TypeError, match="differs"):
        tfl.fused_linear_cross_entropy(x, torch.randn(5, 3).half(), torch.zeros(4).long())
    with pytest.raises(ValueError, match="chunk_size"):
        tfl.fused_linear_cross_entropy(x, torch.randn(5, 3), torch.zeros(4).long(),
                                       chunk_size=0)


def test_chunk_rows_bounds_the_block():
    for T, V in ((1, 1), (4096, 32768), (3, 10 ** 7), (10 ** 6, 7)):
        c = tfl.chunk_rows(T, V)
        assert c >= 1 and (c * V <= tfl.CHUNK_ELEMENTS or c == 1)
        assert c & (c - 1) == 0
