"""The gradgrad and jvp check kinds: what they accept and what they refuse, on fixtures and
on the library's mutants, each of which passes every first-order check of its equation and
dies only to the new kind."""

from __future__ import annotations

import pytest

from falsify.harness import backends, runtime
from tests.test_check_semantics import contract_dict, first_case, load, run_check

FNS = "tests.fixtures.higher_fns"
ROWS = {"dtypes": ["float32"], "dims": {"m": [2, 6]},
        "args": {"x": {"shape": ["m"], "values": [0.5, 2.0], "dense": True}},
        "examples": [{"m": 5}]}
TOL = {"why": "fixture: x³ in fp32, a few roundings", "float32": {"atol": "16 * eps * ref_max"}}


def _contract(tmp_path, fn, kind, **check):
    eqs = {"cube": {"reference": f"{FNS}:reference", "torch": f"{FNS}:{fn}"},
           "cube_backward": {"reference": f"{FNS}:reference_backward"}}
    spec = {"kind": kind, "input": "rows", "equation": "cube", "wrt": ["x"],
            "backward": "cube_backward", **check}
    if "expect" not in check:
        spec.setdefault("tolerance", TOL)
    return load(tmp_path, contract_dict(eqs, {"rows": ROWS}, [spec]))


def _run(c):
    return run_check(c, 0, "torch", "float32", first_case(c, 0, "float32"))


# ---------------------------------------------------------------- gradgrad on fixtures
def test_gradgrad_passes_a_right_double_backward(tmp_path):
    detail = _run(_contract(tmp_path, "plain", "gradgrad"))
    assert detail["second_order"] == "values" and detail["worst_ratio_to_bound"] < 1


def test_gradgrad_fails_a_backward_on_detached_values(tmp_path):
    with pytest.raises(runtime.CheckFailed, match=r"∂S/∂x\(\d+,\).*double backward 0\.0"):
        _run(_contract(tmp_path, "detached", "gradgrad"))


def test_gradgrad_fails_a_backward_with_no_graph_in_either_mode(tmp_path):
    for check in ({}, {"expect": {"error": "once_differentiable"}}):
        with pytest.raises(runtime.CheckFailed, match="carry no autograd graph"):
            _run(_contract(tmp_path, "no_graph", "gradgrad", **check))


def test_torchs_once_differentiable_is_silent_under_autograd_grad(tmp_path):
    """torch's error node hangs off detached aliases: autograd.grad(inputs=[x, dy]) never
    reaches it and returns None, so the declared refusal is not what happens."""
    c = _contract(tmp_path, "torch_once", "gradgrad",
                  expect={"error": "once_differentiable"})
    with pytest.raises(runtime.CheckFailed, match="returned values"):
        _run(c)


def test_our_once_differentiable_refuses_on_the_path(tmp_path):
    c = _contract(tmp_path, "our_once", "gradgrad", expect={"error": "once_differentiable"})
    assert "cube (fixture)" in _run(c)["refused"]


def test_an_error_that_does_not_match_fails(tmp_path):
    c = _contract(tmp_path, "our_once", "gradgrad", expect={"error": "not implemented"})
    with pytest.raises(runtime.CheckFailed, match="not the declared error"):
        _run(c)


def test_expecting_an_error_from_a_working_backend_fails(tmp_path):
    c = _contract(tmp_path, "plain", "gradgrad", expect={"error": "once_differentiable"})
    with pytest.raises(runtime.CheckFailed, match="returned values"):
        _run(c)


# ---------------------------------------------------------------- jvp on fixtures
def test_jvp_passes_forward_mode_through_autograd_ops(tmp_path):
    detail = _run(_contract(tmp_path, "plain", "jvp"))
    assert detail["identity_gap"] <= detail["bound"]


def test_jvp_fails_a_wrong_jvp_staticmethod(tmp_path):
    with pytest.raises(runtime.CheckFailed, match="from torch.func.jvp on torch"):
        _run(_contract(tmp_path, "wrong_jvp", "jvp"))


def test_jvp_confirms_the_refusal_of_a_function_without_setup_context(tmp_path):
    c = _contract(tmp_path, "detached", "jvp", expect={"error": "setup_context"})
    assert "setup_context" in _run(c)["refused"]


def test_the_reference_backend_is_not_a_subject(tmp_path):
    c = _contract(tmp_path, "plain", "gradgrad")
    with pytest.raises(ValueError, match="oracle, not a subject"):
        run_check(c, 0, "reference", "float32", first_case(c, 0, "float32"))


# ---------------------------------------------------------------- the library's mutants
# (contract, mutant, the new check that must kill it, first-order checks it passes on torch)
MUTANTS = [
    ("rmsnorm-kernel-v1", "MUT-RN-010", "FALSIFY-RN-019",
     ["FALSIFY-RN-001", "FALSIFY-RN-002", "FALSIFY-RN-006"]),
    ("cross-entropy-kernel-v1", "MUT-CE-005", "FALSIFY-CE-025",
     ["FALSIFY-CE-001", "FALSIFY-CE-002", "FALSIFY-CE-003", "FALSIFY-CE-004",
      "FALSIFY-CE-006", "FALSIFY-CE-009"]),
    # the jvp mutant also passes the double backward of its form (reverse mode is exact)
    ("gelu-kernel-v1", "MUT-GELU-005", "FALSIFY-GELU-022",
     ["FALSIFY-GELU-001", "FALSIFY-GELU-003", "FALSIFY-GELU-005", "FALSIFY-GELU-006",
      "FALSIFY-GELU-019", "FALSIFY-GELU-020"]),
    ("attention-kernel-v1", "MUT-ATT-010", "FALSIFY-ATT-029",
     ["FALSIFY-ATT-003", "FALSIFY-ATT-018", "FALSIFY-ATT-020"]),
]


@pytest.mark.parametrize("cid, mutant, killer, survives", MUTANTS)
def test_mutant_dies_only_to_the_new_kind(cid, mutant, killer, survives):
    r = runtime.kill_mutant(cid, mutant)
    assert r.killed and r.killed_by.startswith(killer), r
    c = runtime.contract(cid)
    m = next(m for m in c.mutants if m.id == mutant)
    with backends.overriding(f"{cid}:{m.equation}.{m.backend}", m.with_):
        for check_id in survives:  # the equation's parity and gradient checks still pass
            runtime.run_with_hypothesis(c, check_id, "torch", "float32")
