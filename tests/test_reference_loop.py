"""Reference-loop parity: the torch training loop (impl/train.py Trainer, fp32, the code the CLI
runs) against the numpy float64 loop with a hand-written backward (reference/train.py), from the
same initial weights on the same batches, for 12 optimizer steps with grad_accum 2, ignored
targets (so micro-batches carry different token counts), warmup + cosine and active clipping.

Tolerances, derived (u = 2^-24 ≈ 6e-8, fp32 unit roundoff; the reference's float64 error is
~1e-16 and ignored):
  * loss, per step: the fp32 forward chains ~12 GEMM / norm / softmax stages per layer with
    reductions of length K ≤ 192; typical (random-walk) rounding is ~√K·u ≈ 14u per stage, so
    ≈ 2 layers · 12 · 14u ≈ 340u ≈ 2e-5 relative on the logits at worst, and the loss (≈ ln V
    ≈ 6.2) inherits it: TOL_LOSS = 2e-5 · 6.2 ≈ 1.2e-4 absolute. Parameter drift adds less
    than that over 12 steps (see below). Observed: ≤ 6e-7.
  * parameters, per tensor: ‖θ_torch − θ_ref‖ / ‖θ_ref − θ_0‖, the error relative to the total
    update. Adam's step η·m̂/(√v̂+ε) is invariant to gradient scale, so a relative gradient
    error ε_g (≈ 2e-5, as for the logits) becomes an ≈ ε_g relative error of each step; over
    T = 12 steps they add at most linearly: TOL_PARAM = 12 · 2e-5 ≈ 2.4e-4, rounded to 3e-4.
    (Elements whose gradient is below the fp32 noise floor can flip Adam's sign-like first step;
    they are few and the per-tensor L2 norm bounds their weight.) Observed: ≤ 4e-5.
  * grad norm, per step: a sum of squares of ~2e5 terms: ≈ ε_g relative: 1e-4.
Negative controls below show each tolerance is tight enough to catch the seeds' bugs (weight
decay on norms/embeddings, clipping with ‖g‖², an off-by-one schedule, accumulation as a mean of
per-micro-batch means): they all exceed it by ≥ 40×.
"""

import math

import numpy as np
import pytest
import torch

from falsify.impl import data as D
from falsify.impl import train as T
from falsify.impl.model import build_model
from falsify.reference import model as RM
from falsify.reference import train as RT

STEPS = 12
TOL_LOSS = 1.2e-4
TOL_PARAM = 3e-4
TOL_GNORM = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = T.tiny_config(tmp_path_factory.mktemp("ref"), max_steps=STEPS, warmup_steps=1,
                            grad_accum=2, lr=3e-3, lr_min=3e-4)
        mcfg = T.model_config(cfg)
        data = D.prepare_data(T.data_spec(cfg, mcfg.vocab_size))
        sampler = D.BatchSampler(D.token_stream(data.train, 0), mcfg.max_seq_len,
                                 cfg.batch_size, cfg.grad_accum, cfg.epochs, cfg.seed)
        steps = []
        for t in range(STEPS):
            micro = sampler.next_step()
            x, y = micro[0]
            y = y.clone()
            y[:, : (3 * t) % 32] = T.IGNORE_INDEX  # unequal token counts per micro-batch
            micro[0] = (x, y)
            steps.append(micro)
        model = build_model(mcfg, "torch", seed=0)
        init = {k: v.detach().double().numpy().copy() for k, v in model.state_dict().items()}
        tr = T.Trainer(model, cfg, torch.device("cpu"))
        stats = [tr.train_step(m) for m in steps]
    finally:
        torch.set_num_threads(threads)
    final = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    rcfg = RM.RefModelConfig(**{k: getattr(mcfg, k) for k in (
        "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
        "intermediate_size", "max_seq_len", "rope_theta", "rms_norm_eps")})
    hyper = RT.RefHyper(cfg.lr, cfg.lr_min, cfg.warmup_steps, cfg.max_steps, cfg.beta1,
                        cfg.beta2, cfg.adam_eps, cfg.weight_decay, cfg.grad_clip)
    np_steps = [[(x.numpy(), y.numpy()) for x, y in m] for m in steps]

    def reference():
        return RT.train(init, np_steps, rcfg, hyper)

    return {"stats": stats, "init": init, "final": final, "reference": reference}


def _param_rel(final, ref, init):
    return {k: float(np.linalg.norm(final[k] - ref[k]) / np.linalg.norm(ref[k] - init[k]))
            for k in ref}


def test_torch_loop_matches_reference(runs):
    params, state, losses, norms, lrs = runs["reference"]()
    stats = runs["stats"]
    assert state["t"] == STEPS
    assert [s.lr for s in stats] == pytest.approx(lrs, rel=1e-15)
    assert any(n > 1.0 for n in norms), "clipping should be active in this run"
    for s, ref in zip(stats, losses):
        assert abs(s.loss - ref) <= TOL_LOSS
    for s, ref in zip(stats, norms):
        assert abs(s.grad_norm - ref) <= TOL_GNORM * ref
    rel = _param_rel(runs["final"], params, runs["init"])
    worst = max(rel, key=rel.get)
    assert rel[worst] <= TOL_PARAM, f"{worst}: {rel[worst]:.2e}"
    assert losses[-1] < losses[0]  # and it is actually training


def _clip_squared(g, c):  # MUT: clip by ‖g‖² instead of ‖g‖
    n = math.sqrt(sum(float(np.sum(v * v)) for v in g.values()))
    return {k: v * min(1.0, c / (n * n + 1e-6)) for k, v in g.items()}, n


def _off_by_one(step, h):  # MUT: schedule evaluated at t+1
    return RT.__dict__["_lr_at_orig"](step + 1, h)


def _mean_of_means(params, micro_batches, cfg, ignore_index=-100):  # MUT: untokenweighted
    out = [RM.loss_and_grads(params, [mb], cfg, ignore_index) for mb in micro_batches]
    n = len(out)
    grads = {k: sum(o[1][k] for o in out) / n for k in params}
    return sum(o[0] for o in out) / n, grads, 0


@pytest.mark.parametrize("name,patch", [
    ("weight decay on norms and embedding", {"decays": lambda name: True}),
    ("clipping with |g|^2", {"clip_by_global_norm": _clip_squared}),
    ("lr schedule off by one", {"lr_at": _off_by_one}),
    ("accumulation as mean of means", {"loss_and_grads": _mean_of_means}),
])
def test_tolerances_catch_known_bugs(runs, monkeypatch, name, patch):
    monkeypatch.setitem(RT.__dict__, "_lr_at_orig", RT.lr_at)
    for k, v in patch.items():
        monkeypatch.setattr(RT, k, v)
    params, _, losses, _, _ = runs["reference"]()
    rel = _param_rel(runs["final"], params, runs["init"])
    loss_gap = max(abs(s.loss - r) for s, r in zip(runs["stats"], losses))
    assert max(rel.values()) > 40 * TOL_PARAM or loss_gap > 40 * TOL_LOSS, name
