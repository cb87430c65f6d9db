"""Hand-written edge tests for the Triton softmax wrapper (the contract covers the math)."""

import numpy as np
import pytest
import torch

from falsify.kernels.triton import softmax as sm_triton
from falsify.mutants import softmax as sm_mutants
from falsify.reference import softmax as sm_ref


@pytest.mark.parametrize("x", [torch.ones(3, 4, dtype=torch.int64), torch.ones(3, 0),
                               "not a tensor"])
def test_bad_input_raises_before_launch(x):
    with pytest.raises((TypeError, ValueError)):
        sm_triton.softmax(x)


def test_out_shape_and_dtype_checked():
    with pytest.raises(ValueError, match="out"):
        sm_triton.softmax(torch.randn(2, 5), out=torch.empty(2, 5, dtype=torch.float16))


def test_grad_input_is_refused_not_silently_detached():
    with pytest.raises(RuntimeError, match="backward"):
        sm_triton.softmax(torch.randn(2, 5, requires_grad=True))


def test_batched_strided_input_and_out():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 3, generator=g).transpose(1, 2)  # [2, 3, 37], column stride 3
    ref = sm_ref.softmax(x.double().numpy())
    buf = torch.full((2, 3, 45), float("nan"))
    out = buf[..., 4:41]
    assert sm_triton.softmax(x, out=out) is out
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-9)
    assert torch.isnan(buf[..., :4]).all() and torch.isnan(buf[..., 41:]).all()


def test_no_tail_mask_mutant_only_differs_off_powers_of_two():
    x = torch.randn(2, 64)
    torch.testing.assert_close(sm_mutants.triton_no_tail_mask(x), sm_triton.softmax(x))
    x = torch.randn(2, 65)
    out = torch.full((2, 65), float("nan"))
    sm_mutants.triton_no_tail_mask(x, out=out)
    assert torch.isnan(out[:, 64:]).all()  # the tail column is never written
