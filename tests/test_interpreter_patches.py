"""falsify.triton_env.patch_language_once_per_launch: under the Triton interpreter a call to a
`@triton.jit` device function reuses the language patches of the launch it runs in, instead of
scanning and re-installing them in every program instance. What a kernel computes is the same,
and the builtins come back after the launch."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import falsify.kernels.triton  # noqa: F401 - installs the patch under the interpreter

# isort: split
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the patch exists only under the Triton interpreter")


@triton.jit
def _scaled(x, s):
    return x * s + tl.full(x.shape, 1.0, tl.float32)  # a builtin inside the device call


@triton.jit
def _twice(x_ptr, y_ptr, n, B: tl.constexpr):
    i = tl.program_id(0) * B + tl.arange(0, B)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    tl.store(y_ptr + i, _scaled(_scaled(x, 2.0), 3.0), mask=m)


def test_a_kernel_with_device_calls_computes_the_same_and_the_builtins_come_back(monkeypatch):
    from triton.runtime import interpreter

    assert getattr(interpreter.InterpretedFunction.__call__, "_falsify_once", False)
    calls = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: calls.append(fn) or real(fn))
    x = torch.arange(37, dtype=torch.float32)
    y = torch.full_like(x, -1.0)
    _twice[(3,)](x, y, 37, B=16)
    np.testing.assert_array_equal(y.numpy(), (x.numpy() * 2 + 1) * 3 + 1)
    # one patch for the launch; none for the 6 device calls (2 in each of 3 programs)
    assert len(calls) == 1
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.full)
