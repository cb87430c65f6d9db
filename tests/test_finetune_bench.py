"""`falsify bench finetune` runs both sides on one batch and reports comparable numbers."""

from __future__ import annotations

import json

import pytest


def test_bench_finetune_tiny_json(capsys):
    from falsify.bench.finetune import main

    assert main(["--size", "tiny", "--steps", "1", "--no-memory", "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ours_tok_s"] > 0 and r["theirs_tok_s"] > 0
    assert r["tok_s_ratio"] == pytest.approx(r["ours_tok_s"] / r["theirs_tok_s"])
    # bitsandbytes is installed (interop extra), so the reference is the real NF4 QLoRA stack,
    # not the fp32-LoRA stand-in the bench uses where bitsandbytes cannot run
    assert r["reference"].startswith("transformers + peft + bitsandbytes NF4"), r["reference"]
    nb = r["nf4_base"]
    assert abs(nb["projections_ratio"] - 4.127 / 32) < 0.002  # double quantization
    assert nb["projections_stored"] < nb["projections_fp32"] / 7
