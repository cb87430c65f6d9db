"""Hand-written QLoRA tests: equality with LoRA on the dequantized base (both backends, double
quantization, batched input), the frozen-base probe and its mutant, poisoned outputs, and
input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from falsify.kernels.torch import lora as TL
from falsify.kernels.torch import nf4 as TN
from falsify.kernels.torch import qlora as T
from falsify.kernels.triton import qlora as X
from falsify.mutants import qlora as M
from falsify.probes.qlora import frozen_base_probe, matches_lora_probe
from falsify.reference import qlora as R

BACKENDS = {"torch": T, "triton": X}


def _state(o, i, bs, dq, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(o, i, generator=g) * 2 - 1
    st = TN.nf4_quantize(w, bs, dq)
    extra = {"absmax2": st[2], "offset": st[3]} if dq else {}
    return st[0], st[1], extra


def _np(v):
    return v.detach().double().numpy() if v.is_floating_point() else v.numpy()


@pytest.mark.parametrize("name", ["torch", "triton"])
@pytest.mark.parametrize("dq", [False, True])
def test_matches_reference_with_batched_input(name, dq):
    o, i, r = 19, 37, 4
    packed, absmax, extra = _state(o, i, 32, dq)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(2, 3, i, generator=g) * 2 - 1).requires_grad_(True)
    a = (torch.rand(r, i, generator=g) * 2 - 1).requires_grad_(True)
    b = (torch.rand(o, r, generator=g) * 2 - 1).requires_grad_(True)
    dy = torch.rand(2, 3, o, generator=g) * 2 - 1
    y = BACKENDS[name].qlora_linear(x, packed, absmax, (o, i), 32, a, b, 24, r, **extra)
    y.backward(dy)
    args = dict(packed=_np(packed), absmax=_np(absmax), shape=(o, i), blocksize=32,
                **{k: _np(v) for k, v in extra.items()})
    want = R.qlora_linear(_np(x), a=_np(a), b=_np(b), alpha=24, r=r, **args)
    assert np.abs(_np(y) - want).max() < 1e-5
    grads = R.qlora_linear_backward(_np(x), a=_np(a), b=_np(b), alpha=24, r=r, dy=_np(dy),
                                    **args)
    for k, v in (("x", x), ("a", a), ("b", b)):
        # fp32 sums of ~20-sized terms that cancel: a few ulp of the terms, not of the result
        assert np.abs(_np(v.grad) - grads[k]).max() <= 2e-5, k


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dq", [False, True])
def test_frozen_base_probe(backend, dq):
    r = frozen_base_probe(backend, "float32", 5, 37, 19, 4, 8, 64, dq, 3)
    assert r == {"state_identical": True, "state_grad_none": True, "adapters_moved": True}


def test_frozen_base_probe_catches_leak():
    fns = (M.base_gradient_leaks, TN.nf4_quantize, TN.nf4_dequantize, TL.lora_linear)
    r = frozen_base_probe("torch", "float32", 5, 37, 19, 4, 8, 64, False, 3, fns=fns)
    assert not r["state_identical"] and not r["state_grad_none"]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_same_backend_lora_equality(backend, dtype):
    assert matches_lora_probe(backend, dtype, 5, 99, 45, 4, 24, 64, False, 11)["max_diff"] == 0


def test_triton_out_view_and_nibble_mutant():
    o, i, r = 23, 40, 3
    packed, absmax, _ = _state(o, i, 64, False, seed=5)
    x = torch.rand(4, i) * 2 - 1
    a = torch.rand(r, i) * 2 - 1
    b = torch.rand(o, r) * 2 - 1
    o_buf = torch.full((7, 60), float("nan"))
    out = o_buf[1:5, 3:49:2]
    X.qlora_linear(x, packed, absmax, (o, i), 64, a, b, 8, r, out=out)
    margin = torch.ones_like(o_buf, dtype=torch.bool)
    margin[1:5, 3:49:2] = False
    assert torch.all(torch.isnan(o_buf[margin]))
    want = R.qlora_linear(_np(x), _np(packed), _np(absmax), (o, i), 64, _np(a), _np(b), 8, r)
    assert np.abs(_np(out) - want).max() < 1e-5
    bad = M.triton_nibble_order_swapped(x, packed, absmax, (o, i), 64, a, b, 8, r)
    assert np.abs(_np(bad) - want).max() > 1e-2


@pytest.mark.parametrize("mod", [T, X], ids=["torch", "triton"])
def test_bad_state_raises(mod):
    packed, absmax, _ = _state(4, 6, 32, False)
    x, a, b = torch.zeros(2, 6), torch.zeros(2, 6), torch.zeros(4, 2)
    with pytest.raises(ValueError, match="packed"):
        mod.qlora_linear(x, packed, absmax, (4, 7), 32, a, b, 8, 2)
    with pytest.raises(ValueError, match="features"):
        mod.qlora_linear(torch.zeros(2, 5), packed, absmax, (4, 6), 32, a, b, 8, 2)
    with pytest.raises(ValueError, match="blocksize"):
        mod.qlora_linear(x, packed, absmax, (4, 6), 48, a, b, 8, 2)
