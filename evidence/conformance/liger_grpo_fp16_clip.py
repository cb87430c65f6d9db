"""Liger-Kernel: the fused GRPO loss compares the fp16 ratio with an fp16-rounded clip bound.

LigerFusedLinearGRPOFunction.ppo_loss_fn computes ρ = exp(logp − old) and
torch.clamp(ρ, 1 − ε, 1 + ε) in logp's dtype. In fp16 a ratio just above 1 + ε rounds onto
the bound, which is itself rounded to the same fp16 value (1.2 -> 1.2001953125), so ρ·A and
clip(ρ)·A tie, torch.min passes the gradient of the unclipped branch, and the policy
gradient −ρ·A/n flows where the exact ratio is clipped (gradient 0). fp32 passes.

Backs FALSIFY-GRPO-006/float16 (gradient w.r.t. logp) and FALSIFY-GRPO-007/float16 (clip
region, β = 0) of grpo-loss-kernel-v1, binding LigerFusedLinearGRPOFunction.ppo_loss_fn.
Run: python liger_grpo_fp16_clip.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
EPS16, U32 = 2.0 ** -10, 1.1920929e-07
f16 = torch.float16
LOGP, OLD, REF, A, EPS = -0.8173828125, -1.0, -1.0, 1.724609375, 0.2

bad = []
for check, beta in (("FALSIFY-GRPO-006/float16", 0.04), ("FALSIFY-GRPO-007/float16", 0.0)):
    logp = torch.tensor([[LOGP]], dtype=f16, requires_grad=True)
    mask = torch.ones(1, 1, dtype=torch.int64)
    loss, _ = LigerFusedLinearGRPOFunction.ppo_loss_fn(
        logp, mask, torch.tensor([A], dtype=f16), mask,
        ref_per_token_logps=torch.tensor([[REF]], dtype=f16),
        old_per_token_logps=torch.tensor([[OLD]], dtype=f16),
        epsilon_low=EPS, epsilon_high=EPS, beta=beta, loss_type="dapo")
    (g,) = torch.autograd.grad(loss, logp)
    rho = mpmath.exp(mpmath.mpf(LOGP) - OLD)
    clipped = rho > 1 + mpmath.mpf(EPS)  # A > 0: the clip is active above 1 + ε
    # ∂loss/∂logp = m·(−ρ·A·[clip inactive] + β·(1 − e^(ref − logp)))/Σm, one token
    true = (0 if clipped else -rho * A) + beta * (1 - mpmath.exp(mpmath.mpf(REF) - LOGP))
    # GRPO-006 float16: atol 3e-8 + 5.5·(1160 + 400β)·eps32, rtol eps16/2 + 2·eps32
    # GRPO-007 float16 (β = 0): atol 3e-8 + 5.5·1160·eps32, the same rtol
    atol = 3.0e-8 + 5.5 * (1160 + 400 * beta) * U32
    bound = atol + (EPS16 / 2 + 2 * U32) * abs(true)
    err = abs(mpmath.mpf(g.item()) - true)
    print(f"case {check} (beta = {beta})")
    print(f"input:   logp = [[{LOGP}]], old = [[{OLD}]], ref = [[{REF}]], advantages = [{A}] "
          f"(float16), mask [[1]], epsilon_low = epsilon_high = {EPS}, loss_type 'dapo'")
    print(f"library: liger-kernel {VERSION}: d loss / d logp = {g.item()!r} "
          f"(fp16 ratio {torch.exp(torch.tensor(LOGP, dtype=f16) - OLD).item()!r}, fp16 bound "
          f"{torch.tensor(1 + EPS, dtype=f16).item()!r})")
    print(f"true:    {mpmath.nstr(true, 10)} (exact ratio {mpmath.nstr(rho, 8)} > 1.2: clip "
          f"{'active' if clipped else 'inactive'})")
    print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)}")
    print(f"error:   {mpmath.nstr(err, 6)}")
    bad.append(err > bound)
    print("verdict:", "REPRODUCES: the clipped token passes a policy gradient" if bad[-1]
          else "does not reproduce")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
