"""GRPO loop mutants: bugs in the swappable pieces of falsify/llm/grpo.py (reference model, old
log-probs, sampler seeding, reward failures, reward sign) that the checks of
falsify/contracts/grpo-finetune-v1.yaml must catch. Each has the signature of the binding it
replaces.
"""

from __future__ import annotations


def reference_is_policy(model, x):
    """MUT: the reference is the current policy (adapters left on)."""
    import torch

    from falsify.llm.grpo import token_logps

    was = model.training
    model.eval()
    with torch.no_grad():
        out = token_logps(model, x)
    model.train(was)
    return out


def old_logps_after_update(trainer, batch):
    """MUT: π_old recomputed from the policy as it is now, i.e. after the batch's earlier
    updates."""
    from falsify.llm.grpo import policy_logps

    return policy_logps(trainer.model, batch.x)


def old_logps_from_reference(trainer, batch):
    """MUT: π_old taken from the reference model instead of the sampling policy."""
    return batch.ref_logp


def sample_group_unseeded(model, prompt, n, max_new, temperature, top_p, generator, stop_id,
                          stop_ids=None):
    """MUT: the sampler ignores the run's generator and draws from one seeded by entropy."""
    import torch

    from falsify.llm.grpo import sample_group

    g = torch.Generator(device=generator.device)
    g.seed()
    return sample_group(model, prompt, n, max_new, temperature, top_p, g, stop_id, stop_ids)


def score_rewards_errors_as_zero(reward, problems, completions, on_error):
    """MUT: a raising reward function silently scores 0 (nothing counted or reported)."""
    from falsify.llm.rewards import Scored, UnitTestReward

    if isinstance(reward, UnitTestReward):
        return Scored(reward.score(problems, completions))
    out = []
    for p, c in zip(problems, completions):
        try:
            out.append(float(reward(p.prompt, c, p)))
        except Exception:  # noqa: BLE001 - the bug this mutant is
            out.append(0.0)
    return Scored(out)


def score_rewards_negated(reward, problems, completions, on_error):
    """MUT: rewards with the wrong sign."""
    from falsify.llm.rewards import score_rewards

    s = score_rewards(reward, problems, completions, on_error)
    s.rewards = [-r for r in s.rewards]
    return s
