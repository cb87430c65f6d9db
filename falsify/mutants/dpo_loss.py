"""DPO mutants: sign, reference, stability and β-placement bugs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from falsify.kernels.torch.dpo_loss import check_dpo_args


def _parts(pc, pr, rc, rr, beta):
    check_dpo_args(pc, pr, rc, rr, beta=beta)
    return (pc.float(), pr.float(), rc.detach().float(), rr.detach().float(), pc.dtype)


def _out(loss, chosen, rejected, dt):
    return loss.to(dt), chosen.detach().to(dt), rejected.detach().to(dt)


def chosen_rejected_swapped(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                            ref_rejected_logps, beta):
    """Margin computed rejected − chosen: training pushes the rejected response up."""
    pc, pr, rc, rr, dt = _parts(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                ref_rejected_logps, beta)
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    return _out(-F.logsigmoid(rejected - chosen).mean(), chosen, rejected, dt)


def reference_ignored(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                      ref_rejected_logps, beta):
    """h = β(π_c − π_r): the reference model's log-ratios dropped."""
    pc, pr, rc, rr, dt = _parts(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                ref_rejected_logps, beta)
    return _out(-F.logsigmoid(beta * (pc - pr)).mean(), beta * (pc - rc), beta * (pr - rr), dt)


def naive_log_sigmoid(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                      ref_rejected_logps, beta):
    """−log(sigmoid(h)): σ underflows to 0 for h ≲ −104 (fp32) and the loss becomes inf."""
    pc, pr, rc, rr, dt = _parts(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                ref_rejected_logps, beta)
    chosen, rejected = beta * (pc - rc), beta * (pr - rr)
    return _out(-torch.log(torch.sigmoid(chosen - rejected)).mean(), chosen, rejected, dt)


def beta_outside(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                 ref_rejected_logps, beta):
    """−β·log σ(margin): β scales the loss instead of the margin inside σ."""
    pc, pr, rc, rr, dt = _parts(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                ref_rejected_logps, beta)
    m = (pc - rc) - (pr - rr)
    return _out(-beta * F.logsigmoid(m).mean(), beta * (pc - rc), beta * (pr - rr), dt)
