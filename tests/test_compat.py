"""Compat mode: provable-contracts (pv) files load unchanged.

tests/fixtures/compat/ holds the pv-format contracts quoted in the seeds, byte for byte (seed
000: qlora-training-loop-v1, wgsl-gemm-tiled-v1, nf4-dequantization-v1, fused-cross-entropy-v1;
seed 002: cublas-gemm-v1, training-step-budget-v1), YAML defects included: nf4's duplicate
`formula:` key, the unquoted `|x| < eps` values in three of them, fused-cross-entropy's
invariant that YAML reads as a mapping. The counts below were taken by reading the YAML.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from falsify.cli.pv import main
from falsify.harness.model import load_contract
from falsify.harness.validate import validate

COMPAT = Path(__file__).parent / "fixtures" / "compat"
SEEDS = Path("/work/shared/seeds")

# id: (equations, obligations, falsification tests, kani harnesses)
COUNTS = {
    "qlora-training-loop-v1": (6, 0, 0, 0),
    "wgsl-gemm-tiled-v1": (4, 0, 4, 2),
    "nf4-dequantization-v1": (3, 0, 4, 2),
    "fused-cross-entropy-v1": (3, 0, 3, 1),
    "cublas-gemm-v1": (5, 7, 7, 1),
    "training-step-budget-v1": (3, 4, 3, 0),
}


def path(cid: str) -> Path:
    return COMPAT / f"{cid}.yaml"


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed documents are not on this machine")
@pytest.mark.parametrize("cid", sorted(COUNTS))
def test_fixture_is_quoted_verbatim_from_a_seed(cid):
    seeds = "\n".join(p.read_text(encoding="utf-8") for p in sorted(SEEDS.glob("*.txt")))
    assert path(cid).read_text(encoding="utf-8").rstrip("\n") in seeds


@pytest.mark.parametrize("cid", sorted(COUNTS))
def test_loads_in_compat_mode_with_exact_counts(cid):
    c, _ = load_contract(path(cid))
    assert c.mode == "compat"
    eqs, obs, tests, kani = COUNTS[cid]
    assert (len(c.equations), len(c.obligations), len(c.checks), len(c.kani_harnesses)) == \
        (eqs, obs, tests, kani)
    assert not [t for t in c.checks if t.kind]  # prose only: nothing is executable


def test_status_counts_match(capsys):
    assert main(["status", "--format", "json", str(COMPAT)]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["contracts"]}
    assert set(rows) == set(COUNTS)
    for cid, (eqs, obs, tests, kani) in COUNTS.items():
        r = rows[cid]
        assert (r["mode"], r["equations"], r["obligations"], r["checks"]["total"],
                r["checks"]["executable"], r["mutants"], r["symbolic_checks"],
                r["kani_harnesses"]) == ("compat", eqs, obs, tests, 0, 0, 0, kani)


def test_ids_are_derived_deterministically():
    a, _ = load_contract(path("cublas-gemm-v1"))
    b, _ = load_contract(path("cublas-gemm-v1"))
    ids = [o.id for o in a.obligations]
    assert ids == [o.id for o in b.obligations]
    # prefix from the FALSIFY-CUBLAS-nnn ids, numbered per obligation type in file order
    assert ids == ["CUBLAS-EQV-001", "CUBLAS-INV-001", "CUBLAS-INV-002", "CUBLAS-BND-001",
                   "CUBLAS-INV-003", "CUBLAS-INV-004", "CUBLAS-INV-005"]
    assert all(o.derived_id for o in a.obligations)
    budget, _ = load_contract(path("training-step-budget-v1"))
    assert [o.id for o in budget.obligations] == [f"BUDGET-BND-{i:03d}" for i in range(1, 5)]


def test_compat_findings_are_warnings_and_validate_exits_0(capsys):
    assert main(["validate", str(COMPAT)]) == 0
    out = capsys.readouterr().out
    assert "0 error(s)" in out and "in 6 contract(s)" in out
    rep = validate([COMPAT])
    assert rep.errors == [] and len(rep.contracts) == 6
    # the kani harness's SM-style obligation reference resolves against a derived id
    assert not [f for f in rep.findings if f.field == "kani_harnesses[0].obligation"]


def _warnings(cid, rule):
    return [f for f in validate([path(cid)]).findings if f.rule == rule]


def _line(cid, needle, nth=1):
    text = path(cid).read_text(encoding="utf-8")
    at = -1
    for _ in range(nth):
        at = text.index(needle, at + 1)
    return text.count("\n", 0, at) + 1


def test_duplicate_formula_key_is_a_warning_and_the_last_value_wins():
    (f,) = _warnings("nf4-dequantization-v1", "W104")
    assert f.line == _line("nf4-dequantization-v1", "formula: x_{i+1}")
    c, _ = load_contract(path("nf4-dequantization-v1"))
    assert c.equations["blockwise_dequant"].formula.startswith("x_{i+1} = NF4_LUT")


@pytest.mark.parametrize("cid, needle", [
    ("wgsl-gemm-tiled-v1", "formula: |WGSL_GEMM"),
    ("nf4-dequantization-v1", "prediction: |nf4_dequant_gpu"),
    ("fused-cross-entropy-v1", "prediction: |fused_ce"),
])
def test_unquoted_bar_values_are_read_as_strings(cid, needle):
    (f,) = _warnings(cid, "W110")
    assert f.line == _line(cid, needle)
    c, _ = load_contract(path(cid))
    value = needle.split(": ", 1)[1]
    texts = [e.formula for e in c.equations.values()] + [t.prediction for t in c.checks]
    assert any(t.startswith(value) for t in texts)
    # native mode does not guess
    assert [f.rule for f in validate([path(cid)], mode="native").findings
            if f.severity == "error"] == ["V001"]


def test_yaml_mapping_in_a_text_list_is_kept_as_the_sentence():
    c, _ = load_contract(path("fused-cross-entropy-v1"))
    assert "For V=32000: saves ~500 MB per batch vs unfused" in \
        c.equations["memory_bound"].invariants
    (f,) = _warnings("fused-cross-entropy-v1", "W102")[:1]
    assert f.line == _line("fused-cross-entropy-v1", "For V=32000")


def test_cublas_tolerance_1e_minus_2_is_a_number():
    # PyYAML (YAML 1.1) reads `1e-2` as a string; pv's serde_yaml reads a number, so do we
    c, _ = load_contract(path("cublas-gemm-v1"))
    assert c.obligations[0].tolerance == pytest.approx(1e-2)


def test_strict_makes_native_rules_errors(capsys):
    assert main(["validate", "--strict", str(COMPAT)]) == 1
    out = capsys.readouterr().out
    for rule in ("V001", "V007", "V010", "V016", "V020"):
        assert f"error {rule}" in out
    # --compat forces the relaxed reading explicitly
    assert main(["validate", "--compat", str(path("cublas-gemm-v1"))]) == 0


def test_strict_and_compat_together_is_a_usage_error(capsys):
    assert main(["status", "--strict", "--compat", str(COMPAT)]) == 2
    assert "exclusive" in capsys.readouterr().err


def test_equations_and_graph_work_on_pv_files(capsys):
    assert main(["equations", "--format", "latex", str(COMPAT)]) == 0
    out = capsys.readouterr().out
    assert r"\operatorname{WGSL\_GEMM}" in out and "\\section*{cublas-gemm-v1}" in out
    # pv files name dependencies that are not in this directory: errors, not phantom nodes
    assert main(["graph", "--format", "json", str(COMPAT)]) == 1
    g = json.loads(capsys.readouterr().out)
    assert "matmul-kernel-v1" not in g["nodes"]
    assert {"contract": "wgsl-gemm-tiled-v1", "index": 0, "depends_on": "matmul-kernel-v1"} \
        in g["missing"]
    assert {"contract": "training-step-budget-v1", "depends_on": "cublas-gemm-v1"} in g["edges"]
