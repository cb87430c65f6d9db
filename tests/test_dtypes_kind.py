"""The dtypes check kind: a backend accepts exactly the dtypes its contract declares and refuses
the rest clearly and before any work; V024 catches dtypes a contract lists but never runs; the
RMSNorm mutant that computes float64 in float32 dies only to this kind."""

from __future__ import annotations

import pytest

from falsify.harness import backends, runtime
from tests.test_check_semantics import contract_dict, load, run_check

FNS = "tests.fixtures.dtype_fns"
ROWS = {"dtypes": ["float32"], "dims": {"m": [1, 6]},
        "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}}, "examples": [{"m": 3}]}
PARITY = {"kind": "parity", "input": "rows"}


def _contract(tmp_path, fn, inputs=None, checks=None, **kw):
    eqs = {"f": {"reference": f"{FNS}:reference", "torch": f"{FNS}:{fn}"}}
    checks = checks or [PARITY, {"kind": "dtypes", "input": "rows"}]
    return load(tmp_path, contract_dict(eqs, inputs or {"rows": ROWS}, checks), **kw)


def test_honest_backend_refuses_every_undeclared_dtype(tmp_path):
    c = _contract(tmp_path, "honest")
    detail = run_check(c, 1, "torch", "undeclared")
    assert detail == {"declared": ["float32"], "gpu_only_not_run": [],
                      "refused": ["bfloat16", "float16", "float64", "int32", "int64"]}


@pytest.mark.parametrize("fn, message", [
    ("accepts_any", "accepted float64, which the contract does not declare on torch"),
    ("runtime_error", "raised RuntimeError: kernel launch failed — not a clear"),
    ("vague", "which does not name the dtype"),
    ("writes_then_refuses", "was refused only after writing into"),
])
def test_dishonest_backends_fail(tmp_path, fn, message):
    c = _contract(tmp_path, fn)
    with pytest.raises(runtime.CheckFailed, match=message):
        run_check(c, 1, "torch", "undeclared")


def test_declared_dtypes_are_not_probed(tmp_path):
    rows = dict(ROWS, dtypes=["float32", "float16", "float64", "bfloat16"])
    c = _contract(tmp_path, "floats_only", {"rows": rows})
    detail = run_check(c, 1, "torch", "undeclared")
    assert detail["declared"] == ["bfloat16", "float16", "float32", "float64"]
    assert detail["refused"] == ["int32", "int64"]


def test_an_input_no_dtype_reaches_is_a_contract_error(tmp_path):
    fixed = dict(ROWS, args={"x": {"shape": ["m"], "dtype": "float32", "values": [-1.0, 1.0]}})
    c = _contract(tmp_path, "honest", {"rows": fixed})
    with pytest.raises(ValueError, match="no argument of input 'rows' takes the case dtype") as e:
        run_check(c, 1, "torch", "undeclared")
    assert not runtime.is_falsification(e.value)


# ---------------------------------------------------------------- the RMSNorm mutant
RN = "rmsnorm-kernel-v1"
MUTANT = "MUT-RN-009"
EARLIER = ["FALSIFY-RN-001", "FALSIFY-RN-002", "FALSIFY-RN-004", "FALSIFY-RN-006",
           "FALSIFY-RN-008", "FALSIFY-RN-013", "FALSIFY-RN-014"]


def test_rmsnorm_float64_in_float32_mutant_is_killed_by_the_dtypes_check():
    r = runtime.kill_mutant(RN, MUTANT)
    assert r.killed and r.killed_by.startswith("FALSIFY-RN-015"), r
    assert "accepted float64" in r.message


def test_rmsnorm_float64_in_float32_mutant_passes_every_earlier_kind():
    c = runtime.contract(RN)
    m = next(m for m in c.mutants if m.id == MUTANT)
    with backends.overriding(f"{RN}:{m.equation}.{m.backend}", m.with_):
        for check_id in EARLIER:
            for variant in ("float32", "float16"):
                runtime.run_with_hypothesis(c, check_id, "torch", variant)


# ---------------------------------------------------------------- keeps_dtype (parity)
def _keeps_contract(tmp_path, fn, keeps, outputs=None, **kw):
    rows = dict(ROWS, dtypes=["float32", "float16"])
    data = contract_dict({"f": {"reference": f"{FNS}:reference", "torch": f"{FNS}:{fn}"}},
                         {"rows": rows}, [PARITY])
    data["equations"]["f"]["keeps_dtype"] = keeps
    if outputs:
        data["equations"]["f"]["outputs"] = outputs
    return load(tmp_path, data, **kw)


def test_keeps_dtype_fails_a_result_in_a_wider_dtype_that_values_cannot_tell(tmp_path):
    """float16 inputs: a float32 result is within every tolerance (it is more accurate), so
    only the declared dtype catches it; float32 inputs are unaffected."""
    from falsify.harness.cases import Case

    def case(dtype):
        import numpy as np
        return Case(dtype, {"m": 3}, {"x": np.array([0.5, -1.0, 0.25], dtype)}, {}, 0)

    run_check(_keeps_contract(tmp_path, "keeps", True), 0, "torch", "float16", case("float16"))
    c = _keeps_contract(tmp_path, "widens", True)
    run_check(c, 0, "torch", "float32", case("float32"))
    with pytest.raises(runtime.CheckFailed, match=r"output 0 has dtype torch.float32; the "
                                                  r"equation keeps the inputs' dtype "
                                                  r"\(torch.float16\)"):
        run_check(c, 0, "torch", "float16", case("float16"))
    # not declared: the same result passes (the rule is the contract's, not a default)
    run_check(_keeps_contract(tmp_path, "widens", False), 0, "torch", "float16",
              case("float16"))
    rep = _keeps_contract(tmp_path, "keeps", ["z"], outputs=["y"], expect_errors=True)
    assert any(f.rule == "V022" and "'z' is not one of the outputs" in f.message
               for f in rep.errors)
