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
    out, err = capsys.readouterr()
    rows = json.loads(out)["rows"]
    assert [r["base"] for r in rows] == ["nf4", "q8_0"]
    # in a log (no terminal): one line per finished base on stderr, beside stdout's JSON
    done = [m[1] for m in (re.match(r"^bench finetune: (\S+): ours \d+ tok/s, reference \d+ "
                                    r"tok/s, ratio [\d.]+, \d+ s$", ln)
                           for ln in err.splitlines()) if m]
    assert done == ["nf4", "q8_0"], err
    for r in rows:
        assert r["ours_tok_s"] > 0 and r["theirs_tok_s"] > 0
        assert r["tok_s_ratio"] == pytest.approx(r["ours_tok_s"] / r["theirs_tok_s"])
        # the split behind the ceiling: both sides run GEMMs, and the ceiling is the
        # reference's step over ours' GEMM time
        for side in ("ours", "theirs"):
            assert 0 < r["breakdown"][side]["gemm_share"] < 1
        gemm_s = r["ours_step_s"] * r["breakdown"]["ours"]["gemm_share"]
        assert r["ceiling"] == pytest.approx(r["theirs_step_s"] / gemm_s)
        assert r["non_gemm_ms"] == pytest.approx((r["ours_step_s"] - gemm_s) * 1e3)
        assert r["target_met"] == (r["tok_s_ratio"] >= r["target_ratio"])
    nf4, gguf = rows
    # bitsandbytes is installed (interop extra), so the reference is the real NF4 QLoRA stack,
    # not the fp32-LoRA stand-in the bench uses where bitsandbytes cannot run
    assert nf4["reference"].startswith("transformers + peft + bitsandbytes NF4"), nf4["reference"]
    nb = nf4["nf4_base"]
    assert abs(nb["projections_ratio"] - 4.127 / 32) < 0.002  # double quantization
    assert nb["projections_stored"] < nb["projections_fp32"] / 7
    # the GGUF row: ours keeps q8_0 blocks; transformers loads the same file dequantized
    assert "q8_0 GGUF" in gguf["ours_name"] and "q8_0 GGUF" in gguf["reference"]
    assert gguf["bnb"] is None


def test_bench_finetune_measure_needs_one_base(capsys):
    from falsify.cli import main

    assert main(["bench", "finetune", "--measure", "ours", "--size", "tiny"]) == 2
    assert "needs one --base" in capsys.readouterr().err


@pytest.mark.parametrize("side", ["ours", "theirs"])
def test_bench_finetune_measures_the_gguf_row(side):
    """The memory child of the GGUF row, started as the bench starts it (the table test runs
    the NF4 row's children): a fresh process, so the model's pages are new resident memory."""
    from falsify.bench import finetune as B

    m = B.memory_in_subprocess(side, "tiny", False, "q8_0")
    assert m["peak"] >= m["model_rss"] > 0


def test_gguf_bases_see_the_same_weights():
    """Both sides of the GGUF row start from one file: ours' q8_0 model and transformers'
    dequantized load of it give the same logits (up to fp32 summation order)."""
    import torch

    from falsify.bench import finetune as B

    ours, theirs = B.Ours("tiny", "q8_0"), B.Theirs("tiny", False, "q8_0")
    x, _ = B._batch("tiny")
    with torch.no_grad():
        a = ours.model(x)
        b = theirs.model(input_ids=x).logits
    # each fp32 side is within tests/test_gguf_io.py's bound of the float64 truth,
    # 8·(2L + 1)·√K·u·max|logit|, so the two are within twice that of each other
    cfg = B._cfg("tiny")
    k = max(cfg.hidden_size, cfg.intermediate_size)
    tol = 2 * 8 * (2 * cfg.num_layers + 1) * k ** 0.5 * 2.0**-24 * float(a.abs().max())
    assert float((a - b).abs().max()) <= tol, (float((a - b).abs().max()), tol)


@pytest.mark.heavy
def test_bench_finetune_table_with_memory_children(tmp_path):
    """As the README runs it (table, memory on), at the smallest size: the memory of each side
    is measured in a child started as `python -m falsify bench finetune --measure ...`."""
    # one base keeps this within CI's time (the GGUF row's sides run in the JSON test above)
    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "finetune", "--size", "tiny",
                        "--steps", "1", "--base", "nf4"], capture_output=True, text=True,
                       timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {m.group(1).strip(): m.group(2, 3) for m in re.finditer(
        r"^[│|]?\s*(peak RSS, build \+ 2 steps, MiB|resident after build, MiB|tokens/s)\s*[│|]\s*"
        r"([\d,.]+)\s*[│|]\s*([\d,.]+)", r.stdout, re.M)}
    assert set(rows) == {"tokens/s", "peak RSS, build + 2 steps, MiB",
                         "resident after build, MiB"}, r.stdout
    for ours, theirs in rows.values():
        assert float(ours.replace(",", "")) > 0 and float(theirs.replace(",", "")) > 0
    assert "base projections: NF4" in r.stdout
    assert "ceiling t_ref / t_GEMM(ours)" in r.stdout and "GGUF" not in r.stdout
