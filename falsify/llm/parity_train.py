"""Two backends trained side by side from the same weights on the same batches: per-step loss
and parameter drift, and the step at which they separate beyond a derived budget.

Both runs use the same optimizer (torch.optim.AdamW, the same hyperparameters) and differ only
in the model's kernels. The budget at step t (1-based) is B_t = 2·ρ_g·t relative: each backend's
gradient is within ρ_g = 3ρ of the exact one (model-parity-v1, PAR-GRAD-001, ρ the forward's
budget), so the two differ by ≤ 2ρ_g per step; Adam's update is invariant to the gradient's
scale, so a relative gradient difference moves each update by about that fraction of its size,
and while the dynamics do not amplify the difference adds up linearly over steps. The loss
difference |ℓ_a − ℓ_b| / |ℓ_b| and the parameter drift ‖θ_a − θ_b‖ / ‖θ_b − θ₀‖ are held to
B_t; the first step where either leaves it is where the runs separate (the dynamics amplify,
or a kernel is off).
"""

from __future__ import annotations

import torch

from falsify.llm import parity as P


def budget(cfg, tokens: int) -> float:
    """ρ_g = 3ρ, ρ = β·((4^L − 1)/3 + 1): the gradient budget of model-parity-v1."""
    beta = P.layer_budget(cfg, tokens)
    return 3 * beta * ((4 ** cfg.num_layers - 1) / 3 + 1)


def train_compare(setup: P.Setup, ops_a, ops_b, steps: int, seed: int, lr: float = 1e-3,
                  batch: int = 2) -> dict:
    cfg, s = setup.cfg, setup.ids.shape[1]
    models = [P.torch_model(cfg, setup.weights, o).train() for o in (ops_a, ops_b)]
    opts = [torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.1) for m in models]
    init = {k: v.clone() for k, v in setup.weights.items()}
    g = torch.Generator().manual_seed(seed + 2)
    rho_g = budget(cfg, s)
    rows, separated = [], None
    for t in range(1, steps + 1):
        x = torch.randint(0, cfg.vocab_size, (batch, s), generator=g)
        y = torch.randint(0, cfg.vocab_size, (batch, s), generator=g)
        losses = []
        for m, opt in zip(models, opts, strict=True):
            opt.zero_grad(set_to_none=True)
            total, n = m.loss_sum(x, y)
            (total / n).backward()
            opt.step()
            losses.append(float(total.detach()) / n)
        pa, pb = ({k: v.detach() for k, v in m.named_parameters()} for m in models)
        diff = sum(float((pa[k] - pb[k]).double().pow(2).sum()) for k in pa) ** 0.5
        upd = sum(float((pb[k] - init[k]).double().pow(2).sum()) for k in pb) ** 0.5
        row = {"step": t, "loss_a": losses[0], "loss_b": losses[1],
               "loss_rel": abs(losses[0] - losses[1]) / abs(losses[1]),
               "param_drift": diff / upd if upd else 0.0, "budget": 2 * rho_g * t}
        rows.append(row)
        if separated is None and max(row["loss_rel"], row["param_drift"]) > row["budget"]:
            separated = t
    return {"steps": rows, "separated_at": separated, "rho_g": rho_g}
