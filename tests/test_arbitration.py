"""Arbitration: when a parity-style comparison fails, the failing element is re-run in high
precision and the failure says which side is off, in ulps of the implementation's dtype.

Planted bugs (tests/fixtures/arbiter_fns.py): an implementation 8 ulps off (the implementation
is blamed) and a float64 reference that cancels (the reference is blamed); a reference that
casts to float64 itself gets no verdict rather than a guessed one.
"""

from __future__ import annotations

import numpy as np
import pytest

from falsify.harness import arbiter, runtime
from tests.test_check_semantics import contract_dict, first_case, load, run_check

FNS = "tests.fixtures.arbiter_fns"


def _contract(tmp_path, ref: str, impl: str, values=(1.0e-10, 2.0e-10), kind="parity"):
    inp = {"dtypes": ["float32"], "dims": {"m": [1, 8]},
           "args": {"x": {"shape": ["m"], "values": list(values)}},
           "examples": [{"m": 8}]}
    fns = {"f": {"reference": f"{FNS}:{ref}", "torch": f"{FNS}:{impl}"},
           "f_backward": {"reference": f"{FNS}:log1p_backward"}}
    tol = {"why": "log1p is correctly rounded to a few ulps: 2 float32 ulps relative",
           "float32": {"atol": "tiny32", "rtol": "2 * eps"}}
    chk = {"kind": kind, "input": "rows", "equation": "f", "tolerance": tol}
    if kind == "gradient":
        chk.update(wrt=["x"], backward="f_backward", backends=["torch"])
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [chk]))
    return c, first_case(c, 0, "float32")


def _failure(c, case) -> runtime.CheckFailed:
    with pytest.raises(runtime.CheckFailed) as e:
        run_check(c, 0, "torch", "float32", case)
    return e.value


def test_an_implementation_off_by_8_ulps_is_blamed(tmp_path):
    c, case = _contract(tmp_path, "log1p_reference", "log1p_torch_off")
    e = _failure(c, case)
    first = str(e).splitlines()[0]  # the line the ledger keeps
    assert "the implementation is off by" in first and "ulps of float32" in first
    ev = e.evidence["arbiter"]
    assert ev["side"] == "implementation" and ev["method"].startswith("mpmath")
    # 2^-20 relative is 8·m ulps for a significand m ∈ [1, 2)
    assert 8 <= ev["impl_ulps"] <= 16.01 and ev["ref_ulps"] < 0.01
    assert "rtol = 2 * eps" in str(e) and "why:" in str(e)  # the derivation beside it


def test_a_reference_that_cancels_is_blamed(tmp_path):
    c, case = _contract(tmp_path, "log1p_reference_cancels", "log1p_torch")
    e = _failure(c, case)
    assert "the reference is off by" in str(e).splitlines()[0]
    assert "the contract's reference is wrong" in str(e)
    ev = e.evidence["arbiter"]
    assert ev["side"] == "reference" and ev["ref_ulps"] > 2 and ev["impl_ulps"] <= 1


def test_the_same_arbitration_runs_for_gradients(tmp_path):
    # d/dx of the 8-ulp-off forward is 8 ulps off too; the reference backward is exact
    c, case = _contract(tmp_path, "log1p_reference", "log1p_torch_off", kind="gradient")
    e = _failure(c, case)
    assert e.evidence["arbiter"]["side"] == "implementation"


def test_no_verdict_where_the_reference_casts_to_float64(tmp_path):
    c, case = _contract(tmp_path, "log1p_reference_downcasts", "log1p_torch_off")
    e = _failure(c, case)
    assert e.evidence["arbiter"]["side"] == "unknown"
    # the longdouble path is refused too: the reference returns float64
    assert "no high-precision arbiter for this equation" in str(e)


def test_longdouble_is_used_where_mpmath_cannot_run_the_reference():
    if not arbiter.LONGDOUBLE_REAL:
        pytest.skip("np.longdouble is float64 on this platform: only mpmath arbitrates")

    def ref(x):  # np.isfinite has no object loop: mpmath cannot run this reference
        assert np.isfinite(x).all()
        return np.log(1.0 + x)

    x = np.array([1.0e-10])
    v, method = arbiter.true_value(ref, {"x": x}, lambda outs: outs[0][0])
    assert method.startswith("np.longdouble")
    assert abs(float(v) - np.log1p(1.0e-10)) < 1e-6 * 1e-10  # 2^-64 rounding of 1 + x, not 2^-53


def test_ulp_of_each_dtype():
    assert arbiter.ulp(1.0, "float32") == 2.0 ** -23
    assert arbiter.ulp(1.5, "float16") == 2.0 ** -10
    assert arbiter.ulp(1.0, "bfloat16") == 2.0 ** -7
    assert arbiter.ulp(1e-45, "float32") == 2.0 ** -149  # subnormal spacing


@pytest.mark.parametrize("contract, check, method", [
    ("softmax-kernel-v1", "FALSIFY-SM-001", "mpmath"),
    ("cross-entropy-kernel-v1", "FALSIFY-CE-001", "mpmath"),
    ("swiglu-kernel-v1", "FALSIFY-SWG-001", "np.longdouble"),
])
def test_the_shipped_references_can_be_arbitrated(contract, check, method):
    """The references conformance failures are most often judged by keep the arbiter's wider
    values (falsify.reference.wide) instead of narrowing them to float64: a failed cell then
    says which side is off, in ulps. A reference that casts them back gets no verdict."""
    from pathlib import Path

    from falsify.harness import backends
    from falsify.harness.model import load_contract
    from falsify.harness.plan import equation_of

    c = load_contract(Path(__file__).resolve().parents[1] / "falsify" / "contracts"
                      / f"{contract}.yaml")[0]
    t = next(x for x in c.checks if x.id == check)
    case = runtime.examples(c, check, "float32")[0]
    fn = backends.function(c, equation_of(c, t), "reference")
    args = backends.reference_args(case)
    truth, how = arbiter.true_value(fn, args, lambda outs: np.asarray(outs[0]).reshape(-1)[0])
    assert how.startswith(method), how
    want = np.asarray(fn(**args)).reshape(-1)[0]
    assert abs(float(truth) - want) <= 1e-12 * max(1.0, abs(want))


def test_an_array_operand_is_broadcast_by_numpy_not_wrapped():
    import mpmath

    a = arbiter._to_hp(np.array([1.0, 2.0]))
    h = arbiter.HP(mpmath.mpf(3))
    for got in (h * a, a * h, h - a, h / a):
        assert isinstance(got, np.ndarray) and all(isinstance(v, arbiter.HP) for v in got)
    assert [v.v for v in h - a] == [2, 1]
