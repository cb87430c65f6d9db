"""Liger-Kernel: the second derivative of liger_fused_linear_cross_entropy is silently zero.

LigerFusedLinearCrossEntropyFunction computes the gradients of x and W chunk by chunk in its
forward and its backward returns them times grad_output, without once_differentiable. Under
create_graph=True the returned gradient carries a graph only through grad_output, so
differentiating it again with respect to x or W gives 0 (a Hessian-vector product, a gradient
penalty on the hidden states), with no error. The contract asks for a refusal.

Backs FALSIFY-FLCE-010 (fused-linear-cross-entropy-kernel-v1: a double backward raises a
clear error instead of returning second derivatives), binding
LigerFusedLinearCrossEntropyFunction. Runs under the Triton interpreter
(TRITON_INTERPRET=1) without a GPU.
Run: python liger_fused_linear_cross_entropy_double_backward.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
X, W, Y, V = [[0.5, -1.0]], [[1.0, 0.5], [-0.5, 2.0], [0.25, -1.0]], [1], [[1.0, -2.0]]
x = torch.tensor(X, requires_grad=True)
w = torch.tensor(W, requires_grad=True)
dy = torch.ones(1, requires_grad=True)  # the upstream gradient, itself differentiated
loss = liger_fused_linear_cross_entropy(x, w, torch.tensor(Y), reduction="none")
(g,) = torch.autograd.grad(loss, x, grad_outputs=dy, create_graph=True)
S = (g * torch.tensor(V)).sum()

# exact: z = W x, ∂loss/∂x = Wᵀ(p − e_y), ∂S/∂x = Wᵀ·(diag(p) − p pᵀ)·(W v)
Wm = [[mpmath.mpf(a) for a in r] for r in W]
z = [mpmath.fsum(a * b for a, b in zip(r, X[0])) for r in Wm]
p = [mpmath.exp(v) / mpmath.fsum(mpmath.exp(u) for u in z) for v in z]
wv = [mpmath.fsum(a * b for a, b in zip(r, V[0])) for r in Wm]
pwv = mpmath.fsum(a * b for a, b in zip(p, wv))
hz = [a * (b - pwv) for a, b in zip(p, wv)]
true = [mpmath.fsum(Wm[i][j] * hz[i] for i in range(3)) for j in range(2)]

print("case FALSIFY-FLCE-010: d/dx of S = <dloss/dx, v> (create_graph=True)")
print(f"input:   x = {X}, weight = {W} (float32), labels = {Y}, reduction 'none', upstream "
      f"dy = [1.0] (requires grad), v = {V}")
try:
    h, _ = torch.autograd.grad(S, [x, dy], allow_unused=True)
except RuntimeError as e:  # a once_differentiable refusal is what the contract asks
    print(f"library: liger-kernel {VERSION}: refused: {e}")
    print(f"true:    Hessian-vector product {[mpmath.nstr(t, 9) for t in true]}")
    print("bound:   a clear error (the contract's rule for this binding)")
    print("error:   none: refused")
    print("verdict: does not reproduce: refused")
    sys.exit(0)
got = [0.0, 0.0] if h is None else h.flatten().tolist()
err = max(abs(mpmath.mpf(a) - t) for a, t in zip(got, true))
print(f"library: liger-kernel {VERSION}: dS/dx = {got}"
      f"{' (None: S has no path to x)' if h is None else ''}, no error")
print(f"true:    Hessian-vector product {[mpmath.nstr(t, 9) for t in true]}")
print("bound:   a clear error instead of second derivatives (the contract's rule); a value "
      "would at least have to be the product above within float32 rounding (1e-6)")
print(f"error:   not refused; max |dS/dx - true| = {mpmath.nstr(err, 6)}")
bad = err > 1e-6
print("verdict:", "REPRODUCES: a silent zero second derivative" if bad
      else "does not reproduce: the second derivative is right (not refused)")
sys.exit(1 if bad else 0)
