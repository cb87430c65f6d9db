"""TRL 1.16.0 (PyPI `trl`, Hugging Face): the DPO and GRPO losses of its trainers against
dpo-loss-kernel-v1 and grpo-loss-kernel-v1.

TRL has no standalone loss function for either: the arithmetic lives inside
`DPOTrainer._compute_loss` and `GRPOTrainer._compute_loss`, between a model forward and metric
logging. The adapters call those methods unbound, on a minimal stand-in for the trainer that
holds only the attributes the methods read (the loss configuration, a metrics dict, a
one-process accelerator whose gather/reduce return their argument, as accelerate's do on one
process), with a stand-in model whose "forward" hands back the contract's log-probabilities.
Every operation between those log-probs and the returned loss is TRL's own code.

- DPO (`loss_type="sigmoid"`, `f_divergence_type="reverse_kl"`, reference log-probs
  precomputed: TRL's defaults for the standard DPO loss). TRL's batch is [chosen; rejected]
  concatenated and its sequence log-prob is `log_probs.sum(dim=1)` over the completion: the
  adapter lays the two policy vectors out as one completion token each (a sum of one term,
  exact). The chosen and rejected rewards β(π − ref) are what `_compute_loss` hands to
  `accelerator.gather` for its metrics: the stand-in accelerator keeps them.
- GRPO (`loss_type="bnpo"`, the token-level mean Σ m·ℓ / Σ m computed inside the loss;
  `importance_sampling_level="token"`, `use_bias_correction_kl=False`, one accumulation step,
  training mode). The default `loss_type="dapo"` divides by `num_items_in_batch`, which TRL
  computes outside the loss (in `_generate_and_score_completions`); on one process and step it
  is the same count. TRL 1.16's default `use_bias_correction_kl=True` multiplies the k3 KL term
  by the ratio ρ, a different loss, which the contract's equation does not describe.
- Not bound: `group_advantages`. TRL's group normalisation (r − mean_g r)/(nanstd_g r + 1e-4)
  is inline in `GRPOTrainer._generate_and_score_completions`, after generation and the reward
  functions, with eps fixed at 1e-4 (the contract takes eps as an argument); no adapter can reach
  it without running a generation.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch

from falsify.conformance.registry import Binding, Finding, Library


class _Accelerator:
    """One process: gather/reduce return their argument (accelerate's single-process
    behaviour); `gathered` keeps what the trainer hands to gather, in order."""

    num_processes = 1
    process_index = 0
    sync_gradients = True

    def __init__(self, device):
        self.device = device
        self.gathered = []

    def gather(self, t):
        self.gathered.append(t)
        return t

    def gather_for_metrics(self, t):
        return t

    def reduce(self, t, reduction="sum"):
        return t


def _trainer(device, **attrs):
    return SimpleNamespace(model=SimpleNamespace(training=True), accelerator=_Accelerator(device),
                           _metrics=defaultdict(lambda: defaultdict(list)), **attrs)


# ---------------------------------------------------------------- dpo-loss-kernel-v1
class _DPOOutputs:
    """What DPOTrainer._compute_loss reads from its fused-LM-head forward: one completion
    token per sequence, log_probs [2B, 1] = the policy log-probs, the metric fields zero."""

    def __init__(self, log_probs):
        self.log_probs = log_probs
        z = torch.zeros(log_probs.shape, dtype=log_probs.dtype, device=log_probs.device)
        self.entropy = self.mean_logits = z
        self.is_top1 = torch.zeros(log_probs.shape, dtype=torch.bool, device=log_probs.device)


def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    """DPOTrainer._compute_loss (sigmoid loss, reverse KL, precomputed reference log-probs) on
    the four vectors: (loss, β(π_c − ref_c), β(π_r − ref_r))."""
    from trl import DPOTrainer

    b, dev = policy_chosen_logps.shape[0], policy_chosen_logps.device
    # TRL's batch layout: rows [chosen; rejected], each a completion of one token (the
    # completion mask's first column is the prompt, shifted off by the method)
    log_probs = torch.cat([policy_chosen_logps, policy_rejected_logps])[:, None]
    ones = torch.ones(2 * b, 2, dtype=torch.long, device=dev)
    inputs = {"input_ids": torch.zeros_like(ones), "attention_mask": ones,
              "completion_mask": ones, "ref_chosen_logps": ref_chosen_logps,
              "ref_rejected_logps": ref_rejected_logps}
    trainer = _trainer(dev, aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
                       f_divergence_type="reverse_kl", loss_types=["sigmoid"],
                       loss_weights=[1.0], beta=beta, use_weighting=False,
                       _total_train_tokens=0, _tp_size=1)
    loss = DPOTrainer._compute_loss(trainer, lambda **kw: _DPOOutputs(log_probs), inputs,
                                    return_outputs=False)
    chosen_rewards, rejected_rewards = trainer.accelerator.gathered[:2]
    return loss, chosen_rewards, rejected_rewards


def dpo_grad(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    """(∂loss/∂π_c, ∂loss/∂π_r) through autograd of TRL's loss, dy = 1. Only a floating leaf
    can require a gradient: an integer input goes to TRL as it is, and TRL's refusal shows."""
    pc, pr = (t.detach().clone() for t in (policy_chosen_logps, policy_rejected_logps))
    for t in (pc, pr):
        t.requires_grad_(t.is_floating_point())
    loss = dpo_loss(pc, pr, ref_chosen_logps, ref_rejected_logps, beta)[0]
    return torch.autograd.grad(loss, [pc, pr])


# ---------------------------------------------------------------- grpo-loss-kernel-v1
def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    """GRPOTrainer._compute_loss (loss_type "bnpo", token-level importance sampling, plain k3
    KL) with the policy's per-token log-probs `logp` as what its model call returns."""
    from trl import GRPOTrainer

    b, t = logp.shape
    inputs = {"prompt_ids": torch.zeros(b, 0, dtype=torch.long, device=logp.device),
              "prompt_mask": torch.zeros(b, 0, dtype=torch.long, device=logp.device),
              "completion_ids": torch.zeros(b, t, dtype=torch.long, device=logp.device),
              "completion_mask": mask, "advantages": advantages,
              "old_per_token_logps": old_logp, "ref_per_token_logps": ref_logp}
    trainer = _trainer(
        logp.device, loss_type="bnpo", beta=beta, epsilon_low=clip_eps, epsilon_high=clip_eps,
        importance_sampling_level="token", top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, use_vllm=False, vllm_importance_sampling_correction=False,
        aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None),
        # the model call: the per-token log-probs and (unused here) entropies, no aux loss
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None))
    return GRPOTrainer._compute_loss(trainer, None, inputs)


_M = "falsify.conformance.lib_trl"

_COMPILE = ("the loss is reachable only inside the trainer's _compute_loss, which logs metrics "
            "as it goes (.item() on gathered tensors, boolean-mask indexing, nonzero): "
            "torch.compile of that method is no promise TRL makes, its compiled training "
            "step is the model's forward")

_DPO_FP16 = ("DPOTrainer._compute_loss works in the log-probs' dtype: chosen_logratios, "
             "rejected_logratios, delta_score = their difference, β·delta_score and "
             "-F.logsigmoid(...) are each rounded to fp16, where the contract computes in fp32 "
             "and rounds once")

_NO_TOKEN = ("GRPOTrainer._compute_loss (loss_type 'bnpo') divides by mask.sum().clamp(min=1.0): "
             "with no counted token (every mask entry 0, and B = 0 or T = 0) it returns 0.0 where "
             "the contract's token mean over nothing is NaN (0/0, as torch's cross-entropy). "
             "Case: B = T = 1, mask [[0]], every log-prob 0, A = 0, ε = 0.2, β = 0.04: TRL 0.0, "
             "reference NaN. A training loop that skips NaN losses would take a zero step with TRL")

LIBRARY = Library(
    name="trl",
    distribution="trl",
    bindings=(
        Binding(
            name="DPOTrainer (sigmoid)", contract="dpo-loss-kernel-v1",
            binds={"dpo_loss": f"{_M}:dpo_loss", "dpo_grad": f"{_M}:dpo_grad"},
            # plain torch ops in the inputs' dtype: float64 and bfloat16 in, the same out
            dtypes=("float64", "bfloat16"),
            not_claimed={"FALSIFY-DPO-017": _COMPILE},
            findings={
                "FALSIFY-DPO-001/float16": Finding(
                    kind="deviation",
                    repro="trl_dpo_fp16.py",
                    evidence=("B = 1, π_c = π_r = 0, ref_c = −46.78, ref_r = −125.25 (fp16), "
                              "β = 0.1: TRL 7.8515625, reference 7.847265895 (|err| 4.3e-3, "
                              "bound 1.2e-4 + 4.9e-4 relative). " + _DPO_FP16)),
                "FALSIFY-DPO-004/float16": Finding(
                    kind="deviation",
                    repro="trl_dpo_fp16.py",
                    evidence=("B = 10, β = 0.5 (π_c[9] = −34.1, ref_c[9] = −127.25, "
                              "π_r = 0, ref_r = −85): ∂loss/∂π_c[9] TRL −1.72710e-3, "
                              "reference −1.69986e-3 (|err| 2.7e-5, bound 1.8e-5 + 4.9e-4 "
                              "relative): the backward of the same fp16 chain (logsigmoid's "
                              "gradient σ(−h) from an fp16-rounded h). " + _DPO_FP16)),
                "FALSIFY-DPO-011": Finding(
                    kind="deviation",
                    repro="trl_dpo_integer_logps.py",
                    evidence=("int64 (and int32) log-probs: TRL's loss.mean() raises torch's "
                              "RuntimeError 'mean(): could not infer output dtype. Input dtype "
                              "must be either a floating point or complex dtype. Got: Long' "
                              "from inside _compute_loss, not a TypeError/ValueError naming the "
                              "dtype (TRL checks no dtype). float64 and bfloat16 are declared")),
                "FALSIFY-DPO-012": Finding(
                    kind="deviation",
                    repro="trl_dpo_integer_logps.py",
                    evidence=("int64 (and int32) log-probs through dpo_grad: as FALSIFY-DPO-011, "
                              "TRL's RuntimeError from mean() inside _compute_loss, not an error "
                              "naming the dtype")),
            },
        ),
        Binding(
            name="GRPOTrainer (bnpo)", contract="grpo-loss-kernel-v1",
            binds={"grpo_loss": f"{_M}:grpo_loss"},
            # float64 log-probs give a float64 loss
            dtypes=("float64",),
            not_claimed={"FALSIFY-GRPO-025": _COMPILE},
            findings={
                **{cid: Finding(kind="variant", variant="token mean over no counted token is 0",
                                evidence=_NO_TOKEN)
                   for cid in ("FALSIFY-GRPO-005", "FALSIFY-GRPO-008", "FALSIFY-GRPO-009",
                               "FALSIFY-GRPO-010", "FALSIFY-GRPO-012")},
                "FALSIFY-GRPO-023": Finding(
                    kind="variant", variant="token mean over no counted token is 0",
                    evidence=("B = 0 (rule: empty, the reference's NaN loss): TRL returns "
                              "0.0. " + _NO_TOKEN)),
                "FALSIFY-GRPO-011": Finding(
                    kind="deviation",
                    repro="trl_grpo_padding_nan.py",
                    evidence=("pads overwritten with logp = −1e4, old = ref = 30 (mask 0 there): "
                              "TRL's loss becomes NaN. _compute_loss evaluates "
                              "exp(ref − logp) − (ref − logp) − 1 = inf at every position and "
                              "masks afterwards, (per_token_loss * mask).sum(): inf·0 = NaN. "
                              "The contract's domain lets padded positions hold any value and "
                              "selects them away before the arithmetic. Hand check: logp "
                              "[[−1, −1e4]], old [[−1.2, 30]], ref [[−0.9, 30]], mask [[1, 0]], "
                              "A = 1: TRL NaN, our kernel −1.1998")),
                "FALSIFY-GRPO-006/float16": Finding(
                    kind="deviation",
                    repro="trl_grpo_fp16_clip.py",
                    evidence=("fp16, ε = 0.2, A = 1.7246, logp − old = 0.1826 (a hand run of the "
                              "same kind; the check's case is (5, 39) of B = 8, T = 40, got "
                              "−1.1955e-2, reference 3.78e-4): ρ = exp(0.1826) rounds to "
                              "1.2001953125 in fp16 and torch.clamp(coef_1, 0.8, 1 + 0.2) rounds "
                              "the bound 1.2 to the same fp16 value, so coef_1·A and coef_2·A tie "
                              "and torch.min passes the unclipped gradient ρ·A/n, where the "
                              "clip is active in exact arithmetic (ρ = 1.20035 > 1.2) and the "
                              "policy gradient is 0. The ratio and the clip bound are compared "
                              "in fp16, the contract's in fp32")),
                "FALSIFY-GRPO-007/float16": Finding(
                    kind="deviation",
                    repro="trl_grpo_fp16_clip.py",
                    evidence=("β = 0: the same fp16 clip tie as FALSIFY-GRPO-006/float16 "
                              "(ρ and 1 + ε both rounded to 1.2001953125, the unclipped "
                              "gradient ρ·A/n passed where the exact ratio is clipped)")),
                "FALSIFY-GRPO-015": Finding(
                    kind="deviation",
                    repro="trl_grpo_loss_dtype.py",
                    evidence=("bfloat16 log-probs are accepted and the loss comes back as "
                              "float32 (a bf16 sum divided by mask.sum().clamp(min=1.0), a "
                              "float32 0-d tensor: type promotion), and int64/int32 log-probs "
                              "are accepted and computed in float32: no refusal. The same "
                              "promotion returns an fp16 loss as float32, where the contract's "
                              "codomain is logp's dtype (no value check sees a dtype). float64 "
                              "is declared")),
            },
        ),
    ),
)
