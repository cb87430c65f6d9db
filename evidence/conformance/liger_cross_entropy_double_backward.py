"""Liger-Kernel: the second derivative of liger_cross_entropy is silently zero.

LigerCrossEntropyFunction computes ∂loss/∂logits inside its forward and its backward returns
that stored tensor times grad_output. The backward is not marked once_differentiable, so
under create_graph=True autograd accepts it and the gradient carries a graph only through
grad_output: differentiating it again with respect to the logits (a Hessian-vector product,
a gradient penalty added to the loss) gives 0 where the true value is p ⊙ (v − ⟨p, v⟩), a
wrong number instead of an error.

Backs FALSIFY-CE-025 (cross-entropy-kernel-v1: the double backward matches finite
differences of the reference backward, or is refused), binding LigerCrossEntropyFunction.
Runs the Triton kernel under the Triton interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_cross_entropy_double_backward.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
EPS32 = 2.0 ** -23
Z, Y, V = [[0.5, -1.0, 2.0]], [1], [[1.0, -2.0, 0.5]]
z = torch.tensor(Z, requires_grad=True)
dy = torch.ones(1, requires_grad=True)  # the upstream gradient, itself differentiated
loss = liger_cross_entropy(z, torch.tensor(Y), reduction="none")
(g,) = torch.autograd.grad(loss, z, grad_outputs=dy, create_graph=True)
S = (g * torch.tensor(V)).sum()
print("case FALSIFY-CE-025: d/dlogits of S = <dloss/dlogits, v> (create_graph=True)")
print(f"input:   logits = {Z} (float32), labels = {Y}, reduction 'none', upstream dy = [1.0] "
      f"(requires grad), v = {V}")
try:
    h, _ = torch.autograd.grad(S, [z, dy], allow_unused=True)
    got = [0.0] * 3 if h is None else h.flatten().tolist()
    outcome = f"{got}{' (None: S has no path to the logits)' if h is None else ''}"
    refused = False
except RuntimeError as e:  # a refusal (once_differentiable) is what the contract allows
    outcome, refused, got = f"refused: {e}", True, None
# ∂S/∂z = H·v, H = diag(p) − p·pᵀ (softmax Jacobian): p ⊙ (v − ⟨p, v⟩)
zs = [mpmath.mpf(v) for v in Z[0]]
p = [mpmath.exp(v) / mpmath.fsum(mpmath.exp(w) for w in zs) for v in zs]
pv = mpmath.fsum(a * b for a, b in zip(p, V[0]))
true = [a * (b - pv) for a, b in zip(p, V[0])]
# FALSIFY-CE-025 float32: atol (70 + 68·(⌈V/1024⌉ + ⌈log2(V + 1)⌉ + 2) + V)·eps32·(4·ref_max + 11)
n = 3
ref_max = max(abs(t) for t in true)
bound = (70 + 68 * (math.ceil(n / 1024) + math.ceil(math.log2(n + 1)) + 2) + n) * EPS32 * \
    (4 * ref_max + 11)
print(f"library: liger-kernel {VERSION}: dS/dlogits = {outcome}")
print(f"true:    p*(v - <p, v>) = {[mpmath.nstr(t, 9) for t in true]}")
print(f"bound:   {mpmath.nstr(bound, 6)} per element (or a refusal)")
if refused:
    print("error:   none: the double backward is refused")
    print("verdict: does not reproduce: refused")
    sys.exit(0)
err = max(abs(mpmath.mpf(a) - t) for a, t in zip(got, true))
print(f"error:   {mpmath.nstr(err, 6)}")
bad = err > bound
print(f"verdict: {'REPRODUCES: a silent zero second derivative' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
