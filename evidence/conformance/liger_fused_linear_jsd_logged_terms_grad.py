"""Liger-Kernel: LigerFusedLinearJSDLoss(return_soft_hard_loss=True) returns soft and hard
losses that carry a graph whose gradient is silently zero.

With return_soft_hard_loss=True the soft (KL) and hard (CE) terms are outputs of
LigerFusedLinearJSDFunction, so they require grad, but its backward is
`backward(ctx, grad_output, *args)`: the upstream gradients of those two outputs are
ignored. A loss built from the logged KL or CE (a reweighting, a schedule on the KL term)
therefore backpropagates 0 to the student, without an error. Either the logged terms are
detached (no graph) or their gradients must be the true ones.

Backs FALSIFY-FLKD-002 (fused-linear-kd-kernel-v1: gradients wrt x and W, with upstream
gradients for every output) and FALSIFY-FLKD-004 (the logged KL and CE carry no graph),
binding LigerFusedLinearJSDFunction(beta=0). Runs under the Triton interpreter
(TRITON_INTERPRET=1) without a GPU.
Run: python liger_fused_linear_jsd_logged_terms_grad.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
EPS32 = 2.0 ** -23
X = [[0.5, -1.0], [1.5, 0.25]]
W = [[1.0, 0.5], [-0.5, 2.0], [0.25, -1.0]]
ZT = [[0.2, 1.0, -0.5], [1.0, 0.0, 0.3]]  # teacher logits (teacher input, identity weight)
Y = [1, 0]
N, V, H = 2, 3, 2

loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.0,
                                  temperature=1.0, compiled=False, return_soft_hard_loss=True)
x = torch.tensor(X, requires_grad=True)
w = torch.tensor(W, requires_grad=True)
loss, kl, ce = loss_fn(x, w, torch.tensor(ZT), torch.eye(V), torch.tensor(Y))


def softmax(z):
    e = [mpmath.exp(v) for v in z]
    return [v / mpmath.fsum(e) for v in e]


# exact ∂KL/∂x: KL = mean_n KL(p_t ‖ p_s), ∂KL/∂z_n = (p_s − p_t)/N, ∂/∂x_n = (∂KL/∂z_n)·W
true = []
for n in range(N):
    z = [mpmath.fsum(mpmath.mpf(a) * b for a, b in zip(X[n], W[i])) for i in range(V)]
    ps, pt = softmax(z), softmax([mpmath.mpf(v) for v in ZT[n]])
    gz = [(a - b) / N for a, b in zip(ps, pt)]
    true += [mpmath.fsum(gz[i] * W[i][j] for i in range(V)) for j in range(H)]

bad = []
print("case FALSIFY-FLKD-004: the logged KL and CE carry no graph")
print(f"input:   x = {X}, weight = {W} (float32), teacher logits = {ZT} (identity teacher "
      f"weight), labels = {Y}; weight_hard_loss 0.5, weight_soft_loss 0.5, beta 0, T = 1")
print(f"library: liger-kernel {VERSION}: (loss, kl, ce) = ({loss.item():.7g}, {kl.item():.7g}, "
      f"{ce.item():.7g}); kl.requires_grad = {kl.requires_grad}, ce.requires_grad = "
      f"{ce.requires_grad}")
print("true:    kl and ce are logged values: no graph (or one whose gradient is the true one)")
print("bound:   requires_grad False for both, or the true gradient (next case)")
print(f"error:   {sum((kl.requires_grad, ce.requires_grad))} logged terms carry a graph")
graph = kl.requires_grad or ce.requires_grad
print()
print("case FALSIFY-FLKD-002: the gradient of the logged KL with respect to x")
print("input:   as above; torch.autograd.grad(kl, x)")
if kl.requires_grad:
    (g,) = torch.autograd.grad(kl, x)
    got = g.flatten().tolist()
    # FALSIFY-FLKD-002 float32: atol 5.5·10·(36 + ⌈log2(V + 1)⌉ + 2·d² + V + N)·eps32 (the
    # softmax's and the logits' error, a V-term and an N-term sum, |dy| < 5.5), d = H here
    err = max(abs(mpmath.mpf(a) - t) for a, t in zip(got, true))
    bound = 5.5 * 10 * (36 + math.ceil(math.log2(V + 1)) + 2 * H * H + V + N) * EPS32
    print(f"library: liger-kernel {VERSION}: d kl / dx = {got}")
    print(f"true:    {[mpmath.nstr(t, 9) for t in true]}")
    print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)}")
    print(f"error:   {mpmath.nstr(err, 6)}")
    wrong = err > bound
else:
    print(f"library: liger-kernel {VERSION}: kl carries no graph")
    print(f"true:    {[mpmath.nstr(t, 9) for t in true]} (if it carried one)")
    print("bound:   no graph")
    print("error:   none")
    wrong = False
bad = graph and wrong
print("verdict:", "REPRODUCES: the logged terms carry a graph and their gradient is 0" if bad
      else "does not reproduce")
sys.exit(1 if bad else 0)
