"""Facts behind the KD-loss contract: Gibbs' inequality with a ground log lemma (z3), the α
limits, and runs comparing with torch.nn.functional.kl_div and the top-k variant at k = V."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import z3

F32_EPS = float(np.finfo(np.float32).eps)


def kl_nonnegative_claims():
    """KL(p ‖ q) = Σ p_i (log p_i − log q_i) ≥ 0 for V = 3, and ≥ 0 for the top-k form where
    the student's probabilities on the k indices sum to ≤ 1. z3 has no logarithm: log is an
    uninterpreted function constrained by ground instances of log(a) − log(b) ≤ a/b − 1
    (a, b > 0; i.e. log x ≤ x − 1 at x = a/b, with log(a/b) = log a − log b). Then
    −KL = Σ p_i (log q_i − log p_i) ≤ Σ p_i (q_i/p_i − 1) = Σ q_i − Σ p_i ≤ 0."""
    log = z3.Function("log", z3.RealSort(), z3.RealSort())
    p = z3.Reals("p0 p1 p2")
    q = z3.Reals("q0 q1 q2")
    dom = z3.And(*[x > 0 for x in p + q], sum(p) == 1, sum(q) <= 1)
    lemmas = [log(qi) - log(pi) <= qi / pi - 1 for pi, qi in zip(p, q)]
    kl = sum(pi * (log(pi) - log(qi)) for pi, qi in zip(p, q))
    return z3.Implies(z3.And(dom, *lemmas), kl >= 0)


def alpha_limit_claims():
    """L = α·T²·KL + (1 − α)·CE: α = 0 gives CE exactly, α = 1 gives T²·KL exactly, and for
    α ∈ [0, 1] L lies between the two (a convex combination of CE and T²·KL)."""
    a, t, kl, ce = z3.Reals("alpha T kl ce")
    loss = a * t * t * kl + (1 - a) * ce
    lo = z3.If(t * t * kl <= ce, t * t * kl, ce)
    hi = z3.If(t * t * kl <= ce, ce, t * t * kl)
    return z3.And(z3.substitute(loss, (a, z3.RealVal(0))) == ce,
                  z3.substitute(loss, (a, z3.RealVal(1))) == t * t * kl,
                  z3.Implies(z3.And(a >= 0, a <= 1), z3.And(lo <= loss, loss <= hi)))


def vs_torch_kl_div(backend, dtype):
    """Our KD (bound through the harness) against an independent formulation with
    torch.nn.functional.kl_div(log_target=True) and F.cross_entropy, and the top-k variant at
    k = V against the full one: largest loss and gradient differences."""
    from falsify.harness import backends, runtime

    c = runtime.contract("kd-loss-kernel-v1")
    fn = backends.function(c, "kd_loss", backend)
    fn_k = backends.function(c, "kd_loss_from_topk", backend)
    gen = torch.Generator().manual_seed(0)
    worst = worst_grad = worst_topk = 0.0
    for T, V in ((9, 17), (32, 300)):
        zs = torch.randn(T, V, generator=gen) * 3
        zt = torch.randn(T, V, generator=gen) * 3
        y = torch.randint(0, V, (T,), generator=gen)
        y[::4] = -100
        valid = y != -100
        for temp in (1.0, 2.0, 4.0):
            for alpha in (0.0, 0.5, 1.0):
                a = zs.clone().requires_grad_(True)
                b = zs.clone().requires_grad_(True)
                ours = fn(a, zt, y, temp, alpha)[0]
                kl = F.kl_div(F.log_softmax(b[valid] / temp, -1), F.log_softmax(zt[valid] / temp,
                              -1), log_target=True, reduction="batchmean")
                ce = F.cross_entropy(b, y, ignore_index=-100)
                want = alpha * temp ** 2 * kl + (1 - alpha) * ce
                ours.backward()
                want.backward()
                worst = max(worst, abs(float(ours) - float(want)))
                worst_grad = max(worst_grad, float((a.grad - b.grad).abs().max()))
                full = fn_k(zs, zt, y, temp, alpha, V)[0]
                worst_topk = max(worst_topk, abs(float(full) - float(fn(zs, zt, y, temp,
                                                                          alpha)[0])))
    return {"max_loss_diff": worst, "max_grad_diff": worst_grad, "max_topk_full_diff": worst_topk,
            "f32_eps": F32_EPS}
