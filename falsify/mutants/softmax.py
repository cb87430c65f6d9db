"""Softmax mutants: the bugs the softmax contract's checks must catch."""

import falsify.impl.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch

from falsify.impl.launch import next_power_of_2
from falsify.impl.triton import softmax as tri_softmax


def no_max_subtraction(x: torch.Tensor) -> torch.Tensor:
    """exp(x) overflows to inf for x > 88 (fp32) / 11 (fp16): inf/inf = NaN."""
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def sum_over_wrong_axis(x: torch.Tensor) -> torch.Tensor:
    """Normalizer over the rows (dim 0) instead of the columns."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=0, keepdim=True)).to(x.dtype)


def half_precision_normalizer(x: torch.Tensor) -> torch.Tensor:
    """Row sum accumulated in fp16: ~1e-3 relative error, invisible to 'rows sum to 1'
    at a loose tolerance, caught by parity at the derived fp32 tolerance."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.half().sum(dim=-1, keepdim=True).float()).to(x.dtype)


def _largest_power_of_2_at_most(n):
    return next_power_of_2(n + 1) >> 1


def triton_no_tail_mask(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The real Triton kernel launched with BLOCK = largest power of two ≤ n: lanes cover only
    the first BLOCK columns, so the row tail is neither read (missing from max and sum) nor
    written (left as whatever `out` held). Identical to the kernel when n is a power of two."""
    tri_softmax.check_args(x, out)
    return tri_softmax.launch(x, out, block_of=_largest_power_of_2_at_most)


def unstable_when_compiled(x: torch.Tensor) -> torch.Tensor:
    """The honest kernel eagerly; under torch.compile a "fused" path that drops the max
    subtraction on the belief that Inductor's softmax lowering stabilises it (it does not
    for a hand-written exp/sum): exp overflows for logits above 88 and the row becomes NaN.
    Every eager check passes; only compiled code takes the branch."""
    from falsify.impl.torch.softmax import softmax

    if torch.compiler.is_compiling():
        e = torch.exp(x.float())
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
    return softmax(x)
