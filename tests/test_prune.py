"""`falsify prune`: calibration inputs reach WANDA's norms exactly, the recording leaves the
model's kernels as they were, the command prunes to exactly the planned sparsity and reports
perplexity before and after, and bad settings are one-line refusals."""

from __future__ import annotations

import json

import pytest
import torch

from falsify.impl.llm import finetune as FT
from falsify.impl.llm import prune as P
from tests.test_finetune import base_with_tokenizer, tiny_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return base_with_tokenizer(tmp_path_factory.mktemp("prune"))


def test_activation_norms_are_the_projections_inputs():
    model = tiny_model().eval()
    ids = [list(range(4, 40)), list(range(50, 86))]
    norms = P.activation_norms(model, ids)
    assert set(norms) == set(P.projection_weights(model))
    with torch.no_grad():
        x = model.embed_tokens(torch.tensor(ids))
        xin = model.layers[0].input_layernorm(x).double()
        # window by window, in the order calibration adds them
        want = (xin[0].pow(2).sum(0) + xin[1].pow(2).sum(0)).sqrt()
    for p in ("q_proj", "k_proj", "v_proj"):  # all three read the normed block input
        assert torch.equal(norms[f"layers.0.self_attn.{p}"], want)
    # the recording is gone afterwards: the model calls its shared kernels again
    assert all(getattr(m, "ops", model.ops) is model.ops for m in model.modules())
    assert model.ops.linear.__name__ == "linear" and model.ops.linear.__module__ != P.__name__


def test_wanda_and_magnitude_choose_different_masks():
    model = tiny_model()
    norms = P.activation_norms(model, [list(range(4, 60))])
    a, b = tiny_model(), tiny_model()
    P.prune(a, P.parse_plan("wanda", 0.5, None), norms)
    P.prune(b, P.parse_plan("magnitude", 0.5, None), None)
    wa, wb = P.projection_weights(a), P.projection_weights(b)
    assert any(not torch.equal(wa[n] == 0, wb[n] == 0) for n in wa)


@pytest.mark.parametrize("argv, planned", [
    (["--sparsity", "0.5"], 0.5),
    (["--pattern", "2:4", "--method", "magnitude"], 0.5),
    (["--sparsity", "0.3"], None),
])
def test_prune_cli_prunes_exactly_and_reports_perplexity(base, tmp_path, argv, planned, capsys):
    from falsify.cli import main

    out = tmp_path / "out"
    assert main(["prune", "--model", str(base), "--out", str(out), "--calibration", "2",
                 *argv]) == 0
    assert "exactly the planned sparsity" in capsys.readouterr().out
    rep = json.loads((out / "prune.json").read_text())
    assert rep["perplexity_after"] > 0 and rep["perplexity_before"] > 0
    pruned = FT.load_base(out / "ours", "torch").model
    for name, w in P.projection_weights(pruned).items():
        zeros = (w == 0).sum(-1)
        k = planned * w.shape[1] if planned is not None else int(0.3 * w.shape[1])
        assert torch.all(zeros == k), name  # every row, not just on average
        assert rep["sparsity"][name] == pytest.approx(float(zeros.sum()) / w.numel())
    assert (out / "hf" / "config.json").is_file()


@pytest.mark.parametrize("argv, words", [
    (["--pattern", "3:2"], "need 0 < N <= M"),
    (["--pattern", "two:four"], "keep N of every M"),
    (["--sparsity", "1.5"], "must be in [0, 1)"),
    (["--calibration", "0"], "--calibration must be >= 1"),
    (["--pattern", "1:3"], "not a multiple of 3"),
])
def test_prune_refuses_bad_settings_in_one_line(base, tmp_path, argv, words, capsys):
    from falsify.cli import main

    assert main(["prune", "--model", str(base), "--out", str(tmp_path / "o"), *argv]) == 2
    text = "".join(capsys.readouterr())
    assert words in text and "Traceback" not in text
    assert not (tmp_path / "o").exists()
