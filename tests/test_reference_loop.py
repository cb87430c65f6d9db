"""Reference-loop parity: the torch training loop (falsify/llm/trainer.py, fp32, the code the CLI
runs) against the numpy float64 loop with a hand-written backward (falsify/reference/train.py), from
the
same initial weights on the same batches, for 12 optimizer steps with grad_accum 2, ignored
targets (so micro-batches carry different token counts), warmup + cosine and active clipping.

The run and the derived tolerances live in falsify/probes/train_loop.py
(falsify/contracts/train-loop-v1.yaml,
FALSIFY-TL-012 runs the same comparison as a contract check); this file keeps the negative
controls: each of the known loop bugs (weight decay on norms/embeddings, clipping with ‖g‖², an
off-by-one schedule, accumulation as a mean of per-micro-batch means), put into the reference
loop, exceeds the tolerances by ≥ 40×, so the tolerances are tight enough to catch them.
"""

import math

import numpy as np
import pytest

from falsify.probes import train_loop as PT
from falsify.reference import model as RM
from falsify.reference import train as RT

STEPS = 12
TOL_LOSS = PT.TOL_LOSS
TOL_PARAM = PT.TOL_PARAM
TOL_GNORM = PT.TOL_GNORM


@pytest.fixture(scope="module")
def runs():
    return PT.parity_setup("torch", STEPS)


def _param_rel(final, ref, init):
    return PT.param_rel(final, ref, init)


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
