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


def sample_group_times_temperature(model, prompt, n, max_new, temperature, top_p, generator,
                                   stop_id, stop_ids=None):
    """MUT: the logits multiplied by the temperature instead of divided (z·T = z/(1/T))."""
    from falsify.llm.grpo import sample_group

    return sample_group(model, prompt, n, max_new, 1.0 / temperature, top_p, generator,
                        stop_id, stop_ids)


def sample_group_with_autograd(model, prompt, n, max_new, temperature, top_p, generator,
                               stop_id, stop_ids=None):
    """MUT: the sampler without its no_grad: every rollout forward records an autograd graph
    (the same tokens, the memory and time of a training forward)."""
    import torch

    from falsify.llm.grpo import sample_group

    with torch.enable_grad():
        return sample_group.__wrapped__(model, prompt, n, max_new, temperature, top_p,
                                        generator, stop_id, stop_ids)


def sample_group_in_train_mode(model, prompt, n, max_new, temperature, top_p, generator,
                               stop_id, stop_ids=None):
    """MUT: the sampler's model.eval() dropped: rollouts are drawn with dropout on."""
    from falsify.llm.grpo import sample_group

    model.eval = lambda: model  # the call the sampler makes changes nothing
    try:
        return sample_group(model, prompt, n, max_new, temperature, top_p, generator, stop_id,
                            stop_ids)
    finally:
        del model.eval


def sample_group_one_token_long(model, prompt, n, max_new, temperature, top_p, generator,
                                stop_id, stop_ids=None):
    """MUT: a completion that stopped keeps one token past its stop token (the pad after it)."""
    from falsify.llm.grpo import sample_group

    outs = sample_group(model, prompt, n, max_new, temperature, top_p, generator, stop_id,
                        stop_ids)
    return [o + [stop_id] if len(o) < max_new else o for o in outs]
