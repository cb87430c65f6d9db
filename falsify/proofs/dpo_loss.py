"""Facts behind the DPO contract (z3, exp uninterpreted with ground lemmas), and a run on a
tiny policy showing that gradient descent moves the chosen log-prob up and the rejected down."""

from __future__ import annotations

import z3


def sigmoid_claims():
    """With E(x) standing for exp(x) (E > 0, E(x)·E(−x) = 1) and σ(x) = 1/(1 + E(−x)):
    σ(h)/σ(−h) = E(h), i.e. log σ(h) − log σ(−h) = h (swapping chosen and rejected changes
    the loss by exactly the mean margin); 1 − σ(h) = σ(−h); σ(0) = ½ (so at π = ref the loss
    is log 2); and with β > 0 the chosen gradient −β·σ(−h) is < 0 and the rejected one > 0."""
    E = z3.Function("E", z3.RealSort(), z3.RealSort())
    h, beta = z3.Reals("h beta")

    def sig(x):
        return 1 / (1 + E(-x))

    lem = z3.And(E(h) > 0, E(-h) > 0, E(h) * E(-h) == 1, E(z3.RealVal(0)) == 1)
    return z3.Implies(lem, z3.And(
        sig(h) / sig(-h) == E(h), 1 - sig(h) == sig(-h),
        sig(z3.RealVal(0)) == z3.RealVal(1) / 2,
        z3.Implies(beta > 0, z3.And(-beta * sig(-h) < 0, beta * sig(-h) > 0))))


def preference_step(backend, dtype, steps, lr, beta, seed):
    """A tiny categorical policy over response tokens trained with the bound DPO loss (SGD)
    from a copy of the reference: after `steps` the summed log-prob of every chosen response
    rose and of every rejected one fell, relative to the reference, and the loss fell below
    log 2."""
    import torch

    from falsify.harness import backends, runtime
    from falsify.impl.torch.dpo_loss import sequence_logps

    fn = backends.function(runtime.contract("dpo-loss-kernel-v1"), "dpo_loss", backend)
    gen = torch.Generator().manual_seed(seed)
    B, S, V = 4, 6, 11
    ref_logits = torch.randn(B, S, V, generator=gen)
    policy = ref_logits.clone().requires_grad_(True)
    chosen = torch.randint(0, V, (B, S), generator=gen)
    rejected = torch.randint(0, V, (B, S), generator=gen)
    mask = torch.ones(B, S)
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
