"""DPO contract: a run on a tiny policy showing that gradient descent moves the chosen
log-prob up and the rejected down."""

from __future__ import annotations

from falsify.probes import device


def preference_step(backend, dtype, steps, lr, beta, seed):
    """A tiny categorical policy over response tokens trained with the bound DPO loss (SGD)
    from a copy of the reference: after `steps` the summed log-prob of every chosen response
    rose and of every rejected one fell, relative to the reference, and the loss fell below
    log 2."""
    import torch

    from falsify.harness import backends, runtime
    from falsify.kernels.torch.dpo_loss import sequence_logps

    fn = backends.function(runtime.contract("dpo-loss-kernel-v1"), "dpo_loss", backend)
    dev = device(backend)
    gen = torch.Generator().manual_seed(seed)
    B, S, V = 4, 6, 11
    ref_logits = torch.randn(B, S, V, generator=gen).to(dev)
    policy = ref_logits.clone().requires_grad_(True)
    chosen = torch.randint(0, V, (B, S), generator=gen).to(dev)
    rejected = torch.randint(0, V, (B, S), generator=gen).to(dev)
    mask = torch.ones(B, S, device=dev)
    with torch.no_grad():
        rc = sequence_logps(ref_logits, chosen, mask)
        rr = sequence_logps(ref_logits, rejected, mask)
    losses = []
    for _ in range(steps):
        loss = fn(sequence_logps(policy, chosen, mask), sequence_logps(policy, rejected, mask),
                  rc, rr, beta)[0]
        losses.append(float(loss))
        (g,) = torch.autograd.grad(loss, [policy])
        with torch.no_grad():
            policy -= lr * g
    with torch.no_grad():
        pc = sequence_logps(policy, chosen, mask)
        pr = sequence_logps(policy, rejected, mask)
    return {"first_loss": losses[0], "last_loss": losses[-1],
            "chosen_up": bool((pc > rc).all()), "rejected_down": bool((pr < rr).all())}
