"""The float64 numpy reference for $kernel: the math, written plainly, that
contracts/$kernel-kernel-v1.yaml compares the torch kernel against.

Written by `falsify init`; replace the body with the definition, not with a call to the kernel
under test (a reference that calls the implementation checks nothing).
"""

import numpy as np


def $kernel(x: np.ndarray) -> np.ndarray:
    raise NotImplementedError(
        "$package.${kernel}_reference.$kernel is the stub `falsify init` wrote: write the "
        "float64 numpy reference here (x: float64 array [m, n] -> array [m, n]), the plain "
        "math of the equation in contracts/$kernel-kernel-v1.yaml")
