"""Hand-written edge cases of the fused linear KD kernel
(falsify/contracts/fused-linear-kd-kernel-v1.yaml)
that the contract's generated checks do not spell out: chunk larger than N, N not a multiple of
the chunk, every label ignored, the refusal of bad shapes and dtypes with a clear message, and
an independent oracle (F.kl_div + F.cross_entropy on the materialised logits)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from falsify.kernels.torch import fused_linear_kd as tk
from falsify.kernels.triton import fused_linear_kd as tt
from falsify.reference import fused_linear_kd as ref

BACKENDS = {"torch": tk, "triton": tt}
EPS32 = float(np.finfo(np.float32).eps)


def _inputs(N, d, V, seed=0, ignore_every=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, d, generator=g) / d ** 0.5
    w = torch.randn(V, d, generator=g)
    zt = torch.randn(N, V, generator=g) * 3
    y = torch.randint(0, V, (N,), generator=g)
    if ignore_every:
        y[::ignore_every] = -100
    return x, w, zt, y


def _run(mod, x, w, zt, y, T=2.0, alpha=0.5, chunk=None, k=None):
    a = x.clone().requires_grad_(True)
    b = w.clone().requires_grad_(True)
    if k is None:
        out = mod.fused_linear_kd(a, b, zt, y, temperature=T, alpha=alpha, chunk_size=chunk)
    else:
        out = mod.fused_linear_kd_from_topk(a, b, zt, y, temperature=T, alpha=alpha, k=k,
                                            chunk_size=chunk)
    out[0].backward()
    return [float(o.detach()) for o in out], a.grad, b.grad


def _tol(d, V):
    # FALSIFY-FLKD-001's fp32 bound for |z| ≤ 16, plenty for these unit-scale logits
    return (16 * (72 + 66 * (math.ceil(math.log2(V + 1)) + 2) + 2 * d * d)
            + 40 * (math.ceil(math.log2(V + 1)) + 3) + 2 * d * d) * EPS32


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("N,chunk", [(5, 64), (13, 4), (13, 1), (8, 8)])
def test_chunking_matches_reference(backend, N, chunk):
    """Chunk larger than N (one partial chunk), N mod C ≠ 0 (a tail chunk), C = 1, C | N."""
    d, V = 6, 37
    x, w, zt, y = _inputs(N, d, V)
    got, gx, gw = _run(BACKENDS[backend], x, w, zt, y, chunk=chunk)
    want = ref.fused_linear_kd(x.double().numpy(), w.double().numpy(), zt.double().numpy(),
                               y.numpy(), 2.0, 0.5)
    assert np.allclose(got, want, rtol=(N + 4) * EPS32, atol=_tol(d, V))
    g = ref.fused_linear_kd_backward(x.double().numpy(), w.double().numpy(),
                                     zt.double().numpy(), y.numpy(), 2.0, 0.5, dy=1.0)
    atol = 10 * (36 + 6 + 2 * d * d + V + N) * EPS32  # FALSIFY-FLKD-002 with |dy| = 1
    assert np.abs(gx.double().numpy() - g["x"]).max() <= atol
    assert np.abs(gw.double().numpy() - g["weight"]).max() <= atol


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_result_independent_of_chunk_size(backend):
    x, w, zt, y = _inputs(11, 4, 29, seed=3)
    runs = [_run(BACKENDS[backend], x, w, zt, y, chunk=c) for c in (1, 3, 11, 100)]
    for got, gx, gw in runs[1:]:
        assert np.allclose(got, runs[0][0], rtol=0, atol=2 * _tol(4, 29))
        assert torch.allclose(gx, runs[0][1], atol=1e-6)
        assert torch.allclose(gw, runs[0][2], atol=1e-6)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("k", [None, 3])
def test_all_labels_ignored(backend, k):
    """No counted token: L, KL, CE are NaN (a mean over no token) and no gradient flows."""
    x, w, zt, y = _inputs(6, 4, 10, ignore_every=0)
    y[:] = -100
    got, gx, gw = _run(BACKENDS[backend], x, w, zt, y, chunk=4, k=k)
    assert all(math.isnan(v) for v in got)
    assert torch.count_nonzero(gx) == 0 and torch.count_nonzero(gw) == 0


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_matches_torch_kl_div_oracle(backend):
    """An independent formulation: F.kl_div(log_target=True, batchmean over the valid rows)
    and F.cross_entropy on x @ W.T, forward and gradients."""
    x, w, zt, y = _inputs(10, 8, 50, seed=5)
    for T, alpha in ((1.0, 0.5), (4.0, 0.9), (2.0, 0.0), (2.0, 1.0)):
        got, gx, gw = _run(BACKENDS[backend], x, w, zt, y, T=T, alpha=alpha, chunk=3)
        a = x.clone().requires_grad_(True)
        b = w.clone().requires_grad_(True)
        z = a @ b.t()
        valid = y != -100
        kl = F.kl_div(F.log_softmax(z[valid] / T, -1), F.log_softmax(zt[valid] / T, -1),
                      log_target=True, reduction="batchmean")
        ce = F.cross_entropy(z, y, ignore_index=-100)
        loss = alpha * T ** 2 * kl + (1 - alpha) * ce
        loss.backward()
        assert np.allclose(got, [float(loss), float(kl), float(ce)], rtol=1e-5, atol=1e-5)
        assert torch.allclose(gx, a.grad, atol=1e-5) and torch.allclose(gw, b.grad, atol=1e-5)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_topk_entry_point_and_repeated_indices(backend):
    """fused_linear_kd_topk (the application's call) equals the reference, with duplicate
    indices in a row adding up (scatter-add in torch, atomics in Triton)."""
    x, w, zt, y = _inputs(5, 4, 12, seed=7)
    vals, idx = tk.topk_stable(zt, 3)
    idx = idx.clone()
    vals = vals.clone()
    idx[1, 2] = idx[1, 0]  # a repeated index
    a = x.clone().requires_grad_(True)
    b = w.clone().requires_grad_(True)
    out = BACKENDS[backend].fused_linear_kd_topk(a, b, vals, idx, y, temperature=2.0,
                                                 alpha=0.5, chunk_size=2)
    want = ref.fused_linear_kd_topk(x.double().numpy(), w.double().numpy(),
                                    vals.double().numpy(), idx.numpy(), y.numpy(), 2.0, 0.5)
    assert np.allclose([float(o.detach()) for o in out], want, atol=1e-5)
    out[0].backward()
    c = (a.detach() @ b.detach().t()).double().requires_grad_(True)
    lo = F.log_softmax(vals.double() / 2.0, -1)
    valid = y != -100
    kl = (lo.exp() * (lo - F.log_softmax(c / 2.0, -1).gather(1, idx))).sum(1)[valid].mean()
    ce = F.cross_entropy(c, y, ignore_index=-100)
    (gz,) = torch.autograd.grad(0.5 * 4.0 * kl + 0.5 * ce, [c])
    assert torch.allclose(a.grad.double(), gz @ w.double(), atol=1e-5)


def test_logged_terms_and_teacher_carry_no_gradient():
    x, w, zt, y = _inputs(6, 4, 10)
    zt.requires_grad_(True)
    a = x.clone().requires_grad_(True)
    loss, kl, ce = tk.fused_linear_kd(a, w, zt, y, temperature=2.0, alpha=0.5)
    assert loss.requires_grad and not kl.requires_grad and not ce.requires_grad
    loss.backward()
    assert zt.grad is None and a.grad is not None


def test_backward_runs_once():
    x, w, zt, y = _inputs(6, 4, 10)
    a = x.clone().requires_grad_(True)
    loss = tk.fused_linear_kd(a, w, zt, y, temperature=2.0, alpha=0.5)[0]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward runs once"):
        loss.backward()


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_refusals_name_the_argument(backend):
    mod = BACKENDS[backend]
    x, w, zt, y = _inputs(6, 4, 10)
    kw = dict(temperature=2.0, alpha=0.5)
    cases = [
        (dict(x=x[0]), ValueError, "x must be a 2-D tensor"),
        (dict(weight=w[:, :3]), ValueError, r"weight must be \[V, d=4\]"),
        (dict(teacher_logits=zt[:, :9]), ValueError, r"teacher_logits must be \[N, V\]"),
        (dict(labels=y[:5]), ValueError, "labels must be a 1-D tensor of length N=6"),
        (dict(labels=y.float()), TypeError, "labels dtype"),
        (dict(x=x.double(), weight=w.double()), TypeError, "unsupported dtype float64 for x"),
        (dict(weight=w.half()), TypeError, "differs from weight dtype"),
        (dict(teacher_logits=zt.double()), TypeError, "float64 for teacher_logits"),
        (dict(temperature=0.0), ValueError, "temperature=0.0"),
        (dict(alpha=1.5), ValueError, "alpha=1.5"),
        (dict(chunk_size=0), ValueError, "chunk_size=0"),
        (dict(labels=torch.full((6,), 10)), ValueError, r"labels outside \[0, 10\)"),
        (dict(weight=w[:0]), ValueError, "V = 0"),
    ]
    for change, exc, msg in cases:
        args = dict(x=x, weight=w, teacher_logits=zt, labels=y, **kw)
        args.update(change)
        with pytest.raises(exc, match=msg):
            mod.fused_linear_kd(**args)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_topk_refusals(backend):
    mod = BACKENDS[backend]
    x, w, zt, y = _inputs(6, 4, 10)
    vals, idx = tk.topk_stable(zt, 3)
    kw = dict(temperature=2.0, alpha=0.5)
    with pytest.raises(ValueError, match="must both be"):
        mod.fused_linear_kd_topk(x, w, vals, idx[:, :2], y, **kw)
    with pytest.raises(TypeError, match="topk_indices dtype torch.int32"):
        mod.fused_linear_kd_topk(x, w, vals, idx.int(), y, **kw)
    bad = idx.clone()
    bad[0, 0] = 10
    with pytest.raises(ValueError, match="topk_indices outside the vocabulary"):
        mod.fused_linear_kd_topk(x, w, vals, bad, y, **kw)
    with pytest.raises(ValueError, match=r"k=11: must lie in \[1, V=10\]"):
        mod.fused_linear_kd_from_topk(x, w, zt, y, k=11, **kw)


def test_topk_renorm_bound_holds_and_shrinks_with_k():
    """The derived bound holds in float64, shrinks as k grows (H(ε) + ε·c increases with ε for
    c ≥ log V, and ε ≤ 1 − 1/V) and vanishes at k = V up to float64 rounding of ε
    (falsify/reference/fused_linear_kd.py)."""
    x, w, zt, y = _inputs(16, 8, 60, seed=11)
    args = (x.double().numpy(), w.double().numpy(), zt.double().numpy(), y.numpy())
    for T in (1.0, 2.0):
        prev = math.inf
        for k in (1, 5, 30, 59, 60):
            exact, bound = ref.topk_renorm_bound(*args, T, k)
            assert exact <= bound + 1e-12
            assert bound <= prev + 1e-12  # more of the teacher kept, smaller bound
            prev = bound
        assert ref.topk_renorm_bound(*args, T, 60)[1] <= 1e-12
