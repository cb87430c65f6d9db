"""`falsify bench finetune` runs both sides on one batch and reports comparable numbers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")


def test_bench_finetune_tiny_json(capsys):
    from falsify.bench_finetune import main

    assert main(["--size", "tiny", "--steps", "1", "--no-memory", "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ours_tok_s"] > 0 and r["theirs_tok_s"] > 0
    assert r["tok_s_ratio"] == pytest.approx(r["ours_tok_s"] / r["theirs_tok_s"])
    assert r["reference"].startswith("transformers + peft")
    nb = r["nf4_base"]
    assert abs(nb["projections_ratio"] - 4.127 / 32) < 0.002  # double quantization
    assert nb["projections_stored"] < nb["projections_fp32"] / 7
