"""GEMM, BLAS semantics: C = α·op(A)·op(B) + β·C, op(X) = Xᵀ when trans_x, else X.

Shapes: op(A) is [M, K], op(B) is [K, N], C and the result are [M, N].
β = 0 means C is not read at all (BLAS rule): a C holding NaN or garbage does not leak into the
result, and C may be omitted. α is an ordinary multiplication (α = 0 with NaN in A gives NaN).

Backward (L a scalar loss, G = ∂L/∂result, all derivatives of a bilinear map):
    ∂L/∂op(A) = α·G·op(B)ᵀ            [M, K]
    ∂L/∂op(B) = α·op(A)ᵀ·G            [K, N]
    ∂L/∂A     = ∂L/∂op(A)   if not trans_a,  else (∂L/∂op(A))ᵀ = α·op(B)·Gᵀ   [K, M]
    ∂L/∂B     = ∂L/∂op(B)   if not trans_b,  else (∂L/∂op(B))ᵀ = α·Gᵀ·op(A)   [N, K]
    ∂L/∂C     = β·G
"""

import numpy as np


def _op(x, trans):
    return x.T if trans else x


def _shapes(a, b, trans_a, trans_b):
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"gemm: a and b must be 2-D, got {a.shape} and {b.shape}")
    m, k = _op(a, trans_a).shape
    k2, n = _op(b, trans_b).shape
    if k != k2:
        raise ValueError(f"gemm: inner dimensions differ: op(a) is {m}x{k}, op(b) is {k2}x{n}")
    return m, n, k


def gemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n, _ = _shapes(a, b, trans_a, trans_b)
    y = float(alpha) * (_op(a, trans_a) @ _op(b, trans_b))
    if float(beta) != 0.0:
        if c is None:
            raise ValueError("gemm: beta != 0 needs c")
        c = np.asarray(c, dtype=np.float64)
        if c.shape != (m, n):
            raise ValueError(f"gemm: c has shape {c.shape}, expected {(m, n)}")
        y = y + float(beta) * c
    if out is not None:
        if out.shape != (m, n):
            raise ValueError(f"gemm: out has shape {out.shape}, expected {(m, n)}")
        out[...] = y
        return out
    return y


def gemm_backward(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None,
                  dy=None):
    """{"a": ∂L/∂A, "b": ∂L/∂B[, "c": ∂L/∂C]} for upstream gradient dy = ∂L/∂result."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    _shapes(a, b, trans_a, trans_b)
    g = np.asarray(dy, dtype=np.float64)
    alpha = float(alpha)
    opa, opb = _op(a, trans_a), _op(b, trans_b)
    d_opa = alpha * (g @ opb.T)
    d_opb = alpha * (opa.T @ g)
    grads = {"a": _op(d_opa, trans_a), "b": _op(d_opb, trans_b)}
    if c is not None:
        # β = 0: C is never read, so the loss does not depend on it (gradient exactly 0).
        grads["c"] = float(beta) * g
    return grads
