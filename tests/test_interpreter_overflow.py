"""falsify.triton_env.skip_discarded_overflow_checks: under the Triton interpreter, the integer
overflow sanitizer is skipped exactly where Triton discards its verdict, so a kernel computes
and reports the same with and without it.

The premise is Triton's, and it is held here: the interpreter's options never ask for
debugging, and its sanitizer lets an int32 overflow through unreported. If a Triton release
makes the interpreter report overflows, test_the_interpreter_discards_the_sanitizers_verdict
fails, and the shortcut must go."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import falsify.kernels.triton  # noqa: F401 - installs the shortcut under the interpreter

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the shortcut exists only under the Triton interpreter")


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def int_ops(x_ptr, y_ptr, n: tl.constexpr, shift):
        i = tl.arange(0, n)
        x = tl.load(x_ptr + i * 1)
        # add, sub and mul of int32 tensors and scalars: each goes through the sanitizer
        tl.store(y_ptr + i, (x + shift) * 3 - i)

    return int_ops


def _run(shift: int) -> np.ndarray:
    x = torch.arange(16, dtype=torch.int32) * 1000
    y = torch.empty_like(x)
    _kernel()[(1,)](x, y, 16, shift)
    return y.numpy().copy()


class _TritonsOwnSanitizer:
    """The class's own sanitizer for the duration of the block: the shortcut is an attribute
    of the interpreter's one semantic object, so removing it restores Triton's method."""

    def __enter__(self):
        from triton.runtime import interpreter

        self.semantic = interpreter.interpreter_semantic
        self.shortcut = self.semantic.__dict__.pop("binary_op_sanitize_overflow_impl")
        return self

    def __exit__(self, *exc):
        self.semantic.binary_op_sanitize_overflow_impl = self.shortcut


def test_the_shortcut_is_installed():
    from triton.runtime import interpreter

    impl = interpreter.interpreter_semantic.binary_op_sanitize_overflow_impl
    assert getattr(impl, "_falsify_skipped", False), "the sanitizer was not replaced"


def test_the_interpreter_discards_the_sanitizers_verdict():
    from triton.runtime import interpreter

    assert interpreter.interpreter_semantic.builder.options.debug is False
    with _TritonsOwnSanitizer():
        wrapped = _run(2**31 - 5000)  # x + shift overflows int32 in most lanes: not reported
    expected = ((np.arange(16, dtype=np.int64) * 1000 + 2**31 - 5000) * 3 - np.arange(16))
    assert (wrapped == expected.astype(np.int32)).all()  # two's-complement wrap, no error


@pytest.mark.parametrize("shift", [7, 2**31 - 5000, -(2**31) + 3])
def test_the_kernel_computes_the_same_with_and_without_the_sanitizer(shift):
    fast = _run(shift)
    with _TritonsOwnSanitizer():
        own = _run(shift)
    assert (fast == own).all()


def test_a_debugging_builder_still_gets_the_sanitizer(monkeypatch):
    """The shortcut defers to Triton's method whenever the options do ask for debugging, so
    the sanitizer's assertion is then raised as Triton raises it (wrapped by the interpreter's
    launcher)."""
    import dataclasses

    from triton.runtime import interpreter
    from triton.runtime.errors import InterpreterError

    builder = interpreter.interpreter_semantic.builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True))
    with pytest.raises(InterpreterError, match="int32 overflow detected for operation add"):
        _run(2**31 - 5000)
