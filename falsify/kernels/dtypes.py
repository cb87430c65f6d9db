"""The dtypes each kernel accepts: exactly the ones its contract checks, refused otherwise.

A kernel that takes any floating tensor computes float64 in float32 and hands back float64
numbers no check has vetted, or runs bfloat16 through a path nobody ran. So every entry point
names the dtypes it accepts and refuses the rest with `UnsupportedDtype` (a TypeError naming
the dtype) before any work. The contracts' `dtypes` checks probe every other dtype and fail
on a kernel that accepts one (falsify/harness/kinds/dtypes.py).

- CHECKED: float32 and float16, which the contracts run on every backend here.
- bfloat16 on Triton is declared GPU-only (the interpreter truncates bf16 casts), so the
  Triton wrappers accept it only when compiling for a GPU (`triton_dtypes`). On the torch
  backend no contract runs it yet, so it is refused rather than trusted unchecked.
"""

from __future__ import annotations

import os

import torch

CHECKED = (torch.float32, torch.float16)
FP32 = (torch.float32,)


class UnsupportedDtype(TypeError):
    """A tensor in a dtype the kernel's contract does not check."""


def triton_dtypes(base: tuple = CHECKED) -> tuple:
    """`base`, plus bfloat16 when Triton compiles for a GPU (not under the interpreter)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return base
    return base + (torch.bfloat16,)


def _name(dt) -> str:
    return str(dt).removeprefix("torch.")


def require(kernel: str, allowed: tuple, **tensors) -> None:
    """Raise UnsupportedDtype for the first tensor whose dtype is not in `allowed`."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype not in allowed:
            why = (" (the Triton interpreter truncates bf16 casts: run on a GPU)"
                   if t.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
                   and torch.bfloat16 not in allowed and "triton" in kernel else "")
            raise UnsupportedDtype(
                f"{kernel}: unsupported dtype {_name(t.dtype)} for {name}; its contract checks "
                f"{', '.join(map(_name, allowed))}{why}")
