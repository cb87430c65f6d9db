"""The determinism and batch_invariance check kinds: what they catch, what they allow, the
contract errors they name, and their RMSNorm mutants, which no other kind of check catches."""

from __future__ import annotations

import pytest

from falsify.harness import backends, runtime
from falsify.harness.plan import equation_of
from tests.test_check_semantics import contract_dict, first_case, load, run_check

FNS = "tests.fixtures.rowwise_fns"
ROWS = {"dtypes": ["float64"], "dims": {"m": [1, 6], "n": [1, 8]},
        "args": {"x": {"shape": ["m", "n"], "values": [-1.0, 1.0]}},
        "examples": [{"m": 3, "n": 5}]}


def _contract(tmp_path, fn, check, **kw):
    eqs = {"f": {"reference": f"{FNS}:{fn}"}}
    return load(tmp_path, contract_dict(eqs, {"rows": ROWS}, [check]), **kw)


def test_deterministic_function_passes_and_reports_it(tmp_path):
    c = _contract(tmp_path, "row_sums", {"kind": "determinism", "input": "rows"})
    detail = run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))
    assert detail == {"deterministic": True, "max_run_to_run_diff": 0.0}


def test_nondeterminism_fails_unless_declared_with_a_bound(tmp_path):
    c = _contract(tmp_path, "noisy_row_sums", {"kind": "determinism", "input": "rows"})
    with pytest.raises(runtime.CheckFailed, match="not bit-identical on run 2 of 3"):
        run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))
    bound = {"why": "two orders of the atomics differ by 1e-9", "float64": {"atol": 1e-8}}
    c = _contract(tmp_path, "noisy_row_sums",
                  {"kind": "determinism", "input": "rows", "tolerance": bound})
    detail = run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))
    assert detail["deterministic"] is False and 0 < detail["max_run_to_run_diff"] < 1e-8
    tight = {"why": "a bound below the real spread", "float64": {"atol": 1e-10}}
    c = _contract(tmp_path, "noisy_row_sums",
                  {"kind": "determinism", "input": "rows", "tolerance": tight})
    with pytest.raises(runtime.CheckFailed, match="exceeds the declared bound"):
        run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))


def test_row_wise_function_is_batch_invariant(tmp_path):
    c = _contract(tmp_path, "row_sums", {"kind": "batch_invariance", "input": "rows",
                                         "batch": "m", "sizes": [7, 300]})
    detail = run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))
    assert detail == {"invariant": True, "max_diff": 0.0, "sizes": [7, 300]}


def test_a_function_that_runs_interpreted_triton_is_capped_whatever_its_backend(tmp_path):
    """The interpreter's batch cap follows what the call launches, not the backend's name: a
    Triton kernel bound as `reference` (as Liger's are bound as `torch`) runs at most
    INTERPRETED_MAX_ROWS rows per batch, and the same sums in numpy run the declared sizes."""
    import os

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the cap exists only under the Triton interpreter")
    from falsify.harness.kinds.batch_invariance import INTERPRETED_MAX_ROWS

    eqs = {"f": {"reference": "tests.fixtures.triton_rowwise:row_sums"}}
    check = {"kind": "batch_invariance", "input": "rows", "batch": "m", "sizes": [7, 300]}
    c = load(tmp_path, contract_dict(eqs, {"rows": ROWS}, [check]))
    detail = run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))
    assert detail["invariant"] and detail["sizes"] == [7, INTERPRETED_MAX_ROWS]
    (tmp_path / "numpy").mkdir()
    c = _contract(tmp_path / "numpy", "row_sums", check)
    assert run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))["sizes"] \
        == [7, 300]


def test_a_row_that_depends_on_its_batch_fails(tmp_path):
    c = _contract(tmp_path, "batch_mean", {"kind": "batch_invariance", "input": "rows",
                                           "batch": "m"})
    with pytest.raises(runtime.CheckFailed, match="as row 3 of a batch of 7"):
        run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))


def test_batch_must_be_a_dim_some_argument_carries(tmp_path):
    rep = _contract(tmp_path, "row_sums", {"kind": "batch_invariance", "input": "rows",
                                           "batch": "k"}, expect_errors=True)
    assert any("batch 'k' is not a dim of input 'rows'" in f.message for f in rep.errors)
    rep = _contract(tmp_path, "row_sums", {"kind": "batch_invariance", "input": "rows"},
                    expect_errors=True)
    assert any("needs `batch`" in f.message for f in rep.errors)


def test_a_scalar_output_is_a_contract_error_not_a_verdict(tmp_path):
    c = _contract(tmp_path, "summed", {"kind": "batch_invariance", "input": "rows",
                                       "batch": "m"})
    with pytest.raises(ValueError, match="output 0 is a scalar") as e:
        run_check(c, 0, "reference", "float64", first_case(c, 0, "float64"))
    assert not runtime.is_falsification(e.value)


# ---------------------------------------------------------------- the RMSNorm mutants
RN = "rmsnorm-kernel-v1"
ONLY_KILLED_BY = {"MUT-RN-007": "FALSIFY-RN-013", "MUT-RN-008": "FALSIFY-RN-014"}
# every pre-existing check that runs the torch `rmsnorm` binding the two mutants replace
EARLIER = ["FALSIFY-RN-001", "FALSIFY-RN-002", "FALSIFY-RN-004", "FALSIFY-RN-006", "FALSIFY-RN-008"]


@pytest.mark.parametrize("mutant", sorted(ONLY_KILLED_BY))
def test_rmsnorm_mutant_is_killed_by_its_new_kind(mutant):
    r = runtime.kill_mutant(RN, mutant)
    assert r.killed and r.killed_by.startswith(ONLY_KILLED_BY[mutant]), r


@pytest.mark.parametrize("mutant", sorted(ONLY_KILLED_BY))
def test_rmsnorm_mutant_passes_every_earlier_kind(mutant):
    """Accurate results: parity, scale invariance and the gradient checks all pass, so only
    the new kind sees these bugs."""
    c = runtime.contract(RN)
    m = next(m for m in c.mutants if m.id == mutant)
    with backends.overriding(f"{RN}:{m.equation}.{m.backend}", m.with_):
        for check_id in EARLIER:
            runtime.run_with_hypothesis(c, check_id, "torch", "float32")


# ---------------------------------------------------------------- what status, audit and docs show
def test_declared_reads_bitwise_bounded_and_inapplicable_from_the_contracts():
    from falsify.harness.audit import declared

    gemm = runtime.contract("gemm-kernel-v1")
    assert declared(gemm, "batch_invariance") == {"bitwise": ["triton"],
                                                  "bounded": ["reference", "torch"]}
    assert declared(gemm, "determinism") == {"bitwise": ["reference", "torch", "triton"],
                                             "bounded": []}
    loop = runtime.contract("train-loop-v1")
    assert "whole batch" in declared(loop, "batch_invariance")["inapplicable"]


def test_audit_warns_of_a_kernel_contract_silent_on_the_invariance_kinds(tmp_path):
    from falsify.harness.audit import MATRIX_KINDS, audit_checks

    data = contract_dict({"f": {"reference": f"{FNS}:row_sums"}}, {"rows": ROWS},
                         [{"kind": "property", "input": "rows", "predicate": "np.isfinite(y)"}])
    data["metadata"]["kernel"] = "f"
    a = audit_checks(load(tmp_path, data))
    # every matrix kind (determinism, batch_invariance, dtypes, compile, ...): none runs here
    assert sorted(w.split(":")[0] for w in a.warnings) == sorted(MATRIX_KINDS)
    data["metadata"]["inapplicable"] = {k: "f is a pure numpy function here"
                                        for k in MATRIX_KINDS}
    a = audit_checks(load(tmp_path, data))
    assert not a.warnings
    assert "determinism: inapplicable — f is a pure numpy function here" in a.chain


def test_audit_matrix_shows_per_equation_and_backend_what_ran_and_what_passed():
    from falsify.harness.audit import matrix
    from falsify.harness.ledger import run_key
    from falsify.harness.plan import runs

    gemm = runtime.contract("gemm-kernel-v1")
    declared_only = {(r["equation"], r["backend"]): r["cells"] for r in matrix(gemm, None)}
    assert declared_only[("gemm", "triton")]["determinism"] == "declared"
    empty = {(r["equation"], r["backend"]): r["cells"]
             for r in matrix(gemm, {"runs": {}, "mutants": {}})}
    # every matrix kind the contract runs on gemm × triton has a cell, none run yet
    assert set(empty[("gemm", "triton")]) >= {"determinism", "batch_invariance", "dtypes",
                                              "device"}
    assert set(empty[("gemm", "triton")].values()) == {"not run"}
    # one passing entry per run of the triton determinism check, one failure for batch, the
    # device check skipped for want of a GPU (which reads "not run", never "passed")
    outcome = {"determinism": "passed", "batch_invariance": "failed", "device": "skipped"}
    ledger = {"runs": {}, "mutants": {}}
    for t in gemm.checks:
        if t.kind in outcome and equation_of(gemm, t) == "gemm":
            for r in runs(gemm, t):
                if r.backend == "triton":
                    e = dict(contract=gemm.id, check=t.id, backend="triton", variant=r.variant,
                             sha256=gemm.sha256, outcome=outcome[t.kind],
                             message="Skipped: needs a GPU: torch sees no CUDA device")
                    ledger["runs"][run_key(e)] = e
    cells = {(r["equation"], r["backend"]): r["cells"] for r in matrix(gemm, ledger)}
    assert cells[("gemm", "triton")] == {**empty[("gemm", "triton")], "determinism": "passed",
                                         "batch_invariance": "FAILED",
                                         "device": "not run: no GPU"}
    kd = runtime.contract("kd-loss-kernel-v1")
    assert [r["cells"] for r in matrix(kd, None) if r["equation"] == "*"] == [
        {"batch_invariance": "inapplicable: " + kd.inapplicable["batch_invariance"]}]
