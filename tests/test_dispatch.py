"""Parity-gated dispatch (falsify/llm/dispatch.py): each kernel's backend comes from the ledger.

The ledgers here are written entry by entry, with the contract hashes and implementation
fingerprints the harness computes, so that each test states exactly which evidence exists."""

import json

import pytest
import torch

from falsify.harness.coverage import current
from falsify.harness.fingerprint import impl_hash
from falsify.harness.kinds.device import NO_GPU
from falsify.harness.ledger import merge
from falsify.harness.model import load_contract
from falsify.harness.plan import runs
from falsify.harness.project import library_files
from falsify.llm import dispatch as D
from falsify.llm import ops as ops_mod
from falsify.llm import run as RUN
from falsify.llm.config import ConfigError, model_config

KERNELS = [k for k in ops_mod.ALL_KERNELS]


@pytest.fixture
def fresh_ops(monkeypatch):
    monkeypatch.setattr(ops_mod, "_CACHE", {})


def _contracts() -> dict:
    """kernel -> contract for the model's kernels, plus the parity gate."""
    out = {}
    for cid, path in library_files().items():
        c, _ = load_contract(path)
        if c.kernel in KERNELS or cid == D.PARITY_CONTRACT:
            out[c.kernel] = c
    return out


CONTRACTS = _contracts()


def write_ledger(path, backends=("torch", "triton"), outcome=None, gpu=None):
    """A ledger in which every run of the model's kernel contracts and of the parity gate on
    `backends` passed (a `device` check: skipped for want of a GPU when `gpu` is None), with
    `outcome(contract, check, backend, variant)` overriding an entry's outcome ("stale" writes
    an old implementation fingerprint, None leaves the entry out)."""
    entries = []
    for c in CONTRACTS.values():
        for t in c.checks:
            for r in runs(c, t):
                if r.backend not in backends:
                    continue
                o = "skipped" if t.kind == "device" and gpu is None else "passed"
                if outcome is not None:
                    o = outcome(c.id, t.id, r.backend, r.variant) or o
                if o == "missing":
                    continue
                e = dict(contract=c.id, check=t.id, backend=r.backend, variant=r.variant,
                         outcome=o, sha256=c.sha256, impl_sha=impl_hash(c, r.backend, t),
                         gpu=gpu, message=f"{NO_GPU}: no CUDA device" if o == "skipped" else None)
                if o == "stale":
                    e.update(outcome="passed", impl_sha="0" * 64)
                entries.append(e)
    merge(entries, [], path)
    return path


def ctx(ledger, baseline=None, dtype="float32", gpu=None):
    return D.Context(ledger=ledger, baseline=baseline, dtype=dtype, gpu=gpu)


CPU_ONLY = {"torch": None, "triton": "no GPU"}
BOTH = {"torch": None, "triton": None}


def test_the_synthetic_ledger_is_current_for_the_harness(tmp_path):
    """The fixture's entries are what coverage calls current: the tests below test the
    dispatcher's rules, not a ledger the harness would reject."""
    p = write_ledger(tmp_path / "l.json")
    data = json.loads(p.read_text())
    c = CONTRACTS["rmsnorm"]
    for e in data["runs"].values():
        if e["contract"] == c.id:
            assert current(c, e, c.check(e["check"]))


DEVICE_KERNELS = [k for k in KERNELS if k not in ops_mod.HOST_KERNELS]


def test_every_kernel_verified_on_the_cpu_goes_to_torch(tmp_path):
    p = write_ledger(tmp_path / "l.json")
    out = D.resolve(D.FASTEST, DEVICE_KERNELS, CPU_ONLY, ctx(p))
    out.update(D.resolve(D.FASTEST, ["lr_schedule"], CPU_ONLY, ctx(p, dtype="float64")))
    assert {c.backend for c in out.values()} == {"torch"}
    assert "rmsnorm-kernel-v1 and model-parity-v1 passed on torch/float32" in out["rmsnorm"].reason
    assert "does not cover adamw" in out["adamw"].reason
    assert "triton cannot run here" in out["rmsnorm"].reason


@pytest.mark.parametrize("spoil", ["failed", "stale", "missing"])
def test_an_unverified_kernel_is_refused_with_the_check_that_is_missing(tmp_path, spoil):
    p = write_ledger(tmp_path / "l.json", outcome=lambda c, t, b, v: spoil
                     if (c, b, v) == ("rope-kernel-v1", "torch", "float32") else None)
    with pytest.raises(D.DispatchError, match=r"rope: no backend is verified for float32 on "
                       r"cpu — torch: rope-kernel-v1 FALSIFY-ROPE-\d+ on torch/float32: "
                       + {"failed": "failed", "stale": "stale", "missing": "no result"}[spoil]
                       + r".*; triton cannot run here"):
        D.resolve(D.FASTEST, DEVICE_KERNELS, CPU_ONLY, ctx(p))
    # the other kernels are unaffected
    assert D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY, ctx(p))["rmsnorm"].backend == "torch"


def test_a_failed_parity_gate_unverifies_the_kernels_it_binds_only(tmp_path):
    p = write_ledger(tmp_path / "l.json", outcome=lambda c, t, b, v: "failed"
                     if (c, b) == ("model-parity-v1", "torch") else None)
    with pytest.raises(D.DispatchError, match="the model parity gate did not"):
        D.resolve(D.FASTEST, ["attention"], CPU_ONLY, ctx(p))
    # the fused LM-head loss and the training step are outside the gate's contract
    out = D.resolve(D.FASTEST, ["fused_linear_cross_entropy", "adamw", "grad_clip"],
                    CPU_ONLY, ctx(p))
    assert {c.backend for c in out.values()} == {"torch"}


def test_fastest_verified_ranks_by_the_bench_baseline(tmp_path):
    p = write_ledger(tmp_path / "l.json")
    base = tmp_path / "bench.json"
    rows = [dict(kernel="rmsnorm", size="normal", shape="4096x4096", **{"pass": "fwd+bwd"},
                 ours_ms=2.0, triton_ms=0.5, base_ms=3.0, time_ratio=0.66),
            dict(kernel="rmsnorm", size="large", shape="x", **{"pass": "fwd+bwd"},
                 ours_ms=0.1, triton_ms=9.0, base_ms=3.0, time_ratio=0.66),
            dict(kernel="rope", size="normal", shape="s", **{"pass": "fwd+bwd"},
                 ours_ms=1, triton_ms=2, base_ms=3.0, time_ratio=0.1)]  # JSON ints count
    base.write_text(json.dumps({"format": "falsify-bench-kernels-baseline-v1",
                                "machine": {}, "quick": False, "rows": rows}))
    out = D.resolve(D.FASTEST, ["rmsnorm", "rope"], BOTH, ctx(p, base))
    assert out["rmsnorm"].backend == "triton" and "0.5 ms (4096x4096 fwd+bwd" in \
        out["rmsnorm"].reason
    assert out["rope"].backend == "torch"
    # several verified and no timing: refused, never guessed
    with pytest.raises(D.DispatchError, match="torch, triton are all verified and no "
                       "bench_baseline is set"):
        D.resolve(D.FASTEST, ["swiglu"], BOTH, ctx(p))
    with pytest.raises(D.DispatchError, match="has no row timing them"):
        D.resolve(D.FASTEST, ["swiglu"], BOTH, ctx(p, base))
    # a baseline measured on another device is refused
    with pytest.raises(D.DispatchError, match="measured without a GPU; this run is on H100"):
        D.resolve(D.FASTEST, ["rmsnorm"], BOTH, ctx(p, base, gpu="H100"))


def test_prefer_takes_the_backend_where_verified_and_says_why_not_elsewhere(tmp_path):
    p = write_ledger(tmp_path / "l.json", outcome=lambda c, t, b, v: "failed"
                     if (c, b) == ("swiglu-kernel-v1", "triton") else None)
    out = D.resolve("prefer:triton", ["rmsnorm", "swiglu"], BOTH, ctx(p))
    assert out["rmsnorm"].backend == "triton"
    assert out["rmsnorm"].reason.startswith("preferred and verified")
    assert out["swiglu"].backend == "torch"
    assert out["swiglu"].reason.startswith("triton not verified (triton: swiglu-kernel-v1 ")
    with pytest.raises(D.DispatchError, match="prefer:<backend> names one of torch, triton"):
        D.resolve("prefer:cuda", ["rmsnorm"], BOTH, ctx(p))


def test_reference_takes_torch_and_records_its_status(tmp_path):
    p = write_ledger(tmp_path / "l.json", backends=("triton",))
    out = D.resolve(D.REFERENCE, ["rmsnorm"], CPU_ONLY, ctx(p))
    assert out["rmsnorm"].backend == "torch"
    assert "NOT verified: rmsnorm-kernel-v1 FALSIFY-RN-" in out["rmsnorm"].reason
    out = D.resolve(D.REFERENCE, ["rmsnorm"], CPU_ONLY, ctx(None))
    assert out["rmsnorm"].reason == "policy reference (no ledger to report its status)"
    out = D.resolve(D.REFERENCE, ["rmsnorm"], CPU_ONLY, ctx(tmp_path / "none.json"))
    assert out["rmsnorm"].backend == "torch" and "does not exist" in out["rmsnorm"].reason


def test_on_a_gpu_the_device_checks_must_have_passed_on_that_gpu(tmp_path):
    p = write_ledger(tmp_path / "l.json", gpu=None)  # device checks skipped: CPU evidence only
    with pytest.raises(D.DispatchError, match=r"on torch/float32: skipped on a machine without "
                       r"a GPU, not on NVIDIA H100"):
        D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY, ctx(p, gpu="NVIDIA H100"))
    q = write_ledger(tmp_path / "g.json", gpu="NVIDIA H100")
    assert D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY,
                     ctx(q, gpu="NVIDIA H100"))["rmsnorm"].backend == "torch"
    with pytest.raises(D.DispatchError, match="passed on NVIDIA H100, not on NVIDIA H200"):
        D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY, ctx(q, gpu="NVIDIA H200"))


def test_bf16_is_verified_only_where_a_check_ran_at_bf16(tmp_path):
    p = write_ledger(tmp_path / "l.json")
    with pytest.raises(D.DispatchError, match="rmsnorm-kernel-v1 has no check on torch at "
                       "bfloat16"):
        D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY, ctx(p, dtype="bfloat16"))


def test_no_ledger_is_an_error_that_says_how_to_make_one(tmp_path):
    with pytest.raises(D.DispatchError, match="does not exist: run `falsify run`"):
        D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY, ctx(tmp_path / "none.json"))
    with pytest.raises(D.DispatchError, match="no falsify project was found"):
        D.resolve(D.FASTEST, ["rmsnorm"], CPU_ONLY, ctx(None))


# ------------------------------------------------------------------ the run records it
def test_a_run_under_a_policy_records_each_kernels_backend_and_reason(tmp_path, fresh_ops):
    p = write_ledger(tmp_path / "l.json")
    r = RUN.train(RUN.tiny_config(tmp_path / "run", max_steps=2, warmup_steps=0,
                                  save_interval=2, backend="fastest-verified", ledger=str(p)))
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["backend"] == "fastest-verified"
    rec = cfg["dispatch"]
    assert rec["ledger"] == str(p) and rec["dtype"] == "float32" and rec["device"] == "cpu"
    assert set(rec["kernels"]) == set(KERNELS)
    for k, v in rec["kernels"].items():
        assert v["backend"] == "torch" and cfg["kernels"][k].startswith("falsify.kernels.torch.")
    from falsify.llm import checkpoint as C

    (ck,) = C.list_checkpoints(tmp_path / "run")
    assert C.read_state(ck)["config"]["dispatch"] == rec
    assert r.final_step == 2


def test_a_run_with_an_unverified_kernel_stops_before_any_work(tmp_path, fresh_ops):
    p = write_ledger(tmp_path / "l.json", outcome=lambda c, t, b, v: "failed"
                     if c == "attention-kernel-v1" else None)
    with pytest.raises(ConfigError, match=r"config field backend='fastest-verified': attention: "
                       "no backend is verified"):
        RUN.train(RUN.tiny_config(tmp_path / "run", max_steps=2, backend="fastest-verified",
                                  ledger=str(p)))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("over, msg", [
    (dict(backend="torch", ledger="x.json"), "config field ledger='x.json': only a dispatch "
     "policy reads it; backend='torch' does not"),
    (dict(backend="fastest"), "config field backend='fastest': must be torch, triton, auto"),
])
def test_policy_fields_are_checked(tmp_path, over, msg):
    with pytest.raises(ConfigError, match=msg):
        RUN.tiny_config(tmp_path, **over).validate()


def test_the_optimizer_runs_the_dispatched_adamw(tmp_path, fresh_ops):
    from falsify.llm import trainer as TR
    from falsify.llm.model import build_model

    p = write_ledger(tmp_path / "l.json")
    D.configure("fastest-verified", ctx(p))
    cfg = RUN.tiny_config(tmp_path)
    model = build_model(model_config(cfg), "fastest-verified", seed=0)
    assert model.ops.backend == "fastest-verified" and model.ops.backend_of("adamw") == "torch"
    tr = TR.Trainer(model, cfg, torch.device("cpu"))
    assert tr.optimizer.update_fn() is model.ops.adamw


def test_an_unresolved_policy_is_an_error_and_the_model_does_not_depend_on_the_dispatcher(
        fresh_ops):
    """Which kernels are verified depends on a run's ledger, dtype and device, so get_ops does
    not resolve a policy on its own. And the model's modules do not import the dispatcher: the
    fingerprint of what the kernel contracts and the parity gate ran leaves it out, so an edit
    to the dispatcher does not make their results stale."""
    from falsify.harness.fingerprint import sources

    with pytest.raises(ops_mod.BackendUnavailableError, match="no run has resolved"):
        ops_mod.get_ops("fastest-verified")
    deps = sources({"falsify.llm.model", "falsify.probes.model_parity"})
    assert "falsify.llm.ops" in deps and "falsify.llm.dispatch" not in deps
    model = sources({"falsify.llm.model"})
    assert not [m for m in model if m.startswith("falsify.harness")]
