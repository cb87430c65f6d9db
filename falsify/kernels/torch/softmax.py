"""Row softmax over the last dimension, accumulated in fp32 for low-precision inputs."""

import torch

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["softmax"]


def softmax(x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"softmax: x must be a tensor, got {type(x).__name__}")
    require("softmax", CHECKED, x=x)
    if x.dim() < 1 or x.shape[-1] == 0:  # a row of no entries: its normalizer is 0/0
        raise ValueError(f"softmax: the last dimension n = 0 (x {tuple(x.shape)}): no "
                         "distribution")
    # fp16/bf16 inputs: reduce in fp32 (a half-precision sum of 4k terms loses ~3 digits),
    # round once at the end.
    xf = x.float()
    z = xf - xf.amax(dim=-1, keepdim=True)
    e = torch.exp(z)
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
