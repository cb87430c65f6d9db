"""DPO loss in PyTorch (math and gradients: falsify/reference/dpo_loss.py): −log σ(h) evaluated as
−logsigmoid(h), which is finite for every finite margin, in fp32 whatever the input dtype.
The reference log-probs are detached (the reference model is frozen). Returns
(mean loss, chosen rewards, rejected rewards) in the input dtype."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from falsify.kernels.dtypes import CHECKED, require

__all__ = ["dpo_loss", "dpo_grad"]


def check_dpo_args(*logps, beta):
    if any(not isinstance(t, torch.Tensor) for t in logps):
        raise TypeError("log-probs must be torch tensors")
    require("dpo_loss", CHECKED, **{f"logps[{i}]": t for i, t in enumerate(logps)})
    # shapes compared pairwise, not hashed into a set: under torch.compile hashing a symbolic
    # size reads it as a number, which specializes the graph to each batch size
    if logps[0].dim() != 1 or any(t.shape != logps[0].shape for t in logps[1:]):
        raise ValueError("the four log-prob vectors must share one 1-D shape")
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta={beta!r}: must be finite and > 0")


def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    check_dpo_args(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                   ref_rejected_logps, beta=beta)
    dt = policy_chosen_logps.dtype
    chosen = beta * (policy_chosen_logps.float() - ref_chosen_logps.detach().float())
    rejected = beta * (policy_rejected_logps.float() - ref_rejected_logps.detach().float())
    loss = -F.logsigmoid(chosen - rejected).mean()
    return loss.to(dt), chosen.detach().to(dt), rejected.detach().to(dt)


def dpo_grad(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    check_dpo_args(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                   ref_rejected_logps, beta=beta)
    pc = policy_chosen_logps.detach().clone().requires_grad_(True)
    pr = policy_rejected_logps.detach().clone().requires_grad_(True)
    loss = dpo_loss(pc, pr, ref_chosen_logps, ref_rejected_logps, beta)[0]
    return torch.autograd.grad(loss, [pc, pr])


def sequence_logps(logits, labels, mask):
    """Σ_t mask_t·log softmax(logits_t)[labels_t] per sequence: the summed response
    log-probability DPO consumes. logits [B, S, V], labels [B, S], mask [B, S] (1 on response
    tokens). Computed in fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    tok = logp.gather(-1, labels.long().clamp_min(0)[..., None])[..., 0]
    return (tok * mask.float()).sum(-1)
