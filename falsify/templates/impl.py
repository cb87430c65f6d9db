"""The torch implementation of $kernel, checked against contracts/$kernel-kernel-v1.yaml.

Written by `falsify init`. Write the kernel here, or point equations.$kernel.bindings.torch in
the contract at the function you already have (same signature as the reference).
"""

import torch


def $kernel(x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError(
        "$package.$kernel.$kernel is the stub `falsify init` wrote: write the torch kernel here "
        "(x: float32 tensor [m, n] -> tensor [m, n], the same math as "
        "$package.${kernel}_reference.$kernel), or point equations.$kernel.bindings.torch in "
        "contracts/$kernel-kernel-v1.yaml at your function")
