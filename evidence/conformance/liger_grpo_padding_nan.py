"""Liger-Kernel: values at padded positions reach the fused GRPO loss (inf·0 = NaN).

LigerFusedLinearGRPOFunction.ppo_loss_fn computes the per-token loss at every position and
applies the mask afterwards, `(per_token_loss * attention_mask).sum()`. A padded position
whose log-probs are extreme (here logp = −1e4 with ref = 30, so exp(ref − logp) = inf in the
KL term) contributes inf·0 = NaN, and the loss is NaN although no counted token changed.
Masking before the arithmetic (torch.where) keeps the padding out.

Backs FALSIFY-GRPO-011 (grpo-loss-kernel-v1: padding values do not reach the loss),
binding LigerFusedLinearGRPOFunction.ppo_loss_fn.
Run: python liger_grpo_padding_nan.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
import sys

import mpmath
import torch
from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
EPS, BETA, A = 0.2, 0.04, 1.0
MASK = [[1, 0]]


def loss(logp, old, ref):
    m = torch.tensor(MASK)
    out, _ = LigerFusedLinearGRPOFunction.ppo_loss_fn(
        torch.tensor(logp), m, torch.tensor([A]), m, ref_per_token_logps=torch.tensor(ref),
        old_per_token_logps=torch.tensor(old), epsilon_low=EPS, epsilon_high=EPS, beta=BETA,
        loss_type="dapo")
    return out.item()


plain = loss([[-1.0, -1.0]], [[-1.2, -1.0]], [[-0.9, -1.0]])
padded = loss([[-1.0, -1.0e4]], [[-1.2, 30.0]], [[-0.9, 30.0]])
# the one counted token: −min(ρA, clip(ρ)A) + β·(e^(ref − logp) − (ref − logp) − 1)
rho = mpmath.exp(mpmath.mpf(-1.0) - mpmath.mpf(-1.2))
pol = min(rho * A, min(max(rho, 1 - mpmath.mpf(EPS)), 1 + mpmath.mpf(EPS)) * A)
d = mpmath.mpf(-0.9) - mpmath.mpf(-1.0)
true = -pol + BETA * (mpmath.exp(d) - d - 1)
print("case FALSIFY-GRPO-011: padded positions overwritten")
print(f"input:   mask = {MASK}; counted token logp -1.0, old -1.2, ref -0.9; the padded token "
      "(logp, old, ref) = (-1.0, -1.0, -1.0), then overwritten with (-1e4, 30, 30); "
      f"advantages [{A}], epsilon {EPS}, beta {BETA}, loss_type 'dapo' (float32)")
print(f"library: liger-kernel {VERSION}: loss = {plain!r} with ordinary padding, {padded!r} with "
      "the overwritten padding")
print(f"true:    {mpmath.nstr(true, 10)} for both (the padded position is not counted)")
print("bound:   bit-identical losses (the contract's relation), both finite")
print("error:  ", "NaN" if math.isnan(padded) else abs(padded - plain),
      "after overwriting the padding")
bad = math.isnan(padded) or padded != plain
print(f"verdict: {'REPRODUCES: the padding reached the loss' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
