"""One test per validation rule: break a copy of a valid contract so that exactly that rule
fires, and check its id and the `file:line` of the offending field.

The baseline is tests/fixtures/valid/softmax-lite-v1.yaml (the softmax contract bound to the
reference and torch backends, which always import), valid with zero findings in native and in
forced compat mode. Native rules are V001-V024; W1xx are the compat-mode warnings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from falsify.harness.validate import validate

BASE = Path(__file__).parent / "fixtures" / "valid" / "softmax-lite-v1.yaml"
NAME = "softmax-lite-v1.yaml"


def base_text() -> str:
    return BASE.read_text(encoding="utf-8")


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth occurrence of `needle`."""
    at = -1
    for _ in range(nth):
        at = text.index(needle, at + 1)
    return text.count("\n", 0, at) + 1


def run(tmp_path, text: str, mode=None, name=NAME, extra: dict | None = None):
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    for n, t in (extra or {}).items():
        (tmp_path / n).write_text(t, encoding="utf-8")
    return p, validate([p], mode=mode).findings


def only(findings, rule: str, severity: str | None = None):
    """Exactly `rule` fired (possibly several times); returns its findings."""
    rules = sorted({f.rule for f in findings})
    assert rules == [rule], "\n".join(map(str, findings)) or "no findings"
    if severity:
        assert {f.severity for f in findings} == {severity}
    return findings


def test_baseline_is_valid_in_both_modes(tmp_path):
    assert run(tmp_path, base_text())[1] == []
    assert run(tmp_path, base_text(), mode="compat")[1] == []


# ---------------------------------------------------------------------------- V001


@pytest.mark.parametrize("case", ["syntax", "not_mapping", "empty", "not_utf8", "tab"])
def test_v001_unreadable(tmp_path, case):
    text = base_text()
    if case == "syntax":
        text, line = edit(text, "  depends_on: []", "  depends_on: [oops"), None
    elif case == "not_mapping":
        text, line = "- just\n- a list\n", 1
    elif case == "empty":
        text, line = "\n\n# only a comment\n", 1
    elif case == "not_utf8":
        raw = edit(text, "  kernel: softmax", "  kernel: soft\udcffmax")
        text = raw.encode("utf-8", "surrogateescape")
        line = line_of(raw, "kernel: soft")
    else:  # a tab where YAML wants indentation
        text = edit(text, "  kernel: softmax", "\tkernel: softmax")
        line = line_of(text, "\tkernel")
    p, fs = run(tmp_path, text)
    (f,) = only(fs, "V001", "error")
    assert f.path == str(p)
    if line is not None:
        assert f.line == line
    else:  # a flow sequence left open: libyaml stops at the next token it cannot place
        assert f.line >= line_of(text, "depends_on: [oops")
    assert "\n" not in f.message


# ---------------------------------------------------------------------------- V002/V003/V004


def test_v002_schema_type(tmp_path):
    text = edit(base_text(), "  critical: true", '  critical: "yes"')
    (f,) = only(run(tmp_path, text)[1], "V002", "error")
    assert (f.line, f.field) == (line_of(text, "critical:"), "metadata.critical")


def test_v002_missing_required(tmp_path):
    text = edit(base_text(), "    rule: Probabilities are bounded\n", "")
    (f,) = only(run(tmp_path, text)[1], "V002")
    assert f.line == line_of(text, "- id: FALSIFY-SM-002") and "'rule'" in f.message


def test_v003_unknown_key(tmp_path):
    text = edit(base_text(), "    domain: \"x ∈", "    colour: blue\n    domain: \"x ∈")
    (f,) = only(run(tmp_path, text)[1], "V003", "error")
    assert (f.line, f.field) == (line_of(text, "colour:"), "equations.softmax.colour")


def test_v004_duplicate_key(tmp_path):
    text = edit(base_text(), "  kernel: softmax\n", "  kernel: softmax\n  kernel: softmax\n")
    (f,) = only(run(tmp_path, text)[1], "V004", "error")
    assert f.line == line_of(text, "kernel: softmax", nth=2)


# ---------------------------------------------------------------------------- ids


def test_v005_duplicate_id_in_contract(tmp_path):
    text = edit(base_text(), "  - id: MUT-SM-002", "  - id: MUT-SM-001")
    (f,) = only(run(tmp_path, text)[1], "V005", "error")
    assert f.line == line_of(text, "id: MUT-SM-001", nth=2)
    assert f"line {line_of(text, 'id: MUT-SM-001')}" in f.message


def test_v006_duplicate_id_across_contracts(tmp_path):
    other = base_text().replace("SM-", "SX-")
    other = edit(other, "  - id: MUT-SX-002", "  - id: MUT-SM-002")
    run(tmp_path, base_text(), name="a-v1.yaml")
    (tmp_path / "b-v1.yaml").write_text(other, encoding="utf-8")
    fs = validate([tmp_path]).findings
    (f,) = only(fs, "V006", "error")
    assert f.path.endswith("b-v1.yaml") and f.line == line_of(other, "id: MUT-SM-002")
    assert "a-v1" in f.message


def test_v007_obligation_without_id(tmp_path):
    new = ("  - type: invariant\n    property: Rows are non-empty\n    applies_to: softmax\n"
           "proof_obligations_end_marker")
    text = edit(base_text(), "\nfalsification_tests:", "\n" + new + "\nfalsification_tests:")
    text = text.replace("proof_obligations_end_marker\n", "")
    fs = only(run(tmp_path, text)[1], "V007", "error")
    assert {f.line for f in fs} == {line_of(text, "- type: invariant\n    property: Rows")}
    assert any("no id" in f.message for f in fs)


def test_v007_obligation_without_executable_check(tmp_path):
    new = "  - id: SM-INV-009\n    type: invariant\n    property: Rows are non-empty\n"
    text = edit(base_text(), "\nfalsification_tests:", "\n" + new + "\nfalsification_tests:")
    (f,) = only(run(tmp_path, text)[1], "V007", "error")
    assert f.line == line_of(text, "- id: SM-INV-009") and "SM-INV-009" in f.message


# ---------------------------------------------------------------------------- references


NEW_TEST = """  - id: FALSIFY-SM-009
    rule: extra
    prediction: "rows are finite"
    obligation: {obligation}
    check: {{kind: property, input: rows, predicate: "np.isfinite(y)"}}
"""


def _add_test(text: str, obligation: str) -> str:
    text = edit(text, "\nmutants:", "\n" + NEW_TEST.format(obligation=obligation) + "\nmutants:")
    return edit(text, "All 8 falsification tests", "All 9 falsification tests")


def test_v008_check_names_missing_obligation(tmp_path):
    text = _add_test(base_text(), "SM-NOPE-001")
    (f,) = only(run(tmp_path, text)[1], "V008", "error")
    assert f.line == line_of(text, "obligation: SM-NOPE-001")


def test_v008_kani_harness_names_missing_obligation(tmp_path):
    text = edit(base_text(), "\nqa_gate:", "\nkani_harnesses:\n  - id: KANI-SM-001\n"
                                           "    obligation: SM-NOPE-002\n\nqa_gate:")
    (f,) = only(run(tmp_path, text)[1], "V008", "error")
    assert f.line == line_of(text, "obligation: SM-NOPE-002")


def test_v009_applies_to_missing_equation(tmp_path):
    text = base_text()
    at = text.index("id: SM-BND-003")
    text = text[:at] + text[at:].replace("applies_to: softmax", "applies_to: softmin", 1)
    (f,) = only(run(tmp_path, text)[1], "V009", "error")
    assert f.line == line_of(text, "applies_to: softmin")


def test_v010_depends_on_missing_contract(tmp_path):
    text = edit(base_text(), "  depends_on: []", "  depends_on:\n    - nosuch-kernel-v1")
    (f,) = only(run(tmp_path, text)[1], "V010", "error")
    assert f.line == line_of(text, "- nosuch-kernel-v1") and "nosuch-kernel-v1" in f.message


def test_v011_dependency_cycle_self(tmp_path):
    text = edit(base_text(), "  depends_on: []", "  depends_on:\n    - softmax-lite-v1")
    (f,) = only(run(tmp_path, text)[1], "V011", "error")
    assert f.line == line_of(text, "- softmax-lite-v1")
    assert "softmax-lite-v1 -> softmax-lite-v1" in f.message


def test_v011_dependency_cycle_two_files(tmp_path):
    a = edit(base_text(), "  depends_on: []", "  depends_on:\n    - b-v1")
    b = edit(base_text().replace("SM-", "SB-"), "  depends_on: []", "  depends_on:\n    - a-v1")
    (tmp_path / "a-v1.yaml").write_text(a, encoding="utf-8")
    (tmp_path / "b-v1.yaml").write_text(b, encoding="utf-8")
    fs = validate([tmp_path / "a-v1.yaml"]).findings  # b is found next to it
    (f,) = only(fs, "V011", "error")
    assert f.path.endswith("a-v1.yaml") and f.line == line_of(a, "- b-v1")
    assert "a-v1 -> b-v1 -> a-v1" in f.message


# ---------------------------------------------------------------------------- bindings


def test_v012_binding_does_not_resolve(tmp_path):
    text = edit(base_text(), "torch: falsify.kernels.torch.softmax:softmax",
                "torch: falsify.kernels.torch.softmax:no_such_function")
    (f,) = only(run(tmp_path, text)[1], "V012", "error")
    assert f.line == line_of(text, "no_such_function") and f.field.endswith("bindings.torch")


def test_v012_mutant_with_does_not_import(tmp_path):
    text = edit(base_text(), "with: falsify.mutants.softmax:sum_over_wrong_axis",
                "with: falsify.mutants.no_such_module:sum_over_wrong_axis")
    (f,) = only(run(tmp_path, text)[1], "V012", "error")
    assert f.line == line_of(text, "no_such_module")


def test_v013_binding_outside_project(tmp_path):
    text = edit(base_text(), "reference: falsify.reference.softmax:softmax",
                "reference: numpy:exp")
    (f,) = only(run(tmp_path, text)[1], "V013", "error")
    assert f.line == line_of(text, "reference: numpy:exp")


# ---------------------------------------------------------------------------- tolerances


@pytest.mark.parametrize("value, why", [
    ('"-(n + 4) * eps"', "positive"),  # negative at every example
    ('"1 - n * eps * 1.0e5"', "positive"),  # positive for small n, negative at n = 4099
    ('"(n + 4) *"', "syntax"),
    ('"9 ** 9 ** 9"', "exponent"),  # would never finish evaluating
    ('"np.zeros(10 ** 9).sum()"', "allowed"),  # would allocate 8 GB
    ('"n * q"', "q"),  # unknown name
])
def test_v014_tolerance_not_positive_or_not_evaluable(tmp_path, value, why):
    text = edit(base_text(), 'float32: {atol: "(n + 4) * eps"}\n        float16: {atol: "eps + '
                             'n * 6.0e-8"}\n    if_fails: "normalizer',
                f'float32: {{atol: {value}}}\n        float16: {{atol: "eps + n * 6.0e-8"}}\n'
                '    if_fails: "normalizer')
    (f,) = only(run(tmp_path, text)[1], "V014", "error")
    assert f.line == line_of(text, f"float32: {{atol: {value}")
    assert why in f.message


def test_v014_obligation_tolerance_negative(tmp_path):
    text = edit(base_text(), "    formal: \"0 ≤ σ(x)_i ≤ 1\"\n",
                "    formal: \"0 ≤ σ(x)_i ≤ 1\"\n    tolerance: -1.0e-6\n")
    (f,) = only(run(tmp_path, text)[1], "V014", "error")
    assert f.line == line_of(text, "tolerance: -1.0e-6")
    # the same negative tolerance is an error in compat mode too: it is never meaningful
    (g,) = only(run(tmp_path, text, mode="compat")[1], "V014", "error")
    assert g.line == f.line


def test_v015_tolerance_missing_for_a_dtype(tmp_path):
    text = edit(base_text(), '        float32: {atol: "(n + 4) * eps"}\n        float16: {atol: '
                             '"eps + n * 6.0e-8"}\n    if_fails: "normalizer',
                '        float32: {atol: "(n + 4) * eps"}\n    if_fails: "normalizer')
    (f,) = only(run(tmp_path, text)[1], "V015", "error")
    assert "'float16'" in f.message
    at = text.index("id: FALSIFY-SM-001")
    assert f.line == line_of(text[at:], "tolerance:") + text.count("\n", 0, at)


# ---------------------------------------------------------------------------- gate/version


def test_v016_gate_count_mismatch(tmp_path):
    text = edit(base_text(), "All 8 falsification tests", "All 7 falsification tests")
    (f,) = only(run(tmp_path, text)[1], "V016", "error")
    assert f.line == line_of(text, "pass_criteria:")


def test_v016_gate_names_unknown_check(tmp_path):
    text = edit(base_text(), "FALSIFY-SM-008]", "FALSIFY-SM-008, FALSIFY-SM-099]")
    (f,) = only(run(tmp_path, text)[1], "V016", "error")
    assert f.line == line_of(text, "FALSIFY-SM-099") and "FALSIFY-SM-099" in f.message


def test_v017_version_not_semver(tmp_path):
    text = edit(base_text(), "  version: 1.0.0", "  version: '1.0'")
    (f,) = only(run(tmp_path, text)[1], "V017", "error")
    assert f.line == 2


# ---------------------------------------------------------------------------- check specs


def test_v018_check_missing_field(tmp_path):
    text = edit(base_text(), '      predicate: "(y >= 0) & (y <= 1)"\n', "")
    (f,) = only(run(tmp_path, text)[1], "V018", "error")
    assert f.line == line_of(text, "check:", nth=2) and "predicate" in f.message


def test_v018_check_input_not_declared(tmp_path):
    text = edit(base_text(), "      input: large\n      predicate",
                "      input: huge\n      predicate")
    (f,) = only(run(tmp_path, text)[1], "V018", "error")
    assert f.line == line_of(text, "input: huge")


def test_v018_check_backend_not_bound(tmp_path):
    text = edit(base_text(), "      input: rows\n      predicate: \"(y >= 0)",
                "      input: rows\n      backends: [triton]\n      predicate: \"(y >= 0)")
    (f,) = only(run(tmp_path, text)[1], "V018", "error")
    assert f.line == line_of(text, "backends: [triton]")


def test_v018_predicate_not_an_expression(tmp_path):
    text = edit(base_text(), 'predicate: "(y >= 0) & (y <= 1)"', 'predicate: "(y >= 0) &"')
    (f,) = only(run(tmp_path, text)[1], "V018", "error")
    assert f.line == line_of(text, 'predicate: "(y >= 0) &"')


def test_v019_mutant_names_missing_obligation(tmp_path):
    text = edit(base_text(), "    obligation: SM-INV-001\n    replaces: softmax.torch",
                "    obligation: SM-INV-404\n    replaces: softmax.torch")
    (f,) = only(run(tmp_path, text)[1], "V019", "error")
    assert f.line == line_of(text, "obligation: SM-INV-404")


def test_v019_mutant_replaces_unbound_backend(tmp_path):
    text = edit(base_text(), "    obligation: SM-INV-001\n    replaces: softmax.torch",
                "    obligation: SM-INV-001\n    replaces: softmax.triton")
    fs = only(run(tmp_path, text)[1], "V019", "error")
    assert line_of(text, "replaces: softmax.triton") in {f.line for f in fs}


def test_v020_no_references(tmp_path):
    text = base_text()
    start, end = text.index("  references:"), text.index("  depends_on:")
    text = text[:start] + "  references: []\n" + text[end:]
    (f,) = only(run(tmp_path, text)[1], "V020", "error")
    assert f.line == line_of(text, "references: []")


def test_v021_input_named_like_a_harness_name(tmp_path):
    text = edit(base_text(), "      x: {shape: [m, n], values: [-30.0, 30.0]}",
                "      x: {shape: [m, n], values: [-30.0, 30.0]}\n      tol: {const: 1.0}")
    (f,) = only(run(tmp_path, text)[1], "V021", "error")
    assert f.line == line_of(text, "tol: {const: 1.0}") and "'tol'" in f.message


def test_v021_bare_eps_beside_an_eps_argument(tmp_path):
    text = edit(base_text(), "      x: {shape: [m, n], values: [-30.0, 30.0]}",
                "      x: {shape: [m, n], values: [-30.0, 30.0]}\n      eps: {const: 1.0e-6}")
    text = edit(text, 'predicate: "(y >= 0) & (y <= 1)"', 'predicate: "(y >= -eps) & (y <= 1)"')
    (f,) = only(run(tmp_path, text)[1], "V021", "error")
    assert f.line == line_of(text, 'predicate: "(y >= -eps)')
    assert "eps_dtype" in f.message and "args['eps']" in f.message
    # the disambiguated spellings validate
    ok = edit(text, "(y >= -eps)", "(y >= -args['eps'] - eps_dtype)")
    assert run(tmp_path, ok)[1] == []


# ---------------------------------------------------------------------------- warnings
# Compat mode (forced here; auto-detected for pv files) turns what only native mode requires
# into warnings. Each test breaks the same baseline.


def test_w101_derived_id(tmp_path):
    # SM-BND-003 loses its id; the derived id is SM-BND-003 again (BND-001/002 are taken),
    # so FALSIFY-SM-008 still resolves: derivation is deterministic.
    text = edit(base_text(), "  - id: SM-BND-003\n    type: bound", "  - type: bound")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W101", "warning")
    assert f.line == line_of(text, "  - type: bound\n    property: Triton")
    assert "SM-BND-003" in f.message


def test_w102_schema_warning(tmp_path):
    text = edit(base_text(), "  critical: true", '  critical: "yes"')
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W102", "warning")
    assert f.line == line_of(text, "critical:")


def test_w103_unknown_key(tmp_path):
    text = edit(base_text(), "  kernel: softmax", "  kernel: softmax\n  colour: blue")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W103", "warning")
    assert f.line == line_of(text, "colour:")


def test_w104_duplicate_key(tmp_path):
    text = edit(base_text(), "  kernel: softmax\n", "  kernel: softmax\n  kernel: softmax\n")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W104", "warning")
    assert f.line == line_of(text, "kernel: softmax", nth=2)


@pytest.mark.parametrize("mode", ["compat", None])
def test_w105_test_without_check(tmp_path, mode):
    # FALSIFY-SM-006 becomes prose only; SM-EQV-001 keeps FALSIFY-SM-005, so nothing else fires
    text = base_text()
    start = text.index("  - id: FALSIFY-SM-006")
    c0 = text.index("    check:\n", start)
    c1 = text.index("    if_fails:", c0)
    text = text[:c0] + text[c1:]
    (f,) = only(run(tmp_path, text, mode=mode)[1], "W105", "warning")
    assert f.line == line_of(text, "- id: FALSIFY-SM-006")


def test_w106_no_bindings(tmp_path):
    # a pv-format contract with prose tests only: no bindings is a warning, not an error
    text = PV_MINI
    fs = run(tmp_path, text)[1]
    (f,) = [f for f in fs if f.rule == "W106"]
    assert f.line == line_of(text, "equations:")
    assert {f.severity for f in fs} == {"warning"}


PV_MINI = """metadata:
  version: 1.0.0
  description: Row softmax in the provable-contracts format
  references:
    - "Milakov & Gimelshein (2018)"
equations:
  softmax:
    formula: "σ(x)_i = exp(x_i − max(x)) / Σ_j exp(x_j − max(x))"
proof_obligations:
  - type: invariant
    property: Output sums to 1
    applies_to: softmax
falsification_tests:
  - id: FALSIFY-SM-001
    rule: Partition of unity
    prediction: "sum(softmax(x)) = 1"
    if_fails: normalizer bug
qa_gate:
  id: F-SM-001
  name: Softmax gate
  pass_criteria: All 1 falsification tests pass
"""


def test_pv_mini_is_auto_detected_as_compat(tmp_path):
    fs = run(tmp_path, PV_MINI)[1]
    assert sorted(f.rule for f in fs) == ["W101", "W105", "W106", "W107"]
    # --strict makes the native rules errors
    strict = run(tmp_path, PV_MINI, mode="native")[1]
    assert {f.rule for f in strict if f.severity == "error"} == {"V007"}


def test_w107_obligation_without_check(tmp_path):
    new = "  - id: SM-INV-009\n    type: invariant\n    property: Rows are non-empty\n"
    text = edit(base_text(), "\nfalsification_tests:", "\n" + new + "\nfalsification_tests:")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W107", "warning")
    assert f.line == line_of(text, "- id: SM-INV-009")


def test_w108_no_references(tmp_path):
    text = base_text()
    start, end = text.index("  references:"), text.index("  depends_on:")
    text = text[:start] + text[end:]
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W108", "warning")
    assert f.line == 1  # no references key at all: the metadata line


@pytest.mark.parametrize("case", ["applies_to", "depends_on", "kani", "gate_count"])
def test_w109_dangling_reference(tmp_path, case):
    text = base_text()
    if case == "applies_to":
        at = text.index("id: SM-BND-003")
        text = text[:at] + text[at:].replace("applies_to: softmax", "applies_to: softmin", 1)
        needle = "applies_to: softmin"
    elif case == "depends_on":
        text = edit(text, "  depends_on: []", "  depends_on:\n    - nosuch-kernel-v1")
        needle = "- nosuch-kernel-v1"
    elif case == "kani":
        text = edit(text, "\nqa_gate:", "\nkani_harnesses:\n  - id: KANI-SM-001\n"
                                         "    obligation: SM-NOPE-002\n\nqa_gate:")
        needle = "obligation: SM-NOPE-002"
    else:
        text = edit(text, "All 8 falsification tests", "All 7 falsification tests")
        needle = "pass_criteria:"
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W109", "warning")
    assert f.line == line_of(text, needle)


def test_w110_yaml_line_reread_as_string(tmp_path):
    text = edit(base_text(), '    formula: "σ(x)_i = exp(x_i − max(x)) / Σ_j exp(x_j − max(x))"',
                "    formula: |σ(x)| ≤ 1 elementwise")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W110", "warning")
    assert f.line == line_of(text, "formula: |σ(x)|")
    # native mode does not guess: the same file is unreadable
    (g,) = only(run(tmp_path, text)[1], "V001", "error")
    assert g.line == f.line


def test_w111_version_not_semver(tmp_path):
    text = edit(base_text(), "  version: 1.0.0", "  version: '1.0'")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W111", "warning")
    assert f.line == 2


def test_w112_obligation_tolerance_zero(tmp_path):
    text = edit(base_text(), "    formal: \"0 ≤ σ(x)_i ≤ 1\"\n",
                "    formal: \"0 ≤ σ(x)_i ≤ 1\"\n    tolerance: 0\n")
    (f,) = only(run(tmp_path, text, mode="compat")[1], "W112", "warning")
    assert f.line == line_of(text, "tolerance: 0")
    (g,) = only(run(tmp_path, text)[1], "V014", "error")  # native: tolerances are positive
    assert g.line == f.line


def test_every_documented_rule_has_a_test():
    """The rule list in falsify/harness/validate.py's docstring and the tests above stay in step."""
    import re

    from falsify.harness import validate as v

    documented = set(re.findall(r"\b([VW]\d{3})\b", v.__doc__))
    tested = set(re.findall(r"def test_([vw]\d{3})_", Path(__file__).read_text()))
    assert documented == {t.upper() for t in tested}


def test_v022_non_differentiable_names_an_undeclared_output(tmp_path):
    text = edit(base_text(), "equations:\n  softmax:\n",
                "equations:\n  softmax:\n    non_differentiable: [lse]\n")
    (f,) = only(run(tmp_path, text)[1], "V022", "error")
    assert f.line == line_of(text, "non_differentiable: [lse]") and "'lse'" in f.message


def test_v022_a_gradient_check_may_not_differentiate_a_statistic(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "falsify" / "contracts" / "rmsnorm-kernel-v1.yaml"
            ).read_text(encoding="utf-8")
    text = edit(text, "      equation: rmsnorm_forward\n      wrt: [x, w]\n",
                "      equation: rmsnorm_forward\n      outputs: [y, inv_rms]\n      wrt: [x, w]\n")
    p, findings = run(tmp_path, text, name="rmsnorm-kernel-v1.yaml")
    (f,) = only(findings, "V022", "error")
    assert "'inv_rms' is declared non_differentiable" in f.message
    # the check's line, not the equation's
    assert f.line == line_of(text, "outputs: [y, inv_rms]", nth=2)


def test_v023_a_kind_declared_inapplicable_may_not_run(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "falsify" / "contracts" / "rmsnorm-kernel-v1.yaml"
            ).read_text(encoding="utf-8")
    text = edit(text, "  critical: true\n", "  critical: true\n  inapplicable:\n"
                "    determinism: \"said to be meaningless here\"\n")
    p, findings = run(tmp_path, text, name="rmsnorm-kernel-v1.yaml")
    (f,) = only(findings, "V023", "error")
    assert "FALSIFY-RN-013" in f.message and f.line == line_of(text, "determinism: \"said")


def test_v024_dtypes_listed_that_no_argument_takes(tmp_path):
    from tests.test_dtypes_kind import PARITY, ROWS, _contract

    fixed = dict(ROWS, dtypes=["float32", "float16"],
                 args={"x": {"shape": ["m"], "dtype": "float32", "values": [-1.0, 1.0]}})
    rep = _contract(tmp_path, "honest", {"rows": fixed}, checks=[PARITY], expect_errors=True)
    assert any(f.rule == "V024" and "lists dtypes nobody ran" in f.message for f in rep.errors)
    # a `call:` that passes the case dtype on makes the variants real
    ok = _contract(tmp_path, "honest", {"rows": fixed},
                   checks=[dict(PARITY, call={"dtype": "dtype"})], expect_errors=True)
    assert not [f for f in ok.errors if f.rule == "V024"]

def _derivative_contract(tmp_path, spec: dict, args: dict | None = None):
    from tests.test_check_semantics import contract_dict, load

    fns = "tests.fixtures.higher_fns"
    eqs = {"cube": {"reference": f"{fns}:reference", "torch": f"{fns}:plain"},
           "cube_backward": {"reference": f"{fns}:reference_backward"},
           "cube_torch_only": {"torch": f"{fns}:plain"}}
    rows = {"dtypes": ["float32"], "dims": {"m": [2, 6]}, "examples": [{"m": 3}],
            "args": args or {"x": {"shape": ["m"], "values": [0.5, 2.0]}}}
    chk = {"input": "rows", "equation": "cube", "wrt": ["x"], "backward": "cube_backward",
           **spec}
    return load(tmp_path, contract_dict(eqs, {"rows": rows}, [chk]), expect_errors=True).errors


TOL1 = {"why": "fixture", "float32": {"atol": "eps"}}


@pytest.mark.parametrize("spec, message", [
    ({"kind": "gradgrad", "backends": ["reference"], "tolerance": TOL1}, "oracle, not a subject"),
    ({"kind": "jvp", "expect": {"error": "x", "mma": True}}, "takes only `error`"),
    ({"kind": "gradgrad", "expect": {"error": "("}}, "is not a regular expression"),
    ({"kind": "jvp"}, "needs a `tolerance`"),
    ({"kind": "gradgrad", "expect": {"error": "once"}, "tolerance": TOL1}, "would never apply"),
])
def test_v027_derivative_kind_mode(tmp_path, spec, message):
    errors = _derivative_contract(tmp_path, spec)
    assert [f.rule for f in errors] == ["V027"] and message in errors[0].message, errors


@pytest.mark.parametrize("spec, args, message", [
    ({"backward": "cube_torch_only"}, None, "has no reference binding"),
    ({"wrt": ["n"]}, {"x": {"shape": ["m"], "values": [0.5, 2.0]},
                      "n": {"shape": ["m"], "dtype": "int64", "values": [0, 3]}},
     "integer dtype"),
    ({"wrt": ["x"], "call": {"x": "1.0"}}, None, "replaced by `call`"),
])
def test_v028_derivative_kind_oracle(tmp_path, spec, args, message):
    errors = _derivative_contract(tmp_path, {"kind": "gradgrad", "tolerance": TOL1, **spec},
                                  args)
    assert [f.rule for f in errors] == ["V028"] and message in errors[0].message, errors


def test_v025_layouts_rules_fit_the_input(tmp_path):
    text = (Path(__file__).resolve().parents[1] / "falsify" / "contracts" / "softmax-kernel-v1.yaml"
            ).read_text(encoding="utf-8")
    bad = edit(text, "      zero_size: {m: empty, n: error}\n", "      zero_size: {m: empty}\n")
    bad = edit(bad, "      kind: layouts\n      input: rows\n      equation: softmax\n"
               "      parity: FALSIFY-SM-005\n", "      kind: layouts\n      input: rows\n"
               "      equation: softmax\n      parity: FALSIFY-SM-006\n")
    p, findings = run(tmp_path, bad, name="softmax-kernel-v1.yaml")
    msgs = [f.message for f in only(findings, "V025", "error")]
    assert any("states no rule for n" in m for m in msgs)
    assert any("FALSIFY-SM-006 runs equation 'softmax' on input 'large'" in m for m in msgs)


def _rmsnorm_text() -> str:
    return (Path(__file__).resolve().parents[1] / "falsify" / "contracts" / "rmsnorm-kernel-v1.yaml"
            ).read_text(encoding="utf-8")


def test_v029_compile_check_bound_from_a_check_of_another_kind(tmp_path):
    text = edit(_rmsnorm_text(), "      parity: FALSIFY-RN-001\n      gradient:",
                "      parity: FALSIFY-RN-006\n      gradient:")
    p, findings = run(tmp_path, text, name="rmsnorm-kernel-v1.yaml")
    (f,) = only(findings, "V029", "error")
    assert "'FALSIFY-RN-006' is not a parity check" in f.message
    assert f.line == line_of(text, "parity: FALSIFY-RN-006")


def test_v030_compile_check_that_leaves_the_backward_out(tmp_path):
    text = edit(_rmsnorm_text(), "      parity: FALSIFY-RN-001\n"
                "      gradient: FALSIFY-RN-006\n", "      parity: FALSIFY-RN-001\n")
    p, findings = run(tmp_path, text, name="rmsnorm-kernel-v1.yaml")
    (f,) = only(findings, "V030", "error")
    assert "forward compiled, backward not" in f.message and "FALSIFY-RN-006" in f.message


def test_v031_text_argument_with_array_fields_or_sizes_out_of_order(tmp_path):
    """More `text:` cases (drawing, plumbing) are in tests/test_text_inputs.py."""
    text = edit(base_text(), "inputs:\n", "inputs:\n  words:\n    dtypes: [int64]\n    args:\n"
                "      s: {text: {min_size: 9, max_size: 3}, shape: [3]}\n")
    fs = only(run(tmp_path, text)[1], "V031", "error")
    assert {f.line for f in fs} == {line_of(text, "s: {text:")}
    assert any("shape" in f.message for f in fs) and any("min_size 9 > max_size 3" in f.message
                                                          for f in fs)


def test_v032_build_on_an_argument_that_is_not_a_drawn_array(tmp_path):
    """Drawing through `build` is in tests/test_build_inputs.py."""
    text = edit(base_text(), "inputs:\n", "inputs:\n  packed:\n    dtypes: [float32]\n"
                "    args:\n"
                "      q: {const: 3, build: 'falsify.reference.gguf_quants:bounded_q8_0'}\n")
    (f,) = only(run(tmp_path, text)[1], "V032", "error")
    assert f.line == line_of(text, "q: {const: 3") and "'const' value" in f.message


def test_v033_expression_outside_the_allow_list(tmp_path, monkeypatch):
    """A predicate that reaches numpy's file routines is refused with its line, unrun."""
    monkeypatch.chdir(tmp_path)
    text = edit(base_text(), 'predicate: "(y >= 0) & (y <= 1)"',
                "predicate: \"np.savetxt('PWNED', y) or (y >= 0)\"")
    (f,) = only(run(tmp_path, text)[1], "V033", "error")
    assert f.line == line_of(text, "np.savetxt") and "np.savetxt" in f.message
    assert not (tmp_path / "PWNED").exists()


def test_v033_tolerance_outside_the_allow_list_is_not_evaluated(tmp_path):
    text = base_text().replace('float16: {atol: "eps + n * 6.0e-8"}',
                               'float16: {atol: "np.lib.x + n * 6.0e-8"}', 1)
    (f,) = only(run(tmp_path, text)[1], "V033", "error")
    assert f.line == line_of(text, "np.lib.x") and "np.lib" in f.message


@pytest.mark.parametrize("name, why", [
    ("/etc/hostname", "must be a relative path without '..'"),
    ("../outside.json", "must be a relative path without '..'"),
    ("fixtures/missing.json", "does not exist"),
    ("fixtures", "is not a file"),
    ("fixtures/link.json", "leads out of the contract's directory (a link)"),
])
def test_v034_a_fixture_is_a_file_beside_the_contract(tmp_path, name, why):
    home = tmp_path / "contracts"
    (home / "fixtures").mkdir(parents=True)
    (tmp_path / "outside.json").write_text("{}")
    (home / "fixtures" / "link.json").symlink_to(tmp_path / "outside.json")
    (home / "fixtures" / "ok.json").write_text("{}")
    text = edit(base_text(), "metadata:\n", f"metadata:\n  fixtures: [fixtures/ok.json, {name}]\n")
    p, findings = run(home, text)
    (f,) = only(findings, "V034", "error")
    assert why in f.message and f.line == line_of(text, "fixtures: [")
    assert "metadata.fixtures[1]" in str(f)
    ok = edit(base_text(), "metadata:\n", "metadata:\n  fixtures: [fixtures/ok.json]\n")
    assert run(home, ok)[1] == []


GPU_ONLY = '''    gpu_only:
      bfloat16: "the Triton interpreter truncates bf16 casts (triton 3.9, CPU); run on a GPU"
'''


@pytest.mark.parametrize("pins, why", [
    ("{temperature: 1.0}", "no input has an argument 'temperature'"),
    ("{x: 2.0}", "2.0 lies outside every input's 'x'"),  # a drawn array, not a scalar
])
def test_v035_a_variant_pins_an_argument_an_input_draws(tmp_path, pins, why):
    variant = f'''    variants:
      shifted:
        convention: "a test convention"
        pins: {pins}
'''
    text = edit(base_text(), GPU_ONLY, GPU_ONLY + variant)
    p, findings = run(tmp_path, text)
    f = only(findings, "V035", "error")[0]
    assert why in f.message and "equations.softmax.variants.shifted.pins" in str(f)


def test_v035_a_pinned_value_lies_inside_some_input_the_bounds_were_derived_for(tmp_path):
    text = edit(base_text(), "      x: {shape: [m, n], values: [-30.0, 30.0]}\n",
                "      x: {shape: [m, n], values: [-30.0, 30.0]}\n"
                "      mode: {choices: [a, b]}\n")
    bad = edit(text, GPU_ONLY, GPU_ONLY + '''    variants:
      other-mode:
        convention: "mode c"
        pins: {mode: c}
''')
    (f,) = only(run(tmp_path, bad)[1], "V035", "error")
    assert "'c' lies outside every input's 'mode' (inputs.rows: ['a', 'b'])" in f.message
    good = edit(text, GPU_ONLY, GPU_ONLY + '''    variants:
      mode-b:
        convention: "mode b only"
        pins: {mode: b}
''')
    assert run(tmp_path, good)[1] == []


def test_a_variant_without_pins_or_reference_is_a_schema_error(tmp_path):
    text = edit(base_text(), GPU_ONLY, GPU_ONLY + '''    variants:
      empty:
        convention: "says nothing"
''')
    (f,) = only(run(tmp_path, text)[1], "V002", "error")
    assert "equations.softmax.variants.empty" in str(f)
