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


def half_precision_normalizer(x: torch.Tensor) -> torch.Tensor:
    """Row sum accumulated in fp16: ~1e-3 relative error, invisible to 'rows sum to 1'
    at a loose tolerance, caught by parity at the derived fp32 tolerance."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.half().sum(dim=-1, keepdim=True).float()).to(x.dtype)
