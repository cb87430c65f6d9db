"""Hand-written edge cases for the gemm kernels (the contract covers the math; these pin the
API rules: buffer checks before launch, aliasing, empty and K = 0 products, dtype rules)."""

import pytest
import torch

from falsify.kernels.torch import gemm as tgemm
from falsify.kernels.triton import gemm as xgemm

BACKENDS = {"torch": tgemm.gemm, "triton": xgemm.gemm}


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g) * 2 - 1).to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(5, 6), (4, 7), (7, 5), (35,)])
def test_undersized_or_misshaped_out_raises_before_writing(backend, shape):
    a, b = _rand(5, 3), _rand(3, 7, seed=1)
    buf = torch.full((80,), float("nan"))
    out = buf[:torch.Size(shape).numel()].view(shape)
    with pytest.raises(ValueError, match="out has shape"):
        BACKENDS[backend](a, b, out=out)
    assert torch.isnan(buf).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_update_of_c(backend):
    a, b, c = _rand(9, 20), _rand(20, 17, seed=1), _rand(9, 17, seed=2)
    want = 2.0 * a.double() @ b.double() - 0.5 * c.double()
    res = BACKENDS[backend](a, b, c, alpha=2.0, beta=-0.5, out=c)
    assert res.data_ptr() == c.data_ptr()
    assert torch.allclose(c.double(), want, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_overlapping_an_input_raises(backend):
    buf = _rand(64)
    a = buf[:12].view(3, 4)
    b = _rand(4, 4, seed=1)
    with pytest.raises(ValueError, match="overlaps a"):
        BACKENDS[backend](a, b, out=buf[8:20].view(3, 4))
    cbuf = _rand(40, seed=2)
    with pytest.raises(ValueError, match="exactly c"):  # shifted by one element
        BACKENDS[backend](a, b, cbuf[:12].view(3, 4), beta=1.0, out=cbuf[1:13].view(3, 4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_zero_gives_beta_c_and_m_zero_is_empty(backend):
    c = _rand(4, 5, seed=3)
    y = BACKENDS[backend](torch.empty(4, 0), torch.empty(0, 5), c, beta=-2.0)
    assert torch.equal(y, -2.0 * c)
    assert torch.equal(BACKENDS[backend](torch.empty(4, 0), torch.empty(0, 5)),
                       torch.zeros(4, 5))
    assert BACKENDS[backend](torch.empty(0, 3), _rand(3, 5)).shape == (0, 5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_inputs_into_fp32_out_and_dtype_rules(backend):
    a = torch.full((2, 40), 32768.0).half()
    b = torch.full((40, 3), -32768.0).half()
    out = torch.empty(2, 3)
    BACKENDS[backend](a, b, out=out)
    assert torch.equal(out, torch.full((2, 3), -40.0 * 2**30))  # exact in fp32; fp16 max 65504
    with pytest.raises(TypeError):
        BACKENDS[backend](a, b, out=torch.empty(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError):
        BACKENDS[backend](a, b.float())
    with pytest.raises(TypeError, match="trans_a must be a bool"):
        BACKENDS[backend](a, b, trans_a="T")


@pytest.mark.parametrize("backend", BACKENDS)
def test_broadcast_input_with_zero_stride(backend):
    a = _rand(1, 33).expand(18, 33)  # stride 0 rows: reading is fine, only `out` must not alias
    b = _rand(33, 20, seed=1)
    y = BACKENDS[backend](a, b)
    assert torch.allclose(y.double(), a.double() @ b.double(), atol=1e-5)
    with pytest.raises(ValueError, match="overlapping elements"):
        BACKENDS[backend](a, b, out=torch.empty(1, 20).expand(18, 20))


def test_triton_out_with_autograd_raises():
    a = _rand(3, 4).requires_grad_()
    with pytest.raises(RuntimeError, match="autograd"):
        xgemm.gemm(a, _rand(4, 2), out=torch.empty(3, 2))


def test_launch_config_and_extent():
    cfg = xgemm.launch_config(97, 1, 130)
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]) == (64, 16, 32)
    assert (cfg["grid_m"], cfg["grid_n"], cfg["k_tiles"]) == (2, 1, 5)
    view = torch.empty(10, 13)[:, :7]
    assert xgemm.extent(view.shape, view.stride()) == 9 * 13 + 7
    assert xgemm.extent((0, 5), (5, 1)) == 0
