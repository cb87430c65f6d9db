"""`falsify bench finetune` runs both sides on one batch and reports comparable numbers."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest


def test_bench_finetune_tiny_json(capsys):
    from falsify.cli import main

    assert main(["bench", "finetune", "--size", "tiny", "--steps", "1", "--no-memory",
                 "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["ours_tok_s"] > 0 and r["theirs_tok_s"] > 0
    assert r["tok_s_ratio"] == pytest.approx(r["ours_tok_s"] / r["theirs_tok_s"])
    # bitsandbytes is installed (interop extra), so the reference is the real NF4 QLoRA stack,
    # not the fp32-LoRA stand-in the bench uses where bitsandbytes cannot run
    assert r["reference"].startswith("transformers + peft + bitsandbytes NF4"), r["reference"]
    nb = r["nf4_base"]
    assert abs(nb["projections_ratio"] - 4.127 / 32) < 0.002  # double quantization
    assert nb["projections_stored"] < nb["projections_fp32"] / 7


@pytest.mark.heavy
def test_bench_finetune_table_with_memory_children(tmp_path):
    """As the README runs it (table, memory on), at the smallest size: the memory of each side
    is measured in a child started as `python -m falsify bench finetune --measure ...`."""
    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "finetune", "--size", "tiny",
                        "--steps", "1"], capture_output=True, text=True, timeout=900,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {m.group(1).strip(): m.group(2, 3) for m in re.finditer(
        r"^[│|]?\s*(peak RSS, build \+ 2 steps, MiB|resident after build, MiB|tokens/s)\s*[│|]\s*"
        r"([\d,.]+)\s*[│|]\s*([\d,.]+)", r.stdout, re.M)}
    assert set(rows) == {"tokens/s", "peak RSS, build + 2 steps, MiB",
                         "resident after build, MiB"}, r.stdout
    for ours, theirs in rows.values():
        assert float(ours.replace(",", "")) > 0 and float(theirs.replace(",", "")) > 0
    assert "base projections: NF4" in r.stdout
