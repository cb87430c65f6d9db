"""The training loop in numpy float64, written to read like the math.

One optimizer step t = 1, 2, ...:
    L, g   = token-weighted loss and gradient over the step's micro-batches (reference/model.py)
    ‖g‖    = sqrt(Σ_params Σ g²)                          global L2 norm, before clipping
    g     ← g · min(1, c / (‖g‖ + 1e-6))                  global-norm clipping (torch's 1e-6)
    η_t    = η·t/W                       for t ≤ W         linear warmup (peak reached at t = W)
           = η_min + ½(η − η_min)(1 + cos(π (t−W)/(T−W)))  cosine to η_min at t = T
    θ     ← AdamW(θ, g, t, η_t, β1, β2, ε, λ)             λ = 0 for norm gains and the embedding

Independent of impl/train.py (it imports no torch) so that agreement between the two is evidence,
not a tautology. AdamW is reference/adamw.py, the one the AdamW contract checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from falsify.reference.adamw import adamw_step
from falsify.reference.model import loss_and_grads


@dataclass(frozen=True)
class RefHyper:
    lr: float
    lr_min: float
    warmup_steps: int
    max_steps: int
    beta1: float
    beta2: float
    adam_eps: float
    weight_decay: float
    grad_clip: float


def lr_at(step: int, h: RefHyper) -> float:
    if h.warmup_steps > 0 and step <= h.warmup_steps:
        return h.lr * step / h.warmup_steps
    progress = min(1.0, max(0.0, (step - h.warmup_steps) / max(1, h.max_steps - h.warmup_steps)))
    return h.lr_min + 0.5 * (h.lr - h.lr_min) * (1.0 + math.cos(math.pi * progress))


def decays(name: str) -> bool:
    """Norm gains and the tied embedding get no weight decay (see impl/train.py:is_no_decay)."""
    return not (name.endswith("norm.weight") or name == "embed_tokens.weight")


def clip_by_global_norm(grads: dict, max_norm: float) -> tuple[dict, float]:
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    coef = min(1.0, max_norm / (norm + 1e-6))
    return {k: g * coef for k, g in grads.items()}, norm


def init_state(params: dict) -> dict:
    """AdamW moments start at exactly zero (C-GPUINIT-001)."""
    return {"t": 0, "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def train_step(params: dict, state: dict, micro_batches, cfg, h: RefHyper):
    """One optimizer step in place on (params, state); returns (loss, grad_norm, lr)."""
    loss, grads, _ = loss_and_grads(params, micro_batches, cfg)
    grads, norm = clip_by_global_norm(grads, h.grad_clip)
    t = state["t"] + 1
    lr = lr_at(t, h)
    for k in params:
        wd = h.weight_decay if decays(k) else 0.0
        params[k], state["m"][k], state["v"][k] = adamw_step(
            params[k], grads[k], state["m"][k], state["v"][k], t, lr, h.beta1, h.beta2,
            h.adam_eps, wd)
    state["t"] = t
    return loss, norm, lr


def train(params: dict, steps_batches, cfg, h: RefHyper):
    """Run one step per element of `steps_batches` (each a list of (inputs, targets)
    micro-batches). Returns (params, state, losses, grad_norms, lrs)."""
    params = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
    state = init_state(params)
    losses, norms, lrs = [], [], []
    for micro in steps_batches:
        loss, norm, lr = train_step(params, state, micro, cfg, h)
        losses.append(loss)
        norms.append(norm)
        lrs.append(lr)
    return params, state, losses, norms, lrs
