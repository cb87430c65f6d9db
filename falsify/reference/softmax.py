"""Row softmax, max-subtracted: y_i = exp(x_i - max x) / sum_j exp(x_j - max x)."""

import numpy as np

from falsify.reference import wide


def softmax(x):
    x = wide(x)
    if x.ndim < 1 or x.shape[-1] == 0:  # a row of no entries: its normalizer is 0/0
        raise ValueError(f"softmax: the last dimension n = 0 (x {x.shape}): no distribution")
    z = x - x.max(axis=-1, keepdims=True)  # exp(z) <= 1: no overflow for any finite x
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)
