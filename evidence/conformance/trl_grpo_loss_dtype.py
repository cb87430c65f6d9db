"""TRL: GRPOTrainer's loss promotes bfloat16, float16 and integer log-probs to float32.

GRPOTrainer._compute_loss ("bnpo") divides the masked sum by
`completion_mask.sum().clamp(min=1.0)`, a float32 0-d tensor, so type promotion returns a
float32 loss for bfloat16 and float16 log-probs, and int64 log-probs are accepted and
computed in float32: no refusal, and the loss is not in logp's dtype.

TRL has no standalone GRPO loss: the script calls GRPOTrainer._compute_loss on a stand-in for
the trainer holding only the attributes the method reads (loss_type "bnpo", one process), with
a model call that returns the given per-token log-probs. Everything between the log-probs and
the loss is TRL's.

Backs FALSIFY-GRPO-015 (grpo-loss-kernel-v1: an undeclared dtype is refused with a TypeError
or ValueError naming it; the loss is in logp's dtype), binding GRPOTrainer (bnpo).
Run: python trl_grpo_loss_dtype.py (exit 1 = reproduces).
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


LOGP, OLD, REF, MASK, A = [[-1.0, -0.5]], [[-1.25, -0.5]], [[-0.75, -0.5]], [[1, 1]], [1.0]
results = {}
for dt in (torch.bfloat16, torch.float16, torch.int64):
    def t(v, dt=dt):
        x = torch.tensor(v)
        return x.to(dt) if dt.is_floating_point else x.round().to(dt)
    try:
        loss = grpo_loss(t(LOGP), t(OLD), t(REF), t(A), torch.tensor(MASK), 0.2, 0.04)
        results[dt] = (f"loss {loss.item():.6g} ({loss.dtype})", loss.dtype == dt)
    except (TypeError, ValueError) as e:
        results[dt] = (f"refused: {type(e).__name__}: {e}", str(dt).split(".")[-1] in str(e))
print("case FALSIFY-GRPO-015: log-prob dtypes other than the declared float64")
print(f"input:   logp = {LOGP}, old = {OLD}, ref = {REF}, completion mask = {MASK}, advantages "
      f"= {A}, epsilon 0.2, beta 0.04; as bfloat16, float16 and int64 (rounded)")
print(f"library: trl {VERSION}: "
      + "; ".join(f"{str(d)[6:]}: {r}" for d, (r, _) in results.items()))
print("true:    each refused with a TypeError or ValueError naming the dtype, or a loss of "
      "logp's dtype")
print("bound:   loss.dtype == logp.dtype (the contract's codomain) or a refusal naming it")
fails = [str(d)[6:] for d, (_, ok) in results.items() if not ok]
print(f"error:   {', '.join(fails) if fails else 'none'} accepted with a float32 loss")
print(f"verdict: {'REPRODUCES: dtype promoted to float32' if fails else 'does not reproduce'}")
sys.exit(1 if fails else 0)
