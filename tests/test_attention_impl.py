"""Hand-written edge cases for the attention kernels: argument errors before launch, the lse
gradient against an independent oracle (torch autograd through the materialized logsumexp; the
contract's FALSIFY-ATT-020 checks it against the reference backward), an independent oracle
for the forward (torch's SDPA), strided inputs as the model passes them, and the peak-memory
probe's own sanity."""

import pytest
import torch
import torch.nn.functional as F

from falsify.kernels.torch import attention as tatt
from falsify.kernels.triton import attention as xatt

BACKENDS = {"torch": tatt, "triton": xatt}


def _qkv(b=1, hq=4, hkv=2, s=37, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, s, d, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_calls_raise_before_launch(backend):
    mod = BACKENDS[backend]
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="multiple of Hkv"):
        mod.attention(q[:, :3], k, v)
    with pytest.raises(ValueError, match="matching q"):
        mod.attention(q, k[:, :, :5], v[:, :, :5])
    with pytest.raises(TypeError):
        mod.attention(q, k.half(), v)
    buf = torch.full((q.numel() + 64,), float("nan"))
    with pytest.raises(ValueError, match="q's shape"):
        mod.attention(q, k, v, out=buf[: 4 * 36 * 16].view(1, 4, 36, 16))  # one row short
    assert torch.isnan(buf).all()
    with pytest.raises(ValueError, match="overlaps q"):
        mod.attention(q, k, v, out=q)
    with pytest.raises(ValueError, match="scale"):
        mod.attention(q, k, v, scale=float("nan"))


def test_triton_rejects_head_dim_over_one_tile():
    q, k, v = _qkv(hq=1, hkv=1, s=2, d=257)
    with pytest.raises(ValueError, match="head dim 257"):
        xatt.attention(q, k, v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_matches_torch_sdpa_with_gqa(backend, causal):
    q, k, v = _qkv(b=2, hq=6, hkv=2, s=70, d=24)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    got = BACKENDS[backend].attention(q, k, v, causal=causal)
    assert torch.allclose(got, want, atol=2e-6, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lse_gradient(backend):
    """A loss on lse adds dlse_i·P_ij to dS; compare with autograd through the materialized
    logsumexp."""
    q, k, v = _qkv(s=33, d=8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = BACKENDS[backend].flash_attention(*leaves, causal=True)
    w_o, w_l = torch.randn_like(o), torch.randn_like(lse)
    got = torch.autograd.grad((o * w_o).sum() + (lse * w_l).sum(), leaves)

    ref_leaves = [t.double().clone().requires_grad_() for t in (q, k, v)]
    qd, kd, vd = ref_leaves
    kk, vv = kd.repeat_interleave(2, 1), vd.repeat_interleave(2, 1)
    s = (qd @ kk.transpose(-1, -2)) / 8 ** 0.5
    s = s.masked_fill(torch.ones(33, 33, dtype=torch.bool).triu(1), float("-inf"))
    ref_lse = torch.logsumexp(s, -1)
    ref_o = torch.softmax(s, -1) @ vv
    want = torch.autograd.grad((ref_o * w_o.double()).sum() + (ref_lse * w_l.double()).sum(),
                               ref_leaves)
    assert torch.allclose(lse.double(), ref_lse, atol=1e-5)
    for g, w in zip(got, want):
        assert torch.allclose(g.double(), w, atol=2e-5 * (1 + w.abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_as_the_model_passes_them(backend):
    """The model projects to [B, S, H, D] and transposes: q/k/v arrive non-contiguous."""
    x = torch.randn(2, 45, 4, 16)
    kv = torch.randn(2, 45, 2, 16)
    q, k, v = x.transpose(1, 2), kv.transpose(1, 2), (kv * 0.5).transpose(1, 2)
    got = BACKENDS[backend].attention(q, k, v)
    want = tatt.attention_naive(q.contiguous(), k.contiguous(), v.contiguous())
    assert torch.allclose(got, want, atol=2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_explicit_scale(backend):
    q, k, v = _qkv(b=0)
    assert BACKENDS[backend].attention(q, k, v).shape == q.shape
    q, k, v = _qkv(s=20, d=4)
    got = BACKENDS[backend].attention(q, k, v, scale=0.3)
    want = tatt.attention_naive(q, k, v, scale=0.3)
    assert torch.allclose(got, want, atol=2e-6)


def test_head_dim_padding_for_the_cuda_kernels_changes_nothing():
    """On CUDA a head dim that is not a whole number of 16-byte vectors is padded with zero
    columns before the fused kernel (an H200 had no kernel for d = 1 in fp32). The padding is
    exact: outputs and gradients equal the unpadded call's, run here on the CPU kernel."""
    import torch
    import torch.nn.functional as F

    from falsify.kernels.torch import attention as A

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    dy = torch.randn(1, 2, 5, 3, generator=g, dtype=torch.float64)
    scale = 3 ** -0.5
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    gp = torch.autograd.grad(plain, (q, k, v), dy)
    qp, kp, vp = A._pad_head_dim(q, k, v, 5)
    assert qp.shape[-1] == 8 and bool((qp[..., 3:] == 0).all())
    padded = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale)
    assert bool((padded[..., 3:] == 0).all())
    gq = torch.autograd.grad(padded[..., :3], (q, k, v), dy)
    torch.testing.assert_close(padded[..., :3], plain, rtol=0, atol=1e-15)
    for a, b in zip(gq, gp):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)
