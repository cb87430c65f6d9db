"""Liger-Kernel: LigerFusedLinearJSDLoss returns float32 results for float64 inputs.

The chunked distillation base accumulates the loss and the logged terms in `torch.zeros(())`
accumulators, float32 whatever the input dtype (fp16 inputs likewise give fp32 results), so
float64 x, W and teacher inputs are neither refused nor kept.

Backs FALSIFY-FLKD-014 (fused-linear-kd-kernel-v1: an undeclared dtype is refused with a
TypeError or ValueError naming it, before any work), binding
LigerFusedLinearJSDFunction(beta=0). Runs under the Triton interpreter (TRITON_INTERPRET=1)
without a GPU.
Run: python liger_fused_linear_jsd_dtype.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss  # noqa: E402

VERSION = importlib.metadata.version("liger-kernel")
X = [[0.5, -1.0], [1.5, 0.25]]
W = [[1.0, 0.5], [-0.5, 2.0], [0.25, -1.0]]
ZT = [[0.2, 1.0, -0.5], [1.0, 0.0, 0.3]]
Y = [1, 0]
f64 = torch.float64
loss_fn = LigerFusedLinearJSDLoss(weight_hard_loss=0.5, weight_soft_loss=0.5, beta=0.0,
                                  temperature=1.0, compiled=False, return_soft_hard_loss=True)
print("case FALSIFY-FLKD-014: float64 x, weight and teacher")
print(f"input:   x = {X}, weight = {W}, teacher logits = {ZT} with an identity teacher weight "
      f"(all float64), labels = {Y}; beta 0, T = 1")
try:
    outs = loss_fn(torch.tensor(X, dtype=f64), torch.tensor(W, dtype=f64),
                   torch.tensor(ZT, dtype=f64), torch.eye(3, dtype=f64), torch.tensor(Y))
except (TypeError, ValueError) as e:
    named = "float64" in str(e) or "Double" in str(e)
    print(f"library: liger-kernel {VERSION}: refused: {type(e).__name__}: {e}")
    print("true:    a refusal naming float64")
    print("bound:   a TypeError or ValueError naming the dtype")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
dtypes = [t.dtype for t in outs]
print(f"library: liger-kernel {VERSION}: (loss, kl, ce) = {[t.item() for t in outs]}, dtypes "
      f"{dtypes}, no error")
print("true:    (loss, kl, ce) in float64, or a refusal")
print("bound:   a TypeError or ValueError naming float64 (the contract declares float32 and "
      "float16), or results of the input dtype")
print(f"error:   accepted, results {set(str(d) for d in dtypes)}")
bad = any(d != f64 for d in dtypes)
print("verdict:", "REPRODUCES: float64 in, float32 out" if bad
      else "does not reproduce: float64 kept")
sys.exit(1 if bad else 0)
