"""The layouts check kind: noncontiguous views of the inputs give the contiguous result and are
left untouched, and a size-0 dim follows the contract's rule (an empty result or a ValueError
naming it); V025 for a layouts check whose parity check or size-0 rules do not fit its input.
Three library mutants — a Triton wrapper that assumes stride(-1) = 1, a torch path that calls
.view where .reshape is needed, an early return of the wrong shape for m = 0 — pass every
earlier check of their equation and die only to this kind."""

from __future__ import annotations

import pytest

from falsify.harness import backends, runtime
from falsify.harness.kinds import layouts
from falsify.harness.plan import equation_of, runs
from tests.test_check_semantics import contract_dict, first_case, load, run_check

FNS = "tests.fixtures.layout_fns"
ROWS = {"dtypes": ["float32"], "dims": {"m": [1, 4], "n": [1, 6]},
        "args": {"x": {"shape": ["m", "n"], "values": [-1.0, 1.0]}},
        "examples": [{"m": 3, "n": 5}]}
PARITY = {"kind": "parity", "input": "rows",
          "tolerance": {"why": "a float32 sum of ≤ 6 terms of size ≤ 1",
                        "float32": {"atol": 1.0e-5}}}


def _contract(tmp_path, fn, zero_size=None, ref="reference", expect_errors=False, **extra):
    eqs = {"f": {"reference": f"{FNS}:{ref}", "torch": f"{FNS}:{fn}"}}
    lay = {"kind": "layouts", "input": "rows", "parity": "FALSIFY-FIX-001",
           "zero_size": zero_size or {"m": "empty", "n": "empty"}, **extra}
    return load(tmp_path, contract_dict(eqs, {"rows": ROWS}, [PARITY, lay]),
                expect_errors=expect_errors)


def _run(c, backend="torch"):
    return run_check(c, 1, backend, "float32", first_case(c, 1, "float32"))


def test_honest_backend_passes_every_layout_and_rule(tmp_path):
    c = _contract(tmp_path, "honest")
    assert _run(c) == {"zero_size": {"m": "empty", "n": "empty"},
                       "views": ["transposed", "strided", "expanded"], "leading": []}
    # the reference runs the size-0 rules only: views of a float64 array are not its subject
    assert _run(c, "reference") == {"zero_size": {"m": "empty", "n": "empty"}, "views": [],
                                    "leading": []}


def test_error_rule_passes_a_clear_refusal(tmp_path):
    c = _contract(tmp_path, "refuses_n0", {"m": "empty", "n": "error"}, ref="reference_refuses_n0")
    assert _run(c)["zero_size"] == {"m": "empty", "n": "error"}
    assert _run(c, "reference")["zero_size"] == {"m": "empty", "n": "error"}


@pytest.mark.parametrize("fn, zero_size, message", [
    ("unit_column_stride", None, "transposed views .*output 0"),
    ("clobbers_input", None, "wrote into its input"),
    ("crashes_on_zero", None, "m = 0 .*raised RuntimeError: grid of size 0"),
    ("wrong_shape_on_zero", None, r"m = 0 .*shape \(0, 0\) != reference \(0,\)"),
    ("honest", {"m": "empty", "n": "error"}, "n = 0 .*returned outputs .*instead of raising"),
    ("refuses_n0", {"m": "empty", "n": "empty"}, "n = 0 .*raised ValueError.*the contract says"),
    ("refuses_vaguely", {"m": "empty", "n": "error"}, "does not name the dim as 'n = 0'"),
])
def test_dishonest_backends_fail(tmp_path, fn, zero_size, message):
    c = _contract(tmp_path, fn, zero_size)
    with pytest.raises(runtime.CheckFailed, match=message):
        _run(c)


def test_leading_batch_axis_dropped_and_added(tmp_path):
    """`leading: [m]`: one row as a 1-D x and a batch with a leading axis of 1 must give the
    reference's result; a wrapper refusing any rank but 2, or one that flattens the batch and
    returns the wrong shape, fails; a reference that cannot take them is a contract error."""
    c = _contract(tmp_path, "honest", leading=["m"])
    assert _run(c)["leading"] == ["m dropped", "m unsqueezed"]
    assert _run(c, "reference")["leading"] == []  # the reference is the judge, not judged
    c = _contract(tmp_path, "rows_2d_only", leading=["m"])
    with pytest.raises(runtime.CheckFailed, match=r"m dropped .*raised ValueError.*\(m, n\)"):
        _run(c)
    c = _contract(tmp_path, "flattens_the_batch", leading=["m"])
    with pytest.raises(runtime.CheckFailed, match=r"m dropped .*shape \(1,\) != "
                                                  r"reference \(\)"):
        _run(c)
    c = _contract(tmp_path, "honest", ref="reference_2d_only", leading=["m"])
    with pytest.raises(ValueError, match="the reference cannot take the arguments with m "
                                         "dropped") as e:
        _run(c)
    assert not isinstance(e.value, runtime.CheckFailed)


def test_the_strided_view_alone_catches_a_unit_column_stride(tmp_path):
    c = _contract(tmp_path, "unit_column_stride", views=["strided"])
    with pytest.raises(runtime.CheckFailed, match=r"strided views \(x stride \(\d+, 2\)\)"):
        _run(c)
    ok = _contract(tmp_path, "unit_column_stride", views=["expanded"])
    assert _run(ok)["views"] == ["expanded"]  # stride 0 rows: the row stride alone is right


def test_a_stride_0_row_read_as_data_is_caught(tmp_path):
    # torch refuses the out-of-bounds view; a Triton kernel would read past the row instead
    c = _contract(tmp_path, "dense_rows", views=["expanded"])
    with pytest.raises(AssertionError, match="dense_rows raised RuntimeError") as e:
        _run(c)
    assert runtime.is_falsification(e.value)


def _double(tmp_path, fn, **extra):
    eqs = {"f": {"reference": f"{FNS}:double_reference", "torch": f"{FNS}:{fn}"}}
    lay = {"kind": "layouts", "input": "rows", "parity": "FALSIFY-FIX-001",
           "zero_size": {"m": "empty", "n": "empty"}, **extra}
    return load(tmp_path, contract_dict(eqs, {"rows": ROWS}, [PARITY, lay]))


def test_writes_are_in_place_results_that_must_land_in_the_view(tmp_path):
    with pytest.raises(runtime.CheckFailed, match="wrote into its input"):
        _run(_double(tmp_path, "double_in_place"))  # undeclared: a write is a finding
    ok = _double(tmp_path, "double_in_place", writes=["x"])
    assert _run(ok)["views"] == ["transposed", "strided"]  # never expanded
    bad = _double(tmp_path, "double_in_place_contiguously", writes=["x"], views=["strided"])
    with pytest.raises(runtime.CheckFailed, match="strided views: the backend wrote between"):
        _run(bad)
    spill = _double(tmp_path, "double_in_place_and_gaps", writes=["x"], views=["strided"])
    with pytest.raises(runtime.CheckFailed, match="wrote between the elements of x"):
        _run(spill)


def test_names_dim():
    assert layouts.names_dim("attention: Hq = 0 is not a multiple of Hkv = 0", "hkv")
    assert layouts.names_dim("rowsum: n=0", "n")
    assert not layouts.names_dim("n = 05", "n")
    assert not layouts.names_dim("kn = 0", "n")


def test_v025_parity_and_zero_size_must_fit_the_input(tmp_path):
    rep = _contract(tmp_path, "honest", {"m": "empty"}, expect_errors=True)
    assert any(f.rule == "V025" and "states no rule for n" in f.message for f in rep.errors)
    rep = _contract(tmp_path, "honest", {"m": "empty", "n": "empty", "k": "empty"},
                    expect_errors=True)
    assert any(f.rule == "V025" and "names k" in f.message for f in rep.errors)
    rep = _contract(tmp_path, "honest", parity="FALSIFY-FIX-002", expect_errors=True)
    assert any(f.rule == "V025" and "not a parity check" in f.message for f in rep.errors)
    rep = _contract(tmp_path, "honest", no_expand=["y"], expect_errors=True)
    assert any(f.rule == "V025" and "no_expand names 'y'" in f.message for f in rep.errors)
    for bad in ("n", "k"):  # n is x's last axis, k no dim at all
        rep = _contract(tmp_path, "honest", leading=[bad], expect_errors=True)
        assert any(f.rule == "V025" and f"leading names {bad!r}" in f.message
                   for f in rep.errors), bad


# ---------------------------------------------------------------- the library mutants
# mutant id -> (contract, the layouts check that kills it)
MUTANTS = {
    "MUT-SM-006": ("softmax-kernel-v1", "FALSIFY-SM-014"),
    "MUT-SM-007": ("softmax-kernel-v1", "FALSIFY-SM-014"),
    "MUT-SM-009": ("softmax-kernel-v1", "FALSIFY-SM-014"),
    "MUT-GELU-006": ("gelu-kernel-v1", "FALSIFY-GELU-025"),
}
# what the earlier checks run; the symbolic, static and training kinds never call the binding
EARLIER_KINDS = {"parity", "property", "metamorphic", "gradient", "determinism",
                 "batch_invariance", "dtypes"}


def _mutant(cid, mid):
    c = runtime.contract(cid)
    return c, next(m for m in c.mutants if m.id == mid)


@pytest.mark.parametrize("mid", sorted(MUTANTS))
def test_mutant_is_killed_by_the_layouts_check(mid):
    cid, check_id = MUTANTS[mid]
    r = runtime.kill_mutant(cid, mid)
    assert r.killed and r.killed_by.startswith(check_id + "/"), r


@pytest.mark.parametrize("mid", sorted(MUTANTS))
def test_mutant_passes_every_earlier_check_of_its_equation(mid):
    cid, _ = MUTANTS[mid]
    c, m = _mutant(cid, mid)
    earlier = [t for t in c.checks if t.spec and t.kind in EARLIER_KINDS
               and equation_of(c, t) == m.equation]
    assert any(t.kind == "parity" for t in earlier)
    ran = []
    with backends.overriding(f"{cid}:{m.equation}.{m.backend}", m.with_):
        for t in earlier:
            for r in runs(c, t):
                if r.backend == m.backend:
                    runtime.run_with_hypothesis(c, t.id, r.backend, r.variant)
                    ran.append(t.id)
    assert ran


def test_a_built_argument_is_expanded_along_its_leading_axis_only():
    """Packed blocks (an input with `build`) repeat whole rows, never their first byte along
    the row: for a GGUF q4_k row that made d = fp16(114, 114) ≈ 13,000, outputs of 1.6e7, and a
    false alarm against a bound derived for the builder's |W| < 2 (FALSIFY-GQ-031, n = 1)."""
    import numpy as np

    from falsify.harness import cases
    from falsify.harness.kinds.layouts import _expanded_case

    x = np.arange(6.0).reshape(2, 3)
    one = np.array([[114, 18, 7, 9]], dtype=np.uint8)
    rows = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.uint8)
    case = cases.Case("float32", {}, {"x": x, "one": one, "rows": rows}, {}, 0, "")
    got, axes = _expanded_case(case, ["x", "one", "rows"], built={"one", "rows"})
    assert axes == {"x": 0, "rows": 0}  # `one` has no leading axis to repeat: kept as it is
    assert (got.args["one"] == one).all()
    assert (got.args["rows"] == rows[:1]).all() and got.args["rows"].shape == rows.shape
    plain, axes = _expanded_case(case, ["one"])
    assert axes == {"one": 1} and (plain.args["one"] == 114).all()  # unbuilt: the first axis > 1
