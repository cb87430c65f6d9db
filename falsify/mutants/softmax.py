"""Softmax mutants: the bugs the softmax contract's checks must catch."""

import torch


def no_max_subtraction(x: torch.Tensor) -> torch.Tensor:
    """exp(x) overflows to inf for x > 88 (fp32) / 11 (fp16): inf/inf = NaN."""
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def sum_over_wrong_axis(x: torch.Tensor) -> torch.Tensor:
    """Normalizer over the rows (dim 0) instead of the columns."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=0, keepdim=True)).to(x.dtype)
