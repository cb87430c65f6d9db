"""Liger-Kernel: the fused GRPO loss returns float32 for bfloat16 (and fp16, int64) log-probs.

LigerFusedLinearGRPOFunction.ppo_loss_fn with loss_type "dapo" divides by
_compute_dapo_normalizer, `mask.to(torch.float32).sum()` (clamped), an fp32 0-d tensor, so the
division promotes: bfloat16 log-probs are neither refused nor kept, the loss comes back
float32; fp16 log-probs likewise, and int64 log-probs are accepted and computed in float32.

Backs FALSIFY-GRPO-015 (grpo-loss-kernel-v1: an undeclared dtype is refused with a TypeError
or ValueError naming it; the loss is in logp's dtype), binding
LigerFusedLinearGRPOFunction.ppo_loss_fn.
Run: python liger_grpo_loss_dtype.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

VERSION = importlib.metadata.version("liger-kernel")
LOGP, OLD, REF, MASK, A = [[-1.0, -0.5]], [[-1.25, -0.5]], [[-0.75, -0.5]], [[1, 1]], [1.0]
results = {}
for dt in (torch.bfloat16, torch.float16, torch.int64):
    def t(v, dt=dt):
        x = torch.tensor(v)
        return x.to(dt) if dt.is_floating_point else x.round().to(dt)
    m = torch.tensor(MASK)
    try:
        loss, _ = LigerFusedLinearGRPOFunction.ppo_loss_fn(
            t(LOGP), m, t(A), m, ref_per_token_logps=t(REF), old_per_token_logps=t(OLD),
            epsilon_low=0.2, epsilon_high=0.2, beta=0.04, loss_type="dapo")
        results[dt] = f"loss {loss.item():.6g} ({loss.dtype})"
        ok = loss.dtype == dt
    except (TypeError, ValueError) as e:
        results[dt] = f"refused: {type(e).__name__}: {e}"
        ok = str(dt).split(".")[-1] in str(e)
    results[dt] = (results[dt], ok)
print("case FALSIFY-GRPO-015: undeclared log-prob dtypes (the binding declares float64)")
print(f"input:   logp = {LOGP}, old = {OLD}, ref = {REF}, mask = {MASK}, advantages = {A}, "
      "epsilon 0.2, beta 0.04, loss_type 'dapo'; as bfloat16, float16 and int64 (rounded)")
print(f"library: liger-kernel {VERSION}: " + "; ".join(f"{str(dt)[6:]}: {r}"
                                                      for dt, (r, _) in results.items()))
print("true:    each refused with a TypeError or ValueError naming the dtype, or a loss of "
      "logp's dtype")
print("bound:   loss.dtype == logp.dtype (the contract's codomain) or a refusal naming it")
fails = [str(dt)[6:] for dt, (_, ok) in results.items() if not ok]
print(f"error:   {', '.join(fails) if fails else 'none'} accepted with a float32 loss")
print(f"verdict: {'REPRODUCES: dtype promoted to float32' if fails else 'does not reproduce'}")
sys.exit(1 if fails else 0)
