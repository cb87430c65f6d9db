"""`falsify bench train`: every side runs, the numbers are consistent, and the speed comparison is
refused when the two models do not compute the same loss."""

from __future__ import annotations

import json
import re

import pytest
import torch


def test_default_shapes_are_the_presets_context_length():
    from falsify.bench.train import default_shape

    # the step measured is the step `falsify train` runs: blocks of the preset's max_seq_len
    assert default_shape("tiny") == (16, 128)
    assert default_shape("50m") == (1, 1024)
    assert default_shape("350m") == (1, 1024)


def test_bench_train_runs_all_sides(tmp_path, capsys):
    """`falsify bench train` at a tiny shape: ours, eager transformers and transformers under
    torch.compile all run (this machine has a C++ compiler, so inductor must work here), and
    every figure reported follows from the measured step times."""
    from falsify.bench.train import SIDES, TARGET_SPEEDUP, flops_per_token
    from falsify.cli import main
    from falsify.llm.model import param_count, preset

    out = tmp_path / "r.json"
    assert main(["bench", "train", "--presets", "tiny", "--batch", "2", "--seq", "32",
                 "--steps", "2", "--warmup", "1", "--threads", "1", "--json", str(out)]) == 0
    text, err = capsys.readouterr()
    (r,) = json.loads(out.read_text())
    # in a log (no terminal): one line per finished preset on stderr
    assert re.search(r"^bench train: tiny: 2x32, 2 steps per side, \d+ s$", err, re.M), err
    cfg = preset("tiny", max_seq_len=32)
    assert r["params"] == param_count(cfg) and (r["batch"], r["seq"]) == (2, 32)
    lc = r["loss_check"]
    assert lc["ok"] and lc["diff"] <= lc["tol"]
    assert r["flops_per_token"] == flops_per_token(cfg, 32)
    for kind in SIDES:
        k = r[kind]
        assert "failed" not in k, k.get("failed")
        assert k["step_s"] > 0 and k["tok_s"] == pytest.approx(2 * 32 / k["step_s"])
        assert k["gflop_s"] == pytest.approx(r["flops_per_token"] * k["tok_s"] / 1e9)
        assert k["step_mem_mb"] > 0 and len(k["times_s"]) == 2
    # each speedup is the median of the paired step ratios t_side / t_ours
    for kind in ("hf", "hf_compiled"):
        pairs = [t / o for t, o in zip(r[kind]["times_s"], r["ours"]["times_s"])]
        v = r["vs"][kind]
        assert v["pairs"] == pytest.approx(pairs)
        assert v["speedup"] == pytest.approx(sum(pairs) / 2)
        lo, hi = v["quartiles"]
        assert min(pairs) <= lo <= v["speedup"] <= hi <= max(pairs)
        assert v["mem_ratio"] == pytest.approx(r["ours"]["step_mem_mb"] / r[kind]["step_mem_mb"])
    assert r["speedup"] == r["vs"]["hf"]["speedup"]
    assert r["target_met"] == (r["speedup"] >= TARGET_SPEEDUP)
    assert r["ahead_of_compiled"] == (r["vs"]["hf_compiled"]["speedup"] > 1.0)
    # the compiled side: its first step compiled (it took longer than a compiled step), and
    # it computed eager transformers' loss on the same batch from the same weights
    c = r["hf_compiled"]
    assert c["graphs"] >= 1 and c["first_step_s"] > c["step_s"]
    assert c["compile_s"] == pytest.approx(c["first_step_s"] - c["step_s"])
    assert abs(c["first_loss"] - lc["loss_hf"]) <= lc["tol"]
    assert c["fx_cache_hits"] + c["fx_cache_misses"] >= 1
    assert "torch.compile: first step" in text and "vs transformers + torch.compile" in text
    assert len(r["load_average"]) == 2
    # the profiled breakdown: every side runs GEMMs; ours' share of them gives the ceiling
    for kind in SIDES:
        bd = r[kind]["breakdown"]
        assert bd["gemm_ms"] > 0 and bd["other_ms"] > 0 and 0 < bd["gemm_share"] < 1
        parts = ("gemm", "attention", "other")
        assert bd["total_ms"] == pytest.approx(sum(bd[f"{p}_ms"] for p in parts))
        for p in parts:
            assert bd[f"{p}_share"] == pytest.approx(bd[f"{p}_ms"] / bd["total_ms"])
    assert r["ours"]["breakdown"]["attention_ms"] > 0  # ours: torch's fused SDPA kernel
    gemm_s = r["ours"]["step_s"] * r["ours"]["breakdown"]["gemm_share"]
    assert r["ceiling"] == pytest.approx(r["hf"]["step_s"] / gemm_s)
    assert r["non_gemm_ms"] == pytest.approx((r["ours"]["step_s"] - gemm_s) * 1e3)
    assert r["non_gemm_budget_ms"] == pytest.approx(
        (r["hf"]["step_s"] / TARGET_SPEEDUP - gemm_s) * 1e3)


def test_compile_failure_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    """Inductor without a working C++ compiler (CXX=/bin/false, caches off so nothing compiled
    earlier is reused): the compiled side is reported failed with inductor's error, and ours
    and eager transformers are measured as usual."""
    from falsify.cli import main

    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    out = tmp_path / "r.json"
    assert main(["bench", "train", "--presets", "tiny", "--batch", "1", "--seq", "16",
                 "--steps", "1", "--warmup", "0", "--threads", "1", "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())
    assert set(r["hf_compiled"]) == {"failed"}
    assert "InvalidCxxCompiler" in r["hf_compiled"]["failed"]  # inductor's own error, as is
    assert set(r["vs"]) == {"hf"} and r["ahead_of_compiled"] is None
    assert r["ours"]["step_s"] > 0 and r["hf"]["step_s"] > 0
    text = capsys.readouterr().out
    assert "transformers + torch.compile did not run" in text
    assert "vs transformers + torch.compile: not measured" in text


def test_breakdown_sorts_profiled_ops():
    """Real profiler events: a matmul lands in GEMM, SDPA in attention, an add in other."""
    from torch.profiler import ProfilerActivity, profile

    from falsify.bench.train import breakdown

    a, q = torch.randn(256, 256), torch.randn(1, 2, 64, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            a @ a
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            a + a
    bd = breakdown(prof.key_averages(), steps=2)
    keys = {e.key: e.self_cpu_time_total / 2e3 for e in prof.key_averages()}
    assert bd["gemm_ms"] == pytest.approx(keys["aten::mm"])
    assert bd["attention_ms"] == pytest.approx(sum(v for k, v in keys.items()
                                                   if "scaled_dot_product" in k))
    assert bd["other_ms"] >= keys["aten::add"] > 0
    assert bd["total_ms"] == pytest.approx(sum(keys.values()))
    assert bd["gemm_share"] == pytest.approx(bd["gemm_ms"] / bd["total_ms"])


def test_different_computations_are_not_compared(tmp_path, monkeypatch):
    """A model that computes another loss (one perturbed weight) fails the same-loss check."""
    import falsify.llm.hf as hf
    from falsify.bench.train import check_same_loss
    from falsify.llm.model import build_model, preset

    cfg = preset("tiny", max_seq_len=16)
    hf_dir = hf.export_hf(build_model(cfg, "torch", seed=0), tmp_path / "hf")
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (2, 16), generator=g)
    y = torch.randint(0, cfg.vocab_size, (2, 16), generator=g)
    assert check_same_loss(hf_dir, x, y, "torch")["ok"]

    real = hf.import_hf

    def perturbed(path, backend="auto"):
        m = real(path, backend)
        with torch.no_grad():
            m.layers[0].mlp.down_proj.weight.mul_(3.0)
        return m

    monkeypatch.setattr(hf, "import_hf", perturbed)
    r = check_same_loss(hf_dir, x, y, "torch")
    assert not r["ok"] and r["diff"] > r["tol"]


def test_a_child_that_dies_is_an_error_not_a_hang(tmp_path):
    """A side that cannot start (here: no checkpoint to load) is reported at once, by name."""
    from falsify.bench.train import run_paired

    with pytest.raises(RuntimeError, match=r"bench child 'ours' died before answering 'ready'"):
        run_paired(str(tmp_path / "missing"), str(tmp_path / "missing.pt"), steps=1, warmup=0,
                   threads=1, backend="torch")


def test_bench_train_usage_errors_exit_2(capsys):
    from falsify.cli import main

    assert main(["bench", "train", "--steps", "0"]) == 2
    assert "--steps must be >= 1" in capsys.readouterr().err
