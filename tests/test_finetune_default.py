"""`falsify finetune` with no data and no model: trains the built-in base with the pretraining
loop on the stdlib (into a fresh cache here, as on a new machine), then QLoRA-fine-tunes it on
the shipped dataset. The run must complete, the training loss and the held-out loss must fall, and a
second run must reuse the cached base instead of training it again."""

from __future__ import annotations

import json

import pytest

from falsify.cli import main
from falsify.llm import lora_model as LM
from falsify.llm import sft_data as SD


def test_shipped_dataset_is_small_and_valid():
    assert SD.SHIPPED_DATASET.stat().st_size <= 1_000_000
    recs = SD.read_jsonl(SD.SHIPPED_DATASET)
    assert len(recs) > 1000 and {r.kind for r in recs} == {"prompt_response"}
    # the cut is after the docstring's closing quotes; the response opens with the newline
    assert all(r.fields["response"].startswith("\n") for r in recs)


@pytest.mark.heavy
def test_default_finetune_completes_and_the_loss_falls(tmp_path, capsys):
    out = tmp_path / "run"
    args = [f"cache_dir={tmp_path / 'cache'}", f"out_dir={out}", "progress=false"]
    assert main(["finetune", *args]) == 0
    text = capsys.readouterr().out
    assert "built-in demo" in text and "training the tiny preset" in text
    s = json.loads((out / "summary.json").read_text())
    assert s["final_step"] == 60 and s["stopped"] == "max_steps"
    losses = s["losses"]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.1
    evals = s["evals"]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 60
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.1  # vs the frozen base itself
    assert (out / "adapter" / LM.ADAPTER_WEIGHTS).is_file()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["lora"]["method"] == "qlora" and cfg["base"]["builtin"] is True
    assert abs(cfg["memory"]["projections_ratio"] - 4.127 / 32) < 0.002
    # the base is cached: a second run (another out_dir) reuses it
    assert main(["finetune", *args[:1], f"out_dir={tmp_path / 'again'}", "progress=false",
                            "max_steps=2"]) == 0
    assert "built-in base: reusing" in capsys.readouterr().out
