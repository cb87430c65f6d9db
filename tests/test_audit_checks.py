"""`pv audit --checks-only`: an equation with a backward needs a gradient check on every
backend it binds (forward checked, backward not is a gap, exit 1), and an export of a bound
implementation module (its `__all__`, or without one every public function) that the contract
leaves unchecked is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from falsify.cli.pv import main
from falsify.harness import audit
from falsify.harness.model import load_contract

ROOT = Path(__file__).resolve().parents[1]  # this checkout

FNS = "tests.fixtures.kernels.torch.audit_fns"
PARITY = """
  - id: FALSIFY-SQ-001
    rule: parity
    prediction: "x² matches the reference"
    obligation: SQ-EQV-001
    check:
      kind: parity
      input: xs
      equation: {eq}
      tolerance: {{why: "one rounding", float32: {{rtol: "eps"}}}}
"""
GRADIENT = """
  - id: FALSIFY-SQ-002
    rule: gradient
    prediction: "autograd gives 2x·dy"
    obligation: SQ-EQV-001
    check:
      kind: gradient
      input: xs
      equation: {eq}
      wrt: [x]
      backward: square_backward
      tolerance: {{why: "two roundings", float32: {{rtol: "2 * eps"}}}}
"""


def contract_text(torch_binding: str, checks: str, eq: str = "square") -> str:
    return f"""metadata:
  version: 1.0.0
  description: "audit fixture"
  references: ["none needed"]
  kernel: audit_fns
  status: draft
equations:
  {eq}:
    formula: "x²"
    bindings:
      reference: {FNS}:square_ref
      torch: {FNS}:{torch_binding}
  square_backward:
    formula: "2x·dy"
    bindings:
      reference: {FNS}:square_backward
inputs:
  xs:
    dtypes: [float32]
    dims: {{n: [1, 8]}}
    args:
      x: {{shape: [n], values: [-2.0, 2.0]}}
proof_obligations:
  - {{id: SQ-EQV-001, type: equivalence, property: "x² and its derivative", applies_to: {eq}}}
falsification_tests:{checks.format(eq=eq)}
mutants:
  - {{id: MUT-SQ-001, obligation: SQ-EQV-001, replaces: {eq}.torch, with: {FNS}:helper,
     description: "identity"}}
"""


def load(tmp_path, text):
    p = tmp_path / "square-kernel-v1.yaml"
    p.write_text(text, encoding="utf-8")
    c, findings = load_contract(p)
    assert not [f for f in findings if f.severity == "error"], findings
    return p, c


def test_forward_checked_backward_not_is_a_gap(tmp_path):
    # "cube" has no <eq>_backward equation, so the backward is found through the binding's
    # autograd.Function, not declared by name
    _, c = load(tmp_path, contract_text("square", PARITY, eq="cube"))
    gaps = audit.check_gaps(c)
    assert len(gaps) == 2, gaps  # reference and torch
    assert all("forward checked, backward not" in g for g in gaps), gaps
    assert any("equation cube on torch" in g and "_Square" in g for g in gaps), gaps


def test_gradient_check_on_every_bound_backend_closes_the_gap(tmp_path):
    _, c = load(tmp_path, contract_text("square", PARITY + GRADIENT))
    assert audit.check_gaps(c) == []


def test_a_gradient_check_missing_one_backend_is_a_gap(tmp_path):
    one = GRADIENT.replace("      wrt: [x]", "      backends: [reference]\n      wrt: [x]")
    _, c = load(tmp_path, contract_text("square", PARITY + one))
    gaps = audit.check_gaps(c)
    assert gaps == [g for g in gaps if "on torch" in g] and len(gaps) == 1, gaps
    assert "checks there: parity" in gaps[0]


def test_no_grad_binding_has_no_backward(tmp_path):
    _, c = load(tmp_path, contract_text("square_nograd", PARITY, eq="cube"))
    assert audit.backward_reason(c, "cube") is None
    assert audit.check_gaps(c) == []


def test_bound_but_never_executed_is_a_gap(tmp_path):
    checks = PARITY.replace("      equation: {eq}\n", "      equation: {eq}\n      "
                            "backends: [reference]\n").replace("kind: parity", "kind: property"
                            ).replace("      tolerance:", "      predicate: \"y >= 0\"\n"
                                      "      tolerance:")
    _, c = load(tmp_path, contract_text("square_nograd", checks, eq="cube"))
    assert audit.check_gaps(c) == ["equation cube on torch: bound, but no check executes it"]


def test_unbound_public_export_is_reported(tmp_path):
    """A module without `__all__`: every public callable defined there is an export."""
    _, c = load(tmp_path, contract_text("square", PARITY + GRADIENT))
    found = audit.export_findings(c)
    names = sorted(f.split(" ")[0] for f in found)
    # bound functions are fine; helper is named only as a mutant's replacement, which is no
    # binding; _Square and _private_helper are private. square_nograd calls the bound square,
    # which does not help it: without __all__ there is no thin-wrapper rule.
    assert names == [f"{FNS}:helper", f"{FNS}:square_nograd"], found
    assert not any("_private_helper" in f or "_Square" in f for f in found)
    assert all("declare the module's API in __all__" in f for f in found), found


EXPORTS = "tests.fixtures.kernels.torch.audit_exports"
EXPORTS_CONTRACT = f"""metadata:
  version: 1.0.0
  description: "audit fixture: a module with __all__"
  references: ["none needed"]
  kernel: audit_exports
  status: draft
equations:
  square:
    formula: "x²"
    bindings:
      reference: {EXPORTS}:square_ref
      torch: {EXPORTS}:{{binding}}
inputs:
  xs:
    dtypes: [float32]
    dims: {{{{n: [1, 8]}}}}
    args:
      x: {{{{shape: [n], values: [-2.0, 2.0]}}}}
proof_obligations:
  - {{{{id: SQ-EQV-001, type: equivalence, property: "x²", applies_to: square}}}}
falsification_tests:
  - id: FALSIFY-SQ-001
    rule: parity
    prediction: "x² matches the reference"
    obligation: SQ-EQV-001
    check:
      kind: parity
      input: xs
      tolerance: {{{{why: "one rounding", float32: {{{{rtol: "eps"}}}}}}}}
mutants:
  - {{{{id: MUT-SQ-001, obligation: SQ-EQV-001, replaces: square.torch, with: {EXPORTS}:helper,
     description: "identity"}}}}
"""


def test_all_declares_the_exports(tmp_path):
    """With `__all__`, its names are the candidates: an unbound export and an undefined name
    are reported; a helper left out of `__all__` is not (though public and unbound), nor a
    constant, nor the entry point the bound function wraps."""
    _, c = load(tmp_path, EXPORTS_CONTRACT.format(binding="square"))
    found = audit.export_findings(c)
    names = sorted(f.split(" ")[0] for f in found)
    assert names == [f"{EXPORTS}:missing", f"{EXPORTS}:unbound_export"], found
    assert any("missing is public (in __all__) but" in f and "does not define it" in f
               for f in found), found
    assert not any("helper" in f for f in found), found


def test_a_wrapped_export_is_covered_only_through_its_binding(tmp_path):
    """`square_inplace` counts as checked because the bound `square` calls it; bind
    `square_inplace` itself instead and `square`, now unbound and calling nothing exported,
    is the finding."""
    _, c = load(tmp_path, EXPORTS_CONTRACT.format(binding="square_inplace"))
    names = sorted(f.split(" ")[0] for f in audit.export_findings(c))
    assert names == [f"{EXPORTS}:missing", f"{EXPORTS}:square", f"{EXPORTS}:unbound_export"]


def test_cli_exit_status(tmp_path, capsys):
    bad, _ = load(tmp_path, contract_text("square", PARITY, eq="cube"))
    assert main(["audit", "--checks-only", str(bad)]) == 1
    assert "forward checked, backward not" in capsys.readouterr().out
    good = tmp_path / "ok" / "square-kernel-v1.yaml"
    good.parent.mkdir()
    good.write_text(contract_text("square", PARITY + GRADIENT), encoding="utf-8")
    assert main(["audit", "--checks-only", str(good)]) == 0


def test_a_training_probe_executes_every_equation_its_obligation_applies_to(tmp_path):
    """A training check runs a whole model or loop: it executes each equation of its
    obligation's applies_to; with `wrt` it also judges their gradient. model-parity-v1 had 20
    gaps before this rule, though its probe runs all six kernels forward and backward."""
    c, _ = load_contract(ROOT / "falsify" / "contracts" / "model-parity-v1.yaml")
    assert audit.check_gaps(c) == []
    grad = next(t for t in c.checks if t.id == "FALSIFY-PAR-004")
    grad.spec.pop("wrt")
    gaps = audit.check_gaps(c)
    assert gaps and all("forward checked, backward not" in g for g in gaps), gaps
    assert len(gaps) == 10, gaps  # rmsnorm, rope, attention, swiglu, embedding × torch, triton
    for t in c.checks:  # and without any training check nothing executes the bindings
        t.spec["kind"] = "symbolic"
    assert sum("bound, but no check executes it" in g for g in audit.check_gaps(c)) == 12


@pytest.mark.parametrize("name", ["attention-kernel-v1", "swiglu-kernel-v1",
                                  "rmsnorm-kernel-v1", "model-parity-v1", "train-loop-v1",
                                  "export-v1"])
def test_repository_contracts_have_no_check_gaps(name):
    c, _ = load_contract(ROOT / "falsify" / "contracts" / f"{name}.yaml")
    assert audit.check_gaps(c) == []


def test_attention_without_the_flash_gradient_checks_has_the_gap(tmp_path):
    """The attention contract as it was before FALSIFY-ATT-018/019: flash_attention's own
    backward (the torch tiled autograd.Function) was checked nowhere, because `attention`
    routes to SDPA on torch."""
    text = (ROOT / "falsify" / "contracts" / "attention-kernel-v1.yaml").read_text(encoding="utf-8")
    start, end = text.index("  - id: FALSIFY-ATT-018\n"), text.index("\nmutants:\n")
    p = Path(tmp_path) / "attention-kernel-v1.yaml"
    p.write_text(text[:start] + text[end + 1:], encoding="utf-8")
    c, _ = load_contract(p)
    assert not [t for t in c.checks if t.id in ("FALSIFY-ATT-018", "FALSIFY-ATT-019")]
    gaps = audit.check_gaps(c)
    assert {g.split(":")[0] for g in gaps} == {
        f"equation flash_attention on {b}" for b in ("reference", "torch", "triton")}, gaps
    assert main(["audit", "--checks-only", str(p)]) == 1


def _edited(tmp_path, name: str, edit) -> Path:
    text = (ROOT / "falsify" / "contracts" / f"{name}.yaml").read_text(encoding="utf-8")
    p = Path(tmp_path) / f"{name}.yaml"
    p.write_text(edit(text), encoding="utf-8")
    return p


def test_a_later_output_no_gradient_check_differentiates_is_a_gap(tmp_path):
    """attention without FALSIFY-ATT-020/021: o's backward is checked, lse's (dlse) is not."""
    def drop(text):  # ATT-020 and ATT-021 are the last checks, before `mutants:`
        return text[:text.index("  - id: FALSIFY-ATT-020\n")] + text[text.index("mutants:\n"):]
    c, _ = load_contract(_edited(tmp_path, "attention-kernel-v1", drop))
    gaps = [g for g in audit.check_gaps(c) if "'lse'" in g]
    assert {g.split(":")[0] for g in gaps} == {
        f"equation flash_attention on {b}" for b in ("reference", "torch", "triton")}, gaps


def test_a_statistic_declared_non_differentiable_needs_no_gradient_check(tmp_path):
    c, _ = load_contract(ROOT / "falsify" / "contracts" / "rmsnorm-kernel-v1.yaml")
    assert c.equations["rmsnorm_forward"].non_differentiable == ["inv_rms"]
    assert audit.check_gaps(c) == []
    p = _edited(tmp_path, "rmsnorm-kernel-v1",
                lambda t: t.replace("    non_differentiable: [inv_rms]\n", ""))
    c, _ = load_contract(p)
    gaps = audit.check_gaps(c)
    assert gaps and all("output 'inv_rms' is differentiable" in g for g in gaps), gaps
