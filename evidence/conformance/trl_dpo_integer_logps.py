"""TRL: DPOTrainer's loss fails inside torch for integer log-probs, with no dtype check.

DPOTrainer._compute_loss validates no dtype: with int64 (or int32) log-probs it computes the
log ratios and the logits in int64 and fails at `loss.mean()` with torch's RuntimeError
'mean(): could not infer output dtype. Input dtype must be either a floating point or
complex dtype. Got: Long', from inside the loss, instead of refusing the dtype up front.

TRL has no standalone DPO loss: as in trl_dpo_fp16.py, DPOTrainer._compute_loss runs on a
stand-in trainer holding only the attributes the method reads.

Backs FALSIFY-DPO-011 (dpo_loss) and FALSIFY-DPO-012 (dpo_grad: integer log-probs cannot
require a gradient, so the same call reaches TRL) of dpo-loss-kernel-v1, binding DPOTrainer
(sigmoid): every undeclared dtype is refused with a TypeError or ValueError naming it.
Run: python trl_dpo_integer_logps.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys
from collections import defaultdict
from types import SimpleNamespace

import torch
from trl import DPOTrainer

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


class Outputs:
    """What _compute_loss reads from its fused-LM-head forward: log_probs [2B, 1]."""

    def __init__(self, log_probs):
        self.log_probs = log_probs
        self.entropy = self.mean_logits = torch.zeros_like(log_probs)
        self.is_top1 = torch.zeros(log_probs.shape, dtype=torch.bool)


def dpo_loss(pc, pr, rc, rr, beta):
    b = pc.shape[0]
    log_probs = torch.cat([pc, pr])[:, None]  # rows [chosen; rejected], one token each
    ones = torch.ones(2 * b, 2, dtype=torch.long)  # column 0 is the prompt, shifted off
    inputs = {"input_ids": torch.zeros_like(ones), "attention_mask": ones,
              "completion_mask": ones, "ref_chosen_logps": rc, "ref_rejected_logps": rr}
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=OneProcess(),
        _metrics=defaultdict(lambda: defaultdict(list)), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"],
        loss_weights=[1.0], beta=beta, use_weighting=False, _total_train_tokens=0, _tp_size=1)
    return DPOTrainer._compute_loss(trainer, lambda **kw: Outputs(log_probs), inputs,
                                    return_outputs=False)


PC, PR, RC, RR, BETA = [-12], [-30], [-15], [-28], 0.1
print("case FALSIFY-DPO-011 / FALSIFY-DPO-012: int64 log-probs")
print(f"input:   policy chosen {PC}, rejected {PR}, ref chosen {RC}, ref rejected {RR} (int64), "
      f"beta {BETA}")
try:
    loss = dpo_loss(*(torch.tensor(v) for v in (PC, PR, RC, RR)), BETA)
    outcome, ok = f"accepted: loss {loss.item()!r} ({loss.dtype})", False
except (TypeError, ValueError) as e:
    outcome, ok = f"{type(e).__name__}: {e}", "int64" in str(e) or "Long" in str(e)
except Exception as e:  # noqa: BLE001 - the finding is which exception this is
    outcome, ok = f"{type(e).__name__}: {e}", False
print(f"library: trl {VERSION}: DPOTrainer._compute_loss: {outcome}")
print("true:    int64 is not a declared dtype of dpo-loss-kernel-v1 (float32, float16; the "
      "binding adds float64 and bfloat16)")
print("bound:   a TypeError or ValueError naming the dtype, before any work")
print(f"error:   {'none' if ok else outcome}")
print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: no refusal naming the dtype'}")
sys.exit(0 if ok else 1)
