"""SiLU and SwiGLU: silu(g) = g·σ(g), swiglu(gate, up) = silu(gate)·up, elementwise.

Backward of y = silu(g)·u with upstream dy:
    silu'(g) = σ(g) + g·σ(g)·(1 − σ(g)) = σ(g)·(1 + g·(1 − σ(g)))
    d_gate   = dy·u·σ(g)·(1 + g·(1 − σ(g)))
    d_up     = dy·silu(g)
σ is evaluated as exp(−log(1 + e^(−g))) (np.logaddexp): no overflow for any finite g and full
relative accuracy in both tails.
"""

import numpy as np

from falsify.reference import wide


def sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -wide(x)))


def silu(x):
    x = wide(x)
    return x * sigmoid(x)


def swiglu(gate, up):
    return silu(gate) * wide(up)


def swiglu_backward_pair(gate, up, dy):
    """(d_gate, d_up)."""
    g, u, dy = (wide(a) for a in (gate, up, dy))
    s = sigmoid(g)
    return dy * u * s * (1.0 + g * (1.0 - s)), dy * g * s


def swiglu_backward(gate, up, dy):
    d_gate, d_up = swiglu_backward_pair(gate, up, dy)
    return {"gate": d_gate, "up": d_up}


def silu_backward(x, dy):
    s = sigmoid(x)
    x = wide(x)
    return {"x": wide(dy) * s * (1.0 + x * (1.0 - s))}
