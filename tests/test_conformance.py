"""`falsify conformance`: third-party functions judged by the shipped contracts.

- math and policy are judged apart: torch.softmax's math passes; its policy (it accepts
  float64, returns an empty row for n = 0) fails against the contract's own rules, passes
  against the binding's declaration, and fails again when the declaration is false;
- a library's math bug is a math failure, unclassified until a Finding says what it is;
- the cells, the diff against a committed ledger, and the docs page, on recorded data;
- a binding that follows a named variant of an equation (F.cross_entropy: no z-loss) runs at
  the variant's pins, on the contract's own examples otherwise, and its cells say so;
- the small subset CI runs (torch, and transformers' LlamaRMSNorm), from a project made by
  `falsify init` in a fresh directory: clean on math, every failure classified.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from falsify.conformance.registry import Binding, Finding, Library, RegistryError
from falsify.harness import conformance as matrix

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = "falsify.conformance.lib_torch:softmax"


def _run(items):
    from falsify.cli.conformance import conform
    from falsify.cli.session import select_contracts
    from falsify.harness.project import find_project

    proj = find_project(ROOT)
    contracts = {c.id: c for c in select_contracts(sorted({b.contract for _, b in items}), proj)}
    return conform(items, contracts, proj, "ci", 1, Console(file=open(os.devnull, "w")))


def _by_check(rec):
    return {(r["check"], r["variant"]): r for r in rec["results"]}


@pytest.mark.heavy
def test_math_apart_from_policy_judged_as_declared():
    lib = Library("t", "torch", (
        Binding("as-contract", "softmax-kernel-v1", {"softmax": SOFTMAX}),
        Binding("declared", "softmax-kernel-v1", {"softmax": SOFTMAX},
                dtypes=("float64", "bfloat16"), zero_size={"n": "empty"},
                errors=("NotImplementedError",)),
        Binding("false-declaration", "softmax-kernel-v1", {"softmax": SOFTMAX},
                dtypes=("float64", "bfloat16", "int64"), zero_size={"n": "error"}),
        Binding("buggy", "softmax-kernel-v1",
                {"softmax": "tests.fixtures.buggy:softmax_no_max_subtraction"}),
    ))
    plain, declared, false, buggy = _run([(lib, b) for b in lib.bindings])
    dtypes = matrix.math_dtypes([plain])
    assert dtypes == ["float32", "float16"]

    # the contract's own rules: torch.softmax accepts float64 and empties an n = 0 row
    c = matrix.cells(plain, dtypes)
    assert c["math float32"].startswith("pass") and c["math float16"].startswith("pass"), c
    assert c["policy"].startswith("UNCLASSIFIED"), c
    bad = {r["check"] for r in matrix.failures(plain)}
    assert bad == {"FALSIFY-SM-012", "FALSIFY-SM-014"}, matrix.failures(plain)
    assert all(r["judges"] == "policy" for r in matrix.failures(plain))

    # what the binding declares: both hold
    assert matrix.cells(declared, dtypes)["policy"].startswith("pass"), \
        matrix.failures(declared)

    # a declaration that is false fails, naming it
    msgs = {r["check"]: r["message"] for r in matrix.failures(false)}
    assert set(msgs) == {"FALSIFY-SM-012", "FALSIFY-SM-014"}, msgs
    assert "int64 is declared accepted" in msgs["FALSIFY-SM-012"]
    assert "n = 0 (rule: error)" in msgs["FALSIFY-SM-014"]

    # a math bug is a math failure, with the example that shows it
    wrong = [r for r in matrix.failures(buggy) if r["judges"] == "math"]
    assert wrong and all(r.get("finding") is None for r in wrong)
    assert matrix.cells(buggy, dtypes)["math float32"].startswith("UNCLASSIFIED")
    assert any("Case(" in (r.get("example") or "") for r in wrong)


# ---------------------------------------------------------------- recorded data
def _rec(results, findings=None, **kw):
    return dict(library="lib", binding="fn", contract="softmax-kernel-v1", version="1.0",
                results=results, profile="ci", seconds=1.0, **kw)


def _r(check, variant, outcome, judges="math", finding=None):
    return dict(check=check, variant=variant, outcome=outcome, judges=judges, obligation="O-1",
                message=f"{check} failed" if outcome == "failed" else None, finding=finding)


DEV = dict(kind="deviation", variant=None, evidence="rounds twice")
VAR = dict(kind="variant", variant="eps outside sqrt", evidence="documented")


def test_cells_say_what_failed_and_how_it_is_classified():
    assert matrix.cell([_r("A", "float32", "passed")]) == "pass"
    assert matrix.cell([_r("A", "float32", "failed")]) == "UNCLASSIFIED"
    assert matrix.cell([_r("A", "float32", "failed", finding=DEV)]) == "deviates"
    assert matrix.cell([_r("A", "float32", "failed", finding=VAR)]) == "variant eps outside sqrt"
    assert matrix.cell([_r("A", "f", "failed", finding=VAR),
                        _r("B", "f", "failed", finding=DEV)]) == "deviates"
    assert matrix.cell([_r("A", "float32", "not-run")]) == "not run"
    assert matrix.cell([]) == "n/a"
    assert matrix.cell([_r("A", "float32", "passed")], needs_gpu="CUDA only") == "needs GPU"
    rec = _rec([_r("A", "float32", "passed"), _r("A", "float16", "failed", finding=DEV),
                _r("D", "undeclared", "passed", judges="policy")])
    assert matrix.cells(rec, ["float32", "float16"]) == {
        "math float32": "pass 1/1", "math float16": "deviates 0/1", "policy": "pass 1/1"}


def test_a_changed_cell_is_reported_against_the_committed_ledger():
    old = {"format": 1, "bindings": {"lib/fn": _rec([_r("A", "float32", "passed")])}}
    same = _rec([_r("A", "float32", "passed")])
    worse = _rec([_r("A", "float32", "failed", finding=DEV)], )
    worse["version"] = "2.0"
    assert matrix.changed_cells(old, [same]) == []
    assert matrix.changed_cells(old, [worse]) == [
        "lib/fn [math float32]: pass 1/1 -> deviates 0/1 (1.0 -> 2.0)"]
    new = dict(same, binding="other")
    assert matrix.changed_cells(old, [new]) == ["lib/other: new binding"]


def test_the_ledger_is_written_atomically_and_a_bad_one_is_named(tmp_path):
    path = tmp_path / "c.json"
    data = matrix.save(path, [_rec([_r("A", "float32", "passed")])])
    assert json.loads(path.read_text()) == data and list(data["bindings"]) == ["lib/fn"]
    path.write_text("{}")
    with pytest.raises(matrix.ConformanceLedgerError, match=str(path)):
        matrix.load(path)


def test_the_page_links_cells_to_their_section_and_contracts_to_their_page():
    rec = _rec([_r("A", "float32", "failed", finding=DEV)], contract_version="1.0.0",
               policy={"dtypes": ["float64"], "zero_size": {}}, not_claimed={"B": "no promise"})
    text = "\n".join(matrix.page({"format": 1, "bindings": {"lib/fn": rec}}, "e.json",
                                 {"softmax-kernel-v1"}))
    assert "[softmax-kernel-v1](softmax-kernel-v1.md)" in text
    assert "[deviates 0/1](#lib-fn)" in text and "## lib fn {#lib-fn}" in text
    assert "falsify conformance lib --binding 'lib/fn'" in text
    assert "accepts float64" in text and "`B` not claimed: no promise" in text
    assert "Evidence: rounds twice" in text


def test_a_finding_must_carry_evidence_and_a_variant_its_name():
    with pytest.raises(RegistryError, match="evidence"):
        Finding("deviation", " ")
    with pytest.raises(RegistryError, match="names the convention"):
        Finding("variant", "documented")
    with pytest.raises(RegistryError, match="kind"):
        Finding("bug", "x")


def test_a_binding_that_follows_a_variant_runs_at_its_pins_on_the_contracts_own_examples():
    import dataclasses

    import numpy as np

    from falsify.conformance import plan, registry
    from falsify.harness import handover, runtime
    from falsify.harness.model import load_contract

    c = load_contract(ROOT / "falsify" / "contracts" / "cross-entropy-kernel-v1.yaml")[0]
    b = registry.library("torch").binding("F.cross_entropy")
    binds, policy = plan.session_binds(c, b)
    assert set(policy) == {f"{c.id}:cross_entropy.torch", f"{c.id}:cross_entropy_grad.torch"}
    assert all(p["pins"] == {"z_loss": 0.0} for p in policy.values())
    assert f"{c.id}:cross_entropy.reference" not in binds  # pins only: our reference judges

    before = runtime.examples(c, "FALSIFY-CE-001", "float32")
    assert 1.0e-4 in {e.args["z_loss"] for e in before}  # what torch has no term for
    handover.activate(handover.Manifest(project_root=str(ROOT), policy=policy))
    try:
        after = runtime.examples(c, "FALSIFY-CE-001", "float32")
    finally:
        handover.activate(None)
    assert {e.args["z_loss"] for e in after} == {0.0}
    for x, y in zip(before, after):  # the same examples otherwise: the pin replaces one draw
        assert (x.args["logits"] == y.args["logits"]).all() and x.dims == y.dims
        assert x.args["label_smoothing"] == y.args["label_smoothing"]

    # a variant with its own references (GemmaRMSNorm's 1 + w) binds each in place of its
    # equation's, the backward's too: the gradient checks judge the variant's derivative
    rn = load_contract(ROOT / "falsify" / "contracts" / "rmsnorm-kernel-v1.yaml")[0]
    binds, policy = plan.session_binds(rn, registry.library("transformers").binding(
        "GemmaRMSNorm"))
    assert binds[f"{rn.id}:rmsnorm.reference"].endswith(":rmsnorm_one_plus_w")
    assert binds[f"{rn.id}:rmsnorm_backward.reference"].endswith(":rmsnorm_one_plus_w_backward")
    assert "pins" not in policy[f"{rn.id}:rmsnorm.torch"]
    from falsify.reference import rmsnorm as ref
    x, w = np.array([[3.0, -4.0]]), np.array([0.5, -0.25])
    assert np.allclose(ref.rmsnorm_one_plus_w(x, w, 0.0), ref.rmsnorm(x, 1 + w, 0.0))
    with pytest.raises(ValueError, match="'nope' is not declared.*cross_entropy: no-z-loss"):
        plan.session_binds(c, dataclasses.replace(b, variant="nope"))

    # a variant narrower than an input (a mean-only loss; an input fixing reduction 'none'):
    # that input's checks are not applicable to it, and say why; the others are judged
    fcl = registry.library("transformers").binding("ForCausalLMLoss")
    out = plan.outside_variant(c, fcl)
    assert "FALSIFY-CE-001" in out and "reduction to 'none'" in out["FALSIFY-CE-001"], out
    assert "FALSIFY-CE-009" not in out  # rows_mean: reduction mean, ε drawn -> pinned to 0
    judged = plan.judged_binding(c, fcl)
    assert set(out) <= set(judged.not_claimed) and {p.check.id for p in plan.planned(
        c, judged)}.isdisjoint(out)

    passed = _rec([_r("A", "float32", "passed")], variant="no-z-loss")
    assert matrix.cells(passed, ["float32"])["math float32"] == "variant no-z-loss 1/1"


def test_bindings_of_one_contract_never_share_a_session():
    """Not even with disjoint equations: gguf's quantize binding and its dequantize binding in
    one session would make a round-trip check of one call the other library function where
    the contract's own was meant (seen with bitsandbytes' NF4 pair under a fresh seed)."""
    from falsify.conformance import plan, registry

    gguf, torch_lib = registry.library("gguf"), registry.library("torch")
    items = [(gguf, b) for b in gguf.bindings] + [(torch_lib,
                                                   torch_lib.binding("torch.softmax"))]
    got = [[b.name for _, b in s] for s in plan.rounds(items)]
    assert got == [["quants.dequantize(Q8_0)", "torch.softmax"], ["quants.dequantize(Q4_K)"],
                   ["quants.dequantize(Q6_K)"], ["quants.quantize(Q8_0)"]], got


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "falsify.cli", "conformance", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=1800,
                          env=dict(os.environ, FALSIFY_QUIET="1"))


def test_unknown_libraries_and_bindings_are_usage_errors():
    p = _cli("nosuchlib")
    assert p.returncode == 2 and "binding sets: torch" in p.stderr, p.stderr
    p = _cli("torch", "--binding", "torch/nope")
    assert p.returncode == 2 and "torch/nope: no such binding" in p.stderr, p.stderr


# The subset `.ci/run` runs: torch's softmax and RMSNorm (each clean on math), its
# cross-entropy (classified: no z-loss term, fp16 label smoothing), and one other library,
# from a project `falsify init` made in a fresh directory: every failure classified, none
# blaming our contracts, every planned check run (exit 0).
SUBSET = ["torch/torch.softmax", "torch/F.rms_norm", "torch/F.cross_entropy",
          "transformers/LlamaRMSNorm"]


@pytest.mark.heavy
def test_the_ci_subset_is_classified_and_clean_on_math_from_a_fresh_project(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    init = subprocess.run([sys.executable, "-m", "falsify.cli", "init"], cwd=proj,
                          capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    out = tmp_path / "conformance.json"
    args = ["torch", "transformers", "--ledger", str(out)]
    for b in SUBSET:
        args += ["--binding", b]
    p = _cli(*args, cwd=proj)
    got = matrix.load(out)["bindings"]
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert sorted(got) == sorted(SUBSET)
    for key in SUBSET[:2]:
        c = matrix.cells(got[key], matrix.math_dtypes([got[key]]))
        assert all(v.startswith("pass") for k, v in c.items() if k.startswith("math")), (key, c)
    # F.cross_entropy has no z-loss: at the contract's `no-z-loss` variant its float32 math is
    # clean; in float16 label smoothing rounds in float16 (deviations), and the arbiter puts
    # the error on torch's side, not on the float64 reference
    ce = got["torch/F.cross_entropy"]
    assert matrix.cells(ce, ["float32"])["math float32"].startswith("variant no-z-loss"), ce
    assert matrix.failures(ce) and all(
        r["variant"] == "float16" and r["finding"]["kind"] == "deviation"
        for r in matrix.failures(ce))
    judged = [r["arbiter"] for r in matrix.failures(ce) if (r.get("arbiter") or {}).get(
        "impl_ulps") is not None]
    assert judged and all(a["impl_ulps"] > 1 > a["ref_ulps"] for a in judged), judged
