"""Deliberately wrong variants of $kernel that the contract's checks must catch
(`falsify mutants $kernel-kernel-v1`). Written by `falsify init`: add the bugs you fear most
(a missing mask, a wrong axis, an off-by-one) with the obligation that must catch each.
"""

import torch

from $package.$kernel import $kernel


def computes_in_half(x: torch.Tensor) -> torch.Tensor:
    """Low-precision arithmetic: the input rounded to float16 (11-bit significand)."""
    return $kernel(x.to(torch.float16)).to(x.dtype)
