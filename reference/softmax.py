"""Row softmax, max-subtracted: y_i = exp(x_i - max x) / sum_j exp(x_j - max x)."""

import numpy as np


def softmax(x):
    x = np.asarray(x, dtype=np.float64)
    z = x - x.max(axis=-1, keepdims=True)  # exp(z) <= 1: no overflow for any finite x
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)
