"""`falsify prune`: calibration inputs reach WANDA's norms exactly, the recording leaves the
model's kernels as they were, the command prunes to exactly the planned sparsity, records its
masks and reports perplexity before and after, and bad settings are one-line refusals.

Masks kept through a fine-tune: `falsify finetune --keep-masks` on a pruned base trains
W + M ⊙ (s·B·A) and `falsify merge --adapter` writes it, so every pruned weight is exactly 0.0
in the merged model and the merged logits equal the adapted model's; without --keep-masks the
same merge refills the zeros (the check can fail)."""

from __future__ import annotations

import json

import pytest
import torch

from falsify.llm import finetune as FT
from falsify.llm import lora_model as LM
from falsify.llm import prune as P
from tests.test_finetune import (
    CFG,
    base_with_tokenizer,
    logit_tolerance,
    shipped_records,
    tiny_model,
    write_jsonl,
)


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
    # the masks are recorded beside both layouts' weights, and they are the zeros it made
    masks = LM.read_masks(out / "ours" / LM.MASKS_FILE)
    assert set(masks) == set(P.projection_weights(pruned))
    for name, w in P.projection_weights(pruned).items():
        assert torch.all(w[~masks[name]] == 0), name
        assert int((~masks[name]).sum()) == int((w == 0).sum()), name  # std-0.08 weights
    hf_masks = LM.read_masks(out / "hf" / LM.MASKS_FILE)
    assert all(torch.equal(hf_masks[k], masks[k]) for k in masks)
    assert FT.load_base(out / "hf", "torch").masks is not None


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


# ---------------------------------------------------------- masks kept through a fine-tune
@pytest.fixture(scope="module")
def masked_runs(base, tmp_path_factory):
    """A 50 % magnitude-pruned base (falsify/llm/prune.py, masks written as `falsify prune`
    writes them) and two QLoRA fine-tunes of it through the CLI, with and without
    --keep-masks, each merged with `falsify merge --adapter`."""
    from falsify.cli import main
    from falsify.cli.merge import write_ours

    root = tmp_path_factory.mktemp("masked")
    loaded = FT.load_base(base, "torch")
    masks: dict = {}
    P.prune(loaded.model, P.parse_plan("magnitude", 0.5, None), None, masks)
    pruned = write_ours(loaded.model, root / "pruned", loaded.tokenizer_path, {}, masks=masks)
    data = write_jsonl(root / "d.jsonl", shipped_records(24))
    out = {}
    for key, extra in (("kept", ["--keep-masks"]), ("dense", [])):
        run = root / f"run-{key}"
        assert main(["finetune", "--method", "qlora", "--model", str(pruned), "--data",
                     str(data), "--out", str(run), "max_steps=3", "batch_size=4", "lora_r=4",
                     "lr=3e-2", "val_split=0", "sample_count=0", "progress=false",
                     "backend=torch", *extra]) == 0
        assert main(["merge", "--adapter", str(run / "adapter"), "--out",
                     str(root / f"merged-{key}")]) == 0
        out[key] = (run / "adapter", root / f"merged-{key}")
    return pruned, masks, out


def test_keep_masks_merge_keeps_every_pruned_weight_exactly_zero(masked_runs):
    pruned, masks, out = masked_runs
    adapter, merged_dir = out["kept"]
    assert not (adapter / LM.ADAPTER_CONFIG).exists()  # not a PEFT adapter (see below)
    model = LM.load_adapter(FT.load_base(pruned, "torch").model, adapter).eval()
    merged = FT.load_base(merged_dir / "ours", "torch")
    weights = P.projection_weights(merged.model)
    moved = 0
    for name, m in LM.adapted_layers(model):
        w = weights[name]
        assert torch.all(w[~masks[name]] == 0.0), name  # exactly 0.0, every pruned position
        # the dense delta the mask removed is not 0 there: without the mask they would refill
        dense = m.scale() * (m.lora_B.weight @ m.lora_A.weight).detach()
        moved += int((dense[~masks[name]] != 0).sum())
    assert moved > 0
    # the merged model carries the masks on (both layouts), checked against its zeros on load
    assert merged.masks is not None and all(torch.equal(merged.masks[k], masks[k])
                                            for k in masks)
    assert FT.load_base(merged_dir / "hf", "torch").masks is not None
    x = torch.randint(4, CFG.vocab_size, (2, 48), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = model(x)
        m = merged.model.eval()(x)
        with LM.adapters_disabled(model):
            b = model(x)
    assert float((a - m).abs().max()) <= logit_tolerance(CFG, a)
    assert float((a - b).abs().max()) > 100 * logit_tolerance(CFG, a)  # the adapter matters


def test_without_keep_masks_the_merge_refills_the_pruned_zeros(masked_runs):
    _, masks, out = masked_runs
    _, merged_dir = out["dense"]
    merged = FT.load_base(merged_dir / "ours", "torch")
    assert merged.masks is None
    weights = P.projection_weights(merged.model)
    refilled = sum(int((weights[n][~masks[n]] != 0).sum()) for n in masks)
    pruned = sum(int((~masks[n]).sum()) for n in masks)
    assert refilled > pruned // 2  # a dense delta lands on (nearly) every pruned position


def test_masked_adapter_refuses_peft_export(masked_runs, tmp_path, capsys):
    from falsify.cli import main

    adapter, _ = masked_runs[2]["kept"]
    assert main(["export", str(adapter), "--out", str(tmp_path / "e")]) == 2
    text = "".join(capsys.readouterr())
    assert "cannot express the masked delta" in text and "Traceback" not in text
    assert not (tmp_path / "e").exists()


def test_keep_masks_needs_a_base_with_masks(base, tmp_path, capsys):
    from falsify.cli import main

    data = write_jsonl(tmp_path / "d.jsonl", shipped_records(8))
    assert main(["finetune", "--model", str(base), "--data", str(data), "--keep-masks",
                 "--out", str(tmp_path / "run"), "max_steps=1", "batch_size=4",
                 "val_split=0", "sample_count=0", "progress=false", "backend=torch"]) == 2
    text = "".join(capsys.readouterr()).replace("\n", "")
    assert "keep_masks=true" in text and "carries no pruning masks" in text


def test_masks_that_do_not_match_the_weights_are_refused(masked_runs, tmp_path):
    from falsify.cli.merge import write_ours

    pruned, masks, _ = masked_runs
    model = FT.load_base(pruned, "torch").model
    with torch.no_grad():  # a pruned weight comes back (as a merge without masks would do it)
        w = P.projection_weights(model)["layers.1.mlp.up_proj"]
        w[~masks["layers.1.mlp.up_proj"]] = 0.5
    bad = write_ours(model, tmp_path / "bad", None, {}, masks=masks)
    with pytest.raises(FT.FinetuneConfigError, match="up_proj that the mask prunes are not 0"):
        FT.load_base(bad, "torch", need_tokenizer=False)
