"""GELU, exact (erf) and tanh forms, as torch.nn.functional.gelu(x, approximate=...).

    exact: gelu(x) = x·Φ(x) = ½·x·erfc(−x/√2)
    tanh:  gelu(x) ≈ ½·x·(1 + tanh(u)) = x·σ(2u),   u = √(2/π)·(x + 0.044715·x³)

The forms differ by at most 4.7324e-4, attained at |x| = 2.6989 (the gap is even in x: both
forms satisfy g(x) − g(−x) = x). The provable-contracts corpus claimed 1e-4; that is false.
erfc is used instead of 1 + erf so the negative tail keeps its relative accuracy.

Derivatives:
    exact: Φ(x) + x·φ(x),   φ(x) = e^(−x²/2)/√(2π)
    tanh:  σ(2u) + x·σ(2u)·(1 − σ(2u))·2·√(2/π)·(1 + 3·0.044715·x²)
"""

import math

import numpy as np

from falsify.reference import wide

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
COEF = 0.044715
MAX_GAP = 4.7324e-4  # max |gelu_tanh − gelu_exact| over ℝ (at |x| = 2.69894)

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _form(approximate):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate


def _sigmoid(z):
    return np.exp(-np.logaddexp(0.0, -z))


def _z(x):
    return 2.0 * SQRT_2_OVER_PI * (x + COEF * x**3)


def gelu(x, approximate):
    x = wide(x)
    if _form(approximate) == "none":
        return 0.5 * x * _erfc(-x / math.sqrt(2.0))
    return x * _sigmoid(_z(x))


def gelu_backward(x, approximate, dy):
    x = wide(x)
    dy = wide(dy)
    if _form(approximate) == "none":
        d = 0.5 * _erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    else:
        s = _sigmoid(_z(x))
        d = s + x * s * (1.0 - s) * 2.0 * SQRT_2_OVER_PI * (1.0 + 3.0 * COEF * x * x)
    return {"x": dy * d}


def gelu_gap(x):
    """gelu(x, 'tanh') − gelu(x, 'none')."""
    return gelu(x, "tanh") - gelu(x, "none")
