"""TRL: DPOTrainer's sigmoid loss is computed in float16 for fp16 log-probs.

DPOTrainer._compute_loss (loss_type "sigmoid", reference log-probs precomputed) works in the
log-probs' dtype: chosen_logratios, rejected_logratios, their difference, β·(…) and
-F.logsigmoid(...) are each rounded to fp16. Summed log-probs of tens to hundreds have an
fp16 spacing of up to 0.06, so the logit is off by several steps before the logsigmoid, and
its gradient σ(−h)·β/B inherits that. fp32 arithmetic with one final rounding is within the
contract's bound; fp32 inputs pass.

TRL has no standalone DPO loss: the script calls DPOTrainer._compute_loss on a stand-in for
the trainer that holds only the attributes the method reads (one process, a model call
that returns the policy log-probs as one completion token per sequence, so TRL's
`log_probs.sum(dim=1)` is exact). Everything between the log-probs and the loss is TRL's.

Backs FALSIFY-DPO-001/float16 (loss parity) and FALSIFY-DPO-004/float16 (gradients) of
dpo-loss-kernel-v1, binding DPOTrainer (sigmoid).
Run: python trl_dpo_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys
from collections import defaultdict
from types import SimpleNamespace

import mpmath
import torch
from trl import DPOTrainer

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("trl")
EPS16, U32 = 2.0 ** -10, 1.1920929e-07
f16 = torch.float16


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


def report(name, inp, call, lib, true, bound):
    err = abs(mpmath.mpf(lib) - true)
    bad = err > bound
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: trl {VERSION}: {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 12)}")
    print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)}")
    print(f"error:   {mpmath.nstr(err, 6)}")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


def h_of(pc, pr, rc, rr, beta):
    return mpmath.mpf(beta) * ((mpmath.mpf(pc) - rc) - (mpmath.mpf(pr) - rr))


bad = []
# FALSIFY-DPO-001/float16 (dpo-loss-kernel-v1): atol 3e-8 + (200 + 4·201)·eps32, rtol
# eps16/2 + (B + 4)·eps32 (fp32 differences of log-probs up to 200, softplus, the mean, ONE
# rounding to fp16); B = 1
pc, pr, rc, rr, beta = 0.0, 0.0, -46.78125, -125.25, 0.1
loss = dpo_loss(*(torch.tensor([v], dtype=f16) for v in (pc, pr, rc, rr)), beta)
h = h_of(pc, pr, rc, rr, beta)
true = mpmath.log(1 + mpmath.exp(-h))  # −log σ(h)
bad.append(report("FALSIFY-DPO-001/float16 (loss)",
                  f"policy chosen [{pc}], rejected [{pr}], ref chosen [{rc}], ref rejected "
                  f"[{rr}] (float16), beta {beta}", "DPOTrainer._compute_loss", loss.item(), true,
                  3.0e-8 + (200 + 4 * 201) * U32 + (EPS16 / 2 + 5 * U32) * abs(true)))

# FALSIFY-DPO-004/float16: d loss / d π_c = −β·σ(−h)/B; atol 3e-8 + 5.5·0.5·54·eps32, rtol eps16/2
pc, pr, rc, rr, beta = -34.09375, 0.0, -127.25, -85.0, 0.5
tpc = torch.tensor([pc], dtype=f16, requires_grad=True)
loss = dpo_loss(tpc, *(torch.tensor([v], dtype=f16) for v in (pr, rc, rr)), beta)
(g,) = torch.autograd.grad(loss, tpc)
h = h_of(pc, pr, rc, rr, beta)
true = -mpmath.mpf(beta) / (1 + mpmath.exp(h))
bad.append(report("FALSIFY-DPO-004/float16 (gradient)",
                  f"policy chosen [{pc}], rejected [{pr}], ref chosen [{rc}], ref rejected "
                  f"[{rr}] (float16), beta {beta}", "autograd d loss / d policy_chosen",
                  g.item(), true, 3.0e-8 + 5.5 * 0.5 * 54 * U32 + EPS16 / 2 * abs(true)))
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
