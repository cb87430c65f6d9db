"""TRL: values at padded positions reach GRPOTrainer's loss (inf·0 = NaN).

GRPOTrainer._compute_loss evaluates the per-token loss, including the k3 KL term
exp(ref − logp) − (ref − logp) − 1, at every position and masks afterwards,
`(per_token_loss * completion_mask).sum()`: a padded position whose log-probs are extreme
(logp = −1e4, ref = 30: exp(1e4) = inf) contributes inf·0 = NaN, and the loss is NaN
although no counted token changed. Masking before the arithmetic keeps the padding out.

TRL has no standalone GRPO loss: the script calls GRPOTrainer._compute_loss on a stand-in for
the trainer holding only the attributes the method reads (loss_type "bnpo", one process), with
a model call that returns the given per-token log-probs. Everything between the log-probs and
the loss is TRL's.

Backs FALSIFY-GRPO-011 (grpo-loss-kernel-v1: padding values do not reach the loss), binding
GRPOTrainer (bnpo).
Run: python trl_grpo_padding_nan.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
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


EPS, BETA, A = 0.2, 0.04, 1.0
MASK = [[1, 0]]


def loss_of(logp, old, ref):
    return grpo_loss(torch.tensor(logp), torch.tensor(old), torch.tensor(ref), torch.tensor([A]),
                     torch.tensor(MASK), EPS, BETA).item()


plain = loss_of([[-1.0, -1.0]], [[-1.2, -1.0]], [[-0.9, -1.0]])
padded = loss_of([[-1.0, -1.0e4]], [[-1.2, 30.0]], [[-0.9, 30.0]])
# the one counted token: −min(ρA, clip(ρ)A) + β·(e^(ref − logp) − (ref − logp) − 1)
lp, od, rf = (mpmath.mpf(float(torch.tensor(v))) for v in (-1.0, -1.2, -0.9))
rho = mpmath.exp(lp - od)
pol = min(rho * A, min(max(rho, 1 - mpmath.mpf(EPS)), 1 + mpmath.mpf(EPS)) * A)
d = rf - lp
true = -pol + BETA * (mpmath.exp(d) - d - 1)
print("case FALSIFY-GRPO-011: padded positions overwritten")
print(f"input:   mask = {MASK}; counted token logp -1.0, old -1.2, ref -0.9; the padded token "
      "(logp, old, ref) = (-1.0, -1.0, -1.0), then overwritten with (-1e4, 30, 30); "
      f"advantages [{A}], epsilon {EPS}, beta {BETA} (float32)")
print(f"library: trl {VERSION}: loss = {plain!r} with ordinary padding, {padded!r} with the "
      "overwritten padding")
print(f"true:    {mpmath.nstr(true, 10)} for both (the padded position is not counted)")
print("bound:   bit-identical losses (the contract's relation), both finite")
print("error:  ", "NaN" if math.isnan(padded) else abs(padded - plain),
      "after overwriting the padding")
bad = math.isnan(padded) or padded != plain
print(f"verdict: {'REPRODUCES: the padding reached the loss' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
