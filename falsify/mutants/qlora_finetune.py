"""Fine-tuning mutants: bugs in the swappable pieces of the QLoRA loop (loss mask, reward
weighting, LoRA init, freezing, DPO pairing, merge scale, PEFT names) that the checks of
falsify/contracts/qlora-finetune-v1.yaml must catch. Each has the signature of the binding it
replaces.
"""

from __future__ import annotations

import math


def sft_loss_on_prompt(logits, labels, mask, weights):
    """MUT: the response mask is ignored — loss on prompt tokens too."""
    from falsify.llm.finetune import sft_loss

    return sft_loss(logits, labels, labels != -100, weights)


def sft_loss_reward_ignored(logits, labels, mask, weights):
    """MUT: every sample weighs 1 whatever its reward."""
    from falsify.llm.finetune import sft_loss

    return sft_loss(logits, labels, mask, weights.new_ones(weights.shape))


def sft_loss_mean_of_means(logits, labels, mask, weights):
    """MUT: each sample's mean CE, averaged, presented as a token sum: long samples are
    under-weighted (the gradient-accumulation normalisation bug, per sample)."""
    from falsify.llm.finetune import sft_loss

    sums = [sft_loss(logits[i:i + 1], labels[i:i + 1], mask[i:i + 1], weights[i:i + 1])
            for i in range(logits.shape[0])]
    n = sum(c for _, c in sums)
    means = [s / c.clamp_min(1) for s, c in sums]
    return sum(means) / len(means) * n, n


def lora_init_nonzero_b(in_features, out_features, r, seed, dtype=None):
    """MUT: B initialised like A (non-zero): the adapted model differs from the base at step 0."""
    import torch

    from falsify.kernels.torch.lora import lora_init

    a, _ = lora_init(in_features, out_features, r, seed)
    g = torch.Generator().manual_seed(int(seed) + 1)
    b = (torch.rand(out_features, r, generator=g) * 2 - 1) / math.sqrt(r)
    return a, b


def freeze_nothing(model):
    """MUT: the base is not frozen: every parameter keeps requires_grad."""
    for p in model.parameters():
        p.requires_grad_(True)


def dpo_swapped(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    """MUT: chosen and rejected swapped (a data-loader bug): the policy learns the rejected."""
    from falsify.llm.finetune import dpo_loss

    return dpo_loss(policy_rejected, policy_chosen, ref_rejected, ref_chosen, beta)


def merge_scale_alpha(w, a, b, scale):
    """MUT: merged with α instead of α/r (scale·r): the merged model over-applies the adapter."""
    from falsify.llm.lora_model import merge_weights

    r = a.shape[0]
    return merge_weights(w, a, b, scale * r)


def merge_masked_drops_mask(w, a, b, scale, mask):
    """MUT: a masked adapter merged as a plain one: the dense delta refills the pruned
    weights."""
    from falsify.llm.lora_model import merge_weights

    return merge_weights(w, a, b, scale)


def reward_weights_unclipped(rewards):
    """MUT: min-max without clipping to [−1, 1]: one outlier squeezes every other weight."""
    r = rewards.double()
    return ((r - r.min()) / (r.max() - r.min())).to(rewards.dtype)


def peft_state_our_names(model):
    """MUT: adapter tensors saved under our names, without PEFT's base_model.model.model.
    prefix: PEFT loads nothing and silently keeps B = 0."""
    from falsify.llm.lora_model import adapter_parameters

    return {k: v.detach().float().contiguous() for k, v in adapter_parameters(model).items()}


def reference_with_adapters(trainer, ch, rj):
    """MUT: the DPO reference taken from the policy with its adapters on (the adapter-disable
    context left out): equal to the base while B = 0, the moved policy for every pair first seen
    after that."""
    import torch

    from falsify.llm.trainer import eval_mode

    with torch.no_grad(), eval_mode(trainer.model):
        return trainer._policy_logps(ch, rj)


def evaluate_examples_with_grad(trainer, batches):
    """MUT: validation in eval mode without torch.no_grad(): an autograd graph per batch."""
    from falsify.llm.finetune import score_examples
    from falsify.llm.trainer import eval_mode

    with eval_mode(trainer.model):
        return score_examples(trainer, batches)


def evaluate_examples_in_train_mode(trainer, batches):
    """MUT: validation under no_grad without model.eval(): lora_dropout stays on, the
    validation loss is a random draw."""
    import torch

    from falsify.llm.finetune import score_examples

    with torch.no_grad():
        return score_examples(trainer, batches)
