"""Liger-Kernel: the second derivative of LigerFusedLinearJSDLoss is silently incomplete.

The chunked distillation base computes the gradients of x and W in its forward
(torch.func.grad_and_value per chunk) and its backward returns them times grad_output,
without once_differentiable. Under create_graph=True the gradient carries a graph through
grad_output only: a double backward returns the ∂/∂dy part and silently 0 for the Hessian
through x and W, instead of refusing.

Backs FALSIFY-FLKD-018 (fused-linear-kd-kernel-v1: a double backward raises a clear error
instead of returning second derivatives), binding LigerFusedLinearJSDFunction(beta=0). Runs
under the Triton interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_fused_linear_jsd_double_backward.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
X = [[0.5, -1.0], [1.5, 0.25]]
W = [[1.0, 0.5], [-0.5, 2.0], [0.25, -1.0]]
ZT = [[0.2, 1.0, -0.5], [1.0, 0.0, 0.3]]
Y = [1, 0]
VV = [[1.0, -2.0], [0.5, 0.5]]  # the direction v of the Hessian-vector product
N, V, H = 2, 3, 2
loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.0,
                                  temperature=1.0, compiled=False)
x = torch.tensor(X, requires_grad=True)
w = torch.tensor(W, requires_grad=True)
# the upstream gradient, itself differentiated; not 1.0: for dy == 1 the backward skips its
# multiplication (`if torch.ne(grad_output, 1.0)`) and the gradient has no graph at all
DY = 0.75
dy = torch.tensor(DY, requires_grad=True)
loss = loss_fn(x, w, torch.tensor(ZT), torch.eye(V), torch.tensor(Y))
(g,) = torch.autograd.grad(loss, x, grad_outputs=dy, create_graph=True)
S = (g * torch.tensor(VV)).sum()

# exact: L = 0.5·mean KL(p_t‖p_s) + 0.5·mean CE; per row ∂²L/∂z² = (diag(p_s) − p_s p_sᵀ)/N,
# so ∂S/∂x_n = dy·Wᵀ·(diag(p_s) − p_s p_sᵀ)·(W·v_n)/N (teacher fixed)
true = []
for n in range(N):
    z = [mpmath.fsum(mpmath.mpf(a) * b for a, b in zip(X[n], W[i])) for i in range(V)]
    e = [mpmath.exp(t) for t in z]
    ps = [t / mpmath.fsum(e) for t in e]
    wv = [mpmath.fsum(mpmath.mpf(a) * b for a, b in zip(W[i], VV[n])) for i in range(V)]
    pwv = mpmath.fsum(a * b for a, b in zip(ps, wv))
    hz = [DY * a * (b - pwv) / N for a, b in zip(ps, wv)]
    true += [mpmath.fsum(W[i][j] * hz[i] for i in range(V)) for j in range(H)]
print("case FALSIFY-FLKD-018: d/dx of S = <dL/dx, v> (create_graph=True)")
print(f"input:   x = {X}, weight = {W} (float32), teacher logits = {ZT} (identity teacher "
      f"weight), labels = {Y}, weight_hard_loss = weight_soft_loss = 0.5, beta 0, T = 1; "
      f"upstream dy = {DY} (requires grad), v = {VV}")
try:
    h, _ = torch.autograd.grad(S, [x, dy], allow_unused=True)
except RuntimeError as e:  # a once_differentiable refusal is what the contract asks
    print(f"library: liger-kernel {VERSION}: refused: {e}")
    print(f"true:    Hessian-vector product {[mpmath.nstr(t, 9) for t in true]}")
    print("bound:   a clear error (the contract's rule for this binding)")
    print("error:   none: refused")
    print("verdict: does not reproduce: refused")
    sys.exit(0)
got = [0.0] * (N * H) if h is None else h.flatten().tolist()
err = max(abs(mpmath.mpf(a) - t) for a, t in zip(got, true))
print(f"library: liger-kernel {VERSION}: dS/dx = {got}"
      f"{' (None: S has no path to x)' if h is None else ''}, no error")
print(f"true:    Hessian-vector product {[mpmath.nstr(t, 9) for t in true]}")
print("bound:   a clear error instead of second derivatives (the contract's rule); a value "
      "would at least have to be the product above within float32 rounding (1e-6)")
print(f"error:   not refused; max |dS/dx - true| = {mpmath.nstr(err, 6)}")
bad = err > 1e-6
print("verdict:", "REPRODUCES: a silent zero Hessian through x" if bad
      else "does not reproduce: the second derivative is right (not refused)")
sys.exit(1 if bad else 0)
