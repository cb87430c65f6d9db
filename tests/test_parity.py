"""`falsify parity` and the model-parity-v1 machinery (falsify/llm/parity*.py): the instrumented
forwards record the model's own values, the bounds hold on correct kernels, the bisection names
the kernel a mutant broke, and the CLI's outputs and exit codes (0 pass, 1 fail, 2 bad input).
Small configs throughout: the whole file runs in well under a minute on 2 cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from falsify.llm import parity as P
from falsify.llm import parity_bisect as B
from falsify.mutants import model_parity as M

SMALL = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
             intermediate_size=160, max_seq_len=32, init_std=0.2)
SMALL_ARGS = [f"{k}={v}" for k, v in SMALL.items()]


def _setup(seed: int = 0) -> P.Setup:
    cfg = P.config_from("tiny", SMALL)
    return P.Setup(cfg, P.random_weights(cfg, seed), P.random_tokens(cfg, 16, seed))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "falsify", "parity", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=dict(os.environ))


def test_instrumentation_records_the_models_own_values():
    """Hooks change nothing (logits bit-identical to a plain forward); the reference's points
    are the values its forward computed (its logits, and the last block normed is xf)."""
    from falsify.reference import model as R

    s = _setup()
    m = P.torch_model(s.cfg, s.weights, P.ops_for("torch"))
    with torch.no_grad():
        plain = m(s.ids).double().numpy()
    pts = P.capture_torch(m, s.ids)
    assert np.array_equal(pts["logits"], plain)
    assert set(pts) == {"embedding", "final_norm", "logits",
                        *(f"L{n}.{op}" for n in range(2) for op in P.OPS)}
    params, rcfg = P.ref_params(s.weights), P.ref_config(s.cfg)
    ref = P.capture_reference(params, s.ids.numpy(), rcfg)
    logits, cache = R.forward(params, s.ids.numpy(), rcfg)
    assert np.array_equal(ref["logits"], logits)
    xf, _ = R.rmsnorm_fwd(ref["L1.block"], params["norm.weight"], s.cfg.rms_norm_eps)
    assert np.array_equal(xf, cache["xf"])


@pytest.mark.parametrize("seed", [0, 3])
def test_correct_kernels_meet_the_contract_bounds(seed):
    s = _setup(seed)
    beta = P.layer_budget(s.cfg, 16)
    rho = beta * ((4 ** 2 - 1) / 3 + 1)
    r = P.forward_parity(s, {"torch": P.ops_for("torch")})["torch"]
    assert max(r["growth"]) <= 4 and 1 - r["logits"]["cosine"] <= 0.5 * rho ** 2
    assert r["logits"]["top1"] == 1.0 and r["points"]["embedding"]["rel"] == 0.0
    g = P.grad_parity(s, P.ops_for("torch"), seed)
    assert 1 - g["grad_cos_min"] <= 0.5 * (3 * rho) ** 2
    assert B.bisect(s, P.ops_for("torch"), "torch")["first"] is None


@pytest.mark.parametrize("kernel, mutant, obligation", [
    ("rmsnorm", M.rmsnorm_eps_10x, "RN-EQV-001"),
    ("rope", M.rope_theta_off, "ROPE-EQV-001"),
    ("attention", M.attention_scale_fp16, None),
    ("linear", M.linear_fp16_accumulate_one_layer, None),
])
def test_bisect_names_the_mutated_kernel(kernel, mutant, obligation):
    """The first point over budget is in layer 0, the culprit is the mutated kernel, and the
    verdict names the broken obligation, or says no kernel-level obligation covers it."""
    r = B.bisect(_setup(), P.ops_for("torch", {kernel: mutant}), "torch")
    assert r["first"]["point"].startswith("L0.")
    assert r["culprit"]["kernel"] == kernel
    if obligation:
        assert r["culprit"]["broken"] and r["culprit"]["obligation"] == obligation
        assert obligation in r["message"]
    else:
        assert "no kernel-level obligation covers it" in r["message"]


def test_cli_json_plot_and_pass(tmp_path):
    png = tmp_path / "p.png"
    r = _cli("--format", "json", "--backend", "reference,torch,triton", "--tokens", "16",
             "--plot", str(png), "--grad", *SMALL_ARGS, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["backends"]) == {"torch", "triton"}
    for b in out["backends"].values():
        assert b["passed"] and len(b["growth"]) == 2 and b["logits"]["top1"] == 1.0
        assert {"cosine", "max_rel", "mean_rel"} <= set(b["points"]["L1.attn"])
        assert b["grad"]["grad_cos_min"] > 0.999999
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bisect_on_a_mutant_exits_1_and_names_the_obligation(tmp_path):
    r = _cli("--format", "json", "--backend", "torch", "--tokens", "16", "--bisect",
             "--bind", "rmsnorm.torch=falsify.mutants.model_parity:rmsnorm_eps_10x", *SMALL_ARGS,
             cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    rep = json.loads(r.stdout)["bisect"]["torch"]
    assert rep["first"]["point"] == "L0.attn_norm"
    assert "RN-EQV-001" in rep["message"] and "rmsnorm-kernel-v1" in rep["message"]
    r = _cli("--backend", "torch", "--tokens", "16", "--bisect", "--bind",
             "attention.torch=falsify.mutants.model_parity:attention_scale_fp16", *SMALL_ARGS,
             cwd=tmp_path)
    assert r.returncode == 1
    assert "no kernel-level obligation covers it" in " ".join(r.stdout.split())


def test_cli_checkpoint_and_bad_input(tmp_path, capsys):
    """A checkpoint runs end to end (subprocess); bad input is one `error:` line naming the
    argument or file and exit 2, never a traceback (in-process: the same dispatch)."""
    from safetensors.torch import save_file

    from falsify.cli import main

    s = _setup()
    ck = tmp_path / "step-1"
    ck.mkdir()
    save_file(s.weights, str(ck / "model.safetensors"))
    (ck / "state.json").write_text(json.dumps({"config": {"model": s.cfg.to_dict()}}))
    r = _cli("--checkpoint", str(ck), "--backend", "torch", "--tokens", "8", "--format",
             "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["config"]["hidden_size"] == 64
    bad_cfg = dict(s.cfg.to_dict(), hidden_size=32, num_heads=1)
    (ck / "state.json").write_text(json.dumps({"config": {"model": bad_cfg}}))
    cases = [(["--checkpoint", str(ck)], "does not match"),
             (["--checkpoint", str(tmp_path / "nope")], "state.json not found"),
             (["--backend", "torch,cuda"], "cuda"),
             (["--model", "huge"], "huge"),
             (["num_layers=two"], "'two'"),
             (["no_such_field=1"], "no_such_field"),
             (["--tokens", "999"], "--tokens 999"),
             (["--bind", "rope.torch=no.such:thing"], "--bind"),
             (["--plot", "out.jpg"], "--plot"),
             (["--train", "--backend", "torch"], "exactly two backends")]
    for args, needle in cases:
        capsys.readouterr()
        assert main(["parity", *args]) == 2, args
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and needle in err[0], (args, err)


def test_cli_train_reports_where_two_backends_separate(tmp_path):
    """The CLI trains torch and Triton side by side (1 layer, 2 steps: the interpreter is
    slow) without separating; in-process, a run whose RMSNorm uses ε × 10 separates from the
    correct one at the first step."""
    from falsify.llm import parity_train as T

    args = [*SMALL_ARGS, "num_layers=1"]
    r = _cli("--train", "--steps", "2", "--tokens", "8", "--format", "json", "--backend",
             "torch,triton", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["separated_at"] is None and len(out["steps"]) == 2
    s = _setup()
    good = T.train_compare(s, P.ops_for("torch"), P.ops_for("torch"), 3, 0)
    assert good["separated_at"] is None
    bad = T.train_compare(s, P.ops_for("torch"), P.ops_for("torch", {"rmsnorm":
                                                                     M.rmsnorm_eps_10x}), 3, 0)
    assert bad["separated_at"] == 1
