"""The training loop in numpy float64, written to read like the math.

One optimizer step t = 1, 2, ...:
    L, g   = token-weighted loss and gradient over the step's micro-batches
    (falsify/reference/model.py)
    ‖g‖    = sqrt(Σ_params Σ g²)                          global L2 norm, before clipping
    g     ← g · min(1, c / (‖g‖ + 1e-6))                  global-norm clipping (torch's 1e-6)
    η_t    = η·(t−1)/W                   for t−1 < W       linear warmup (update index t−1,
           = η_min + ½(η − η_min)(1 + cos(π (t−1−W)/(T−W)))    0-based; cosine to η_min at T)
    θ     ← AdamW(θ, g, t, η_t, β1, β2, ε, λ)             λ = 0 for norm gains and the embedding

Independent of the torch loop in falsify/llm/trainer.py (it imports no torch) so that agreement
between the two is evidence, not a tautology. AdamW, clipping and the schedule are
falsify/reference/adamw.py, grad_clip.py and lr_schedule.py, the functions their kernel contracts
check.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from falsify.reference import grad_clip, lr_schedule
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
    """LR of update `step` (0-based), falsify/reference/lr_schedule.py (the schedule contract)."""
    return float(lr_schedule.lr_at(np.int64(step), h.warmup_steps, h.max_steps, h.lr, h.lr_min))


def decays(name: str) -> bool:
    """Norm gains and the tied embedding get no weight decay
    (falsify/llm/trainer.py:is_no_decay)."""
    return not (name.endswith("norm.weight") or name == "embed_tokens.weight")


def clip_by_global_norm(grads: dict, max_norm: float) -> tuple[dict, float]:
    """falsify/reference/grad_clip.py with torch's epsilon 1e-6."""
    keys = list(grads)
    clipped, norm = grad_clip.clip_grad_norm_list([grads[k] for k in keys], max_norm, 1e-6,
                                                  False)
    return dict(zip(keys, clipped)), norm


def init_state(params: dict) -> dict:
    """AdamW moments start at exactly zero."""
    return {"t": 0, "m": {k: np.zeros_like(v) for k, v in params.items()},
            "v": {k: np.zeros_like(v) for k, v in params.items()}}


def train_step(params: dict, state: dict, micro_batches, cfg, h: RefHyper):
    """One optimizer step in place on (params, state); returns (loss, grad_norm, lr)."""
    loss, grads, _ = loss_and_grads(params, micro_batches, cfg)
    grads, norm = clip_by_global_norm(grads, h.grad_clip)
    lr = lr_at(state["t"], h)
    t = state["t"] + 1
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
