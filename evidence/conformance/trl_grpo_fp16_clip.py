"""TRL: GRPOTrainer compares the fp16 importance ratio with an fp16-rounded clip bound.

GRPOTrainer._compute_loss computes coef_1 = exp(logp − old) and
torch.clamp(coef_1, 1 − ε_low, 1 + ε_high) in logp's dtype. In fp16 a ratio just above
1 + ε rounds onto the bound, which is itself rounded to the same fp16 value (1.2 ->
1.2001953125): coef_1·A and coef_2·A tie, torch.min passes the gradient of the unclipped
branch, and the policy gradient −ρ·A/n flows where the exact ratio is clipped (gradient 0).
fp32 passes.

TRL has no standalone GRPO loss: the script calls GRPOTrainer._compute_loss on a stand-in for
the trainer holding only the attributes the method reads (loss_type "bnpo", one process), with
a model call that returns the given per-token log-probs. Everything between the log-probs and
the loss is TRL's.

Backs FALSIFY-GRPO-006/float16 (gradient w.r.t. logp) and FALSIFY-GRPO-007/float16 (clip
region, β = 0) of grpo-loss-kernel-v1, binding GRPOTrainer (bnpo).
Run: python trl_grpo_fp16_clip.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys
from collections import defaultdict
from types import SimpleNamespace

import mpmath
import torch
from trl import GRPOTrainer

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("trl")


class OneProcess:
    """accelerate's single-process behaviour: gather/reduce return their argument."""
    num_processes, process_index, sync_gradients = 1, 0, True

    def __init__(self):
        self.device = torch.device("cpu")

    def gather(self, t):
        return t

    def gather_for_metrics(self, t):
        return t

    def reduce(self, t, reduction="sum"):
        return t


def grpo_loss(logp, old, ref, advantages, mask, eps, beta):
    """GRPOTrainer._compute_loss, loss_type "bnpo", token-level importance sampling, plain k3
    KL (use_bias_correction_kl=False), one process and accumulation step; the model call
    returns `logp` as the per-token log-probs."""
    b, t = logp.shape
    inputs = {"prompt_ids": torch.zeros(b, 0, dtype=torch.long),
              "prompt_mask": torch.zeros(b, 0, dtype=torch.long),
              "completion_ids": torch.zeros(b, t, dtype=torch.long),
              "completion_mask": mask, "advantages": advantages,
              "old_per_token_logps": old, "ref_per_token_logps": ref}
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=OneProcess(),
        _metrics=defaultdict(lambda: defaultdict(list)), loss_type="bnpo", beta=beta,
        epsilon_low=eps, epsilon_high=eps, importance_sampling_level="token",
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False,
        vllm_importance_sampling_correction=False, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, current_gradient_accumulation_steps=1,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None))
    return GRPOTrainer._compute_loss(trainer, None, inputs)


EPS16, U32 = 2.0 ** -10, 1.1920929e-07
f16 = torch.float16
LOGP, OLD, REF, A, EPS = -0.8173828125, -1.0, -1.0, 1.724609375, 0.2
bad = []
for check, beta in (("FALSIFY-GRPO-006/float16", 0.04), ("FALSIFY-GRPO-007/float16", 0.0)):
    logp = torch.tensor([[LOGP]], dtype=f16, requires_grad=True)
    loss = grpo_loss(logp, torch.tensor([[OLD]], dtype=f16), torch.tensor([[REF]], dtype=f16),
                     torch.tensor([A], dtype=f16), torch.ones(1, 1, dtype=torch.long), EPS, beta)
    (g,) = torch.autograd.grad(loss, logp)
    rho = mpmath.exp(mpmath.mpf(LOGP) - OLD)
    clipped = rho > 1 + mpmath.mpf(EPS)  # A > 0: the clip is active above 1 + ε
    # ∂loss/∂logp = m·(−ρ·A·[clip inactive] + β·(1 − e^(ref − logp)))/Σm, one token
    true = (0 if clipped else -rho * A) + beta * (1 - mpmath.exp(mpmath.mpf(REF) - LOGP))
    # GRPO-006 float16: atol 3e-8 + 5.5·(1160 + 400β)·eps32, rtol eps16/2 + 2·eps32
    # GRPO-007 float16 (β = 0): atol 3e-8 + 5.5·1160·eps32, the same rtol
    bound = 3.0e-8 + 5.5 * (1160 + 400 * beta) * U32 + (EPS16 / 2 + 2 * U32) * abs(true)
    err = abs(mpmath.mpf(g.item()) - true)
    print(f"case {check} (beta = {beta})")
    print(f"input:   logp = [[{LOGP}]], old = [[{OLD}]], ref = [[{REF}]], advantages = [{A}] "
          f"(float16), completion mask [[1]], epsilon_low = epsilon_high = {EPS}")
    print(f"library: trl {VERSION}: d loss / d logp = {g.item()!r} (fp16 ratio "
          f"{torch.exp(torch.tensor(LOGP, dtype=f16) - OLD).item()!r}, fp16 bound "
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
