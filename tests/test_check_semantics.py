"""Semantics of check specs that the harness must honour, each on a tiny contract: names in
expressions (an argument named `eps` next to the dtype epsilon, the named epsilons, dims in
statistical predicates, harness names that may not be inputs), `call:` keys that replace input
arguments, `poison` on 0-d outputs, `special` integers, `{choices}` dims, the finite-difference
tolerance (wide enough for float64 rounding, tight enough for a slightly wrong backward), a
gradient check over several outputs (`outputs:`), and `falsify run` reporting only the
contracts it ran.

Each test builds its contract around tests/fixtures/harness_fns.py and runs the real check kind
in-process (or, for the CLI, the real `falsify` command), so they cost seconds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings

from falsify.harness import cases, expr, runtime
from falsify.harness.model import load_contract
from falsify.harness.validate import validate

ROOT = Path(__file__).resolve().parents[1]

FNS = "tests.fixtures.harness_fns"


def contract_dict(equations: dict, inputs: dict, checks: list[dict], cid="fix-kernel-v1"):
    """A native contract: one obligation per check, each check's equation explicit."""
    obligations, tests = [], []
    for i, chk in enumerate(checks):
        oid = f"FIX-{i + 1:03d}"
        obligations.append({"id": oid, "type": "invariant", "property": f"property {i}",
                            "applies_to": chk.get("equation", next(iter(equations)))})
        tests.append({"id": f"FALSIFY-FIX-{i + 1:03d}", "rule": f"rule {i}",
                      "prediction": "holds", "obligation": oid, "check": chk,
                      "if_fails": "the mechanism is broken"})
    return {"metadata": {"version": "1.0.0", "description": "harness fixture",
                         "references": ["tests/test_check_semantics.py"]},
            "equations": {k: {"formula": "f(x)", "bindings": v} for k, v in equations.items()},
            "inputs": inputs, "proof_obligations": obligations, "falsification_tests": tests}


def load(tmp_path, data: dict, cid="fix-kernel-v1", expect_errors=False):
    path = tmp_path / f"{cid}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    rep = validate([path])
    if not expect_errors:
        assert not rep.errors, "\n".join(map(str, rep.errors))
        c, _ = load_contract(path)
        return c
    return rep


def run_check(c, n: int, backend: str, variant: str, case=None):
    t = c.checks[n]
    ctx = runtime.Ctx(c, t, backend, variant)
    return runtime.kind_module(t.kind).run(ctx, case)


def first_case(c, n: int, variant: str):
    t = c.checks[n]
    return cases.pinned_cases(c.inputs[t.spec["input"]], variant, t.spec.get("params"))[0]


EPS_INPUT = {"dtypes": ["float32"], "dims": {"m": [1, 4]},
             "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]},
                      "eps": {"const": 0.25}},
             "examples": [{"m": 3}]}
ADD_EPS = {"add_eps": {"reference": f"{FNS}:add_eps", "torch": f"{FNS}:add_eps"}}


# ---------------------------------------------------------------- eps names
def test_eps_argument_and_dtype_epsilon_are_both_reachable(tmp_path):
    pred = ("close(y, x + args['eps'], 1e-6) & (args['eps'] == 0.25) & (eps_dtype == eps32) "
            "& (eps32 == 2.0 ** -23) & (eps16 == 2.0 ** -10) & (eps64 == 2.0 ** -52) "
            "& (epsbf16 == 2.0 ** -7)")
    c = load(tmp_path, contract_dict(ADD_EPS, {"rows": EPS_INPUT},
                                     [{"kind": "property", "input": "rows", "predicate": pred}]))
    run_check(c, 0, "torch", "float32", first_case(c, 0, "float32"))
    run_check(c, 0, "reference", "float32", first_case(c, 0, "float32"))


def test_bare_eps_is_rejected_where_an_argument_is_named_eps(tmp_path):
    data = contract_dict(ADD_EPS, {"rows": EPS_INPUT},
                         [{"kind": "property", "input": "rows", "predicate": "y >= x - eps"}])
    rep = load(tmp_path, data, expect_errors=True)
    msgs = [str(f) for f in rep.errors if f.rule == "V021"]
    assert msgs and "eps_dtype" in msgs[0] and "args['eps']" in msgs[0], rep.errors
    # and at run time (a contract loaded without validation) it is an error, not a guess
    c, _ = load_contract(tmp_path / "fix-kernel-v1.yaml")
    with pytest.raises(expr.ExprError, match="eps_dtype"):
        run_check(c, 0, "torch", "float32", first_case(c, 0, "float32"))


def test_bare_eps_still_means_the_dtype_epsilon_without_an_eps_argument(tmp_path):
    inp = {"dtypes": ["float16"], "dims": {"m": 3},
           "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}}, "examples": [{"m": 3}]}
    fns = {"cube": {"reference": f"{FNS}:cube", "torch": f"{FNS}:cube"}}
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [
        {"kind": "property", "input": "rows", "predicate": "(eps == 2.0 ** -10) & (tol == eps32)",
         "tolerance": {"why": "names", "float16": {"atol": "eps32"}}}]))
    run_check(c, 0, "torch", "float16", first_case(c, 0, "float16"))


@pytest.mark.parametrize("where, name", [("dims", "eps"), ("dims", "tol"), ("args", "y"),
                                         ("params", "eps32")])
def test_reserved_names_cannot_be_inputs(tmp_path, where, name):
    inp = {"dtypes": ["float32"], "dims": {"m": 3},
           "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}}, "examples": [{"m": 3}]}
    chk = {"kind": "property", "input": "rows", "predicate": "y == y"}
    if where == "dims":
        inp["dims"][name] = 2
    elif where == "args":
        inp["args"][name] = {"const": 1.0}
    else:
        chk = {"kind": "metamorphic", "input": "rows", "params": {name: [0.0, 1.0]},
               "transform": {"x": "x"}, "relation": "y1 == y2"}
    fns = {"cube": {"reference": f"{FNS}:cube", "torch": f"{FNS}:cube"}}
    rep = load(tmp_path, contract_dict(fns, {"rows": inp}, [chk]), expect_errors=True)
    assert any(f.rule == "V021" and repr(name) in str(f) for f in rep.errors), rep.errors


# ---------------------------------------------------------------- statistical sees dims
def test_statistical_predicate_sees_dims_params_and_sample_count(tmp_path):
    inp = {"dtypes": ["float32"], "dims": {"m": 5, "k": [1, 3]},
           "args": {"x": {"shape": ["m", "k"], "values": [-1.0, 1.0]}}}
    fns = {"cube": {"reference": f"{FNS}:cube", "torch": f"{FNS}:cube"}}
    chk = {"kind": "statistical", "input": "rows", "samples": 12,
           "statistic": "y.shape[1]",
           "predicate": "(m == 5) & np.all(stats == k) & (samples == 12) & (eps == eps32)"}
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [chk]))
    out = run_check(c, 0, "torch", "float32")
    assert out["samples"] == 12
    # and a predicate that misreads them fails: dims are really bound, not just defined
    chk["predicate"] = "np.all(stats == m)"
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [chk]))
    with pytest.raises(runtime.CheckFailed):
        run_check(c, 0, "torch", "float32")


# ---------------------------------------------------------------- call key = argument
def test_call_key_that_is_an_input_argument_overrides_it_on_every_backend(tmp_path):
    inp = {"dtypes": ["float32"], "dims": {"m": [1, 5]},
           "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}, "alpha": {"const": 1.0}},
           "examples": [{"m": 4}]}
    fns = {"scale": {"reference": f"{FNS}:scale", "torch": f"{FNS}:scale"},
           "scale_backward": {"reference": f"{FNS}:scale_backward"}}
    tol = {"why": "one rounding", "float32": {"atol": "eps", "rtol": "eps"}}
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [
        {"kind": "parity", "input": "rows", "equation": "scale", "call": {"alpha": "m + 0.5"},
         "tolerance": tol},
        {"kind": "gradient", "input": "rows", "equation": "scale", "wrt": ["x"],
         "backward": "scale_backward", "call": {"alpha": "m + 0.5"}, "tolerance": tol},
        {"kind": "property", "input": "rows", "equation": "scale", "call": {"alpha": "m + 0.5"},
         "predicate": "(alpha == m + 0.5) & close(y, x * (m + 0.5), tol, rtol)",
         "tolerance": tol}]))
    case = first_case(c, 0, "float32")
    run_check(c, 0, "torch", "float32", case)
    for backend in ("reference", "torch"):
        run_check(c, 1, backend, "float32", case)
        run_check(c, 2, backend, "float32", case)


def test_call_key_that_is_a_wrt_argument_is_rejected(tmp_path):
    inp = {"dtypes": ["float32"], "dims": {"m": 3},
           "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}, "alpha": {"const": 1.0}}}
    fns = {"scale": {"reference": f"{FNS}:scale", "torch": f"{FNS}:scale"},
           "scale_backward": {"reference": f"{FNS}:scale_backward"}}
    rep = load(tmp_path, contract_dict(fns, {"rows": inp}, [
        {"kind": "gradient", "input": "rows", "equation": "scale", "wrt": ["x"],
         "backward": "scale_backward", "call": {"x": "1.0"},
         "tolerance": {"why": "-", "float32": {"atol": "eps"}}}]), expect_errors=True)
    assert any(f.rule == "V018" and "wrt" in str(f) for f in rep.errors), rep.errors


# ---------------------------------------------------------------- poison, 0-d output
def _poison_contract(tmp_path, triton_fn):
    inp = {"dtypes": ["float32"], "dims": {"m": [1, 6]},
           "args": {"x": {"shape": ["m"], "values": [-1.0, 1.0]}}, "examples": [{"m": 5}]}
    fns = {"total": {"reference": f"{FNS}:total", "triton": f"{FNS}:{triton_fn}"}}
    return load(tmp_path, contract_dict(fns, {"rows": inp}, [
        {"kind": "parity", "input": "rows", "poison": True,
         "tolerance": {"why": "a sum of m terms", "float32": {"atol": "8 * eps"}}}]))


def test_poison_runs_on_a_scalar_output(tmp_path):
    c = _poison_contract(tmp_path, "total")
    run_check(c, 0, "triton", "float32", first_case(c, 0, "float32"))


def test_poison_catches_a_scalar_out_that_is_never_written(tmp_path):
    c = _poison_contract(tmp_path, "total_ignores_out")
    with pytest.raises(runtime.CheckFailed, match="output 0"):
        run_check(c, 0, "triton", "float32", first_case(c, 0, "float32"))


# ---------------------------------------------------------------- special integers
@pytest.mark.parametrize("shape", [["m"], None])
def test_special_values_are_drawn_for_integer_args(shape):
    arg = {"dtype": "int64", "values": [0, 9], "special": [-77, 12345]}
    if shape:
        arg["shape"] = shape
    spec = {"dims": {"m": [1, 4]}, "args": {"i": arg}}
    seen = set()

    # No deadline: what is drawn is under test, not how fast; a loaded machine is slow.
    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(case=cases.case_strategy(spec, "float32"))
    def collect(case):
        seen.update(np.asarray(case.args["i"]).ravel().tolist())

    collect()
    assert {-77, 12345} <= seen
    assert seen <= set(range(10)) | {-77, 12345}


# ---------------------------------------------------------------- {choices} dims
def test_choices_dims_draw_every_choice_and_nothing_else():
    choices = [3, 17, 64]
    spec = {"dims": {"n": {"choices": choices}, "m": 2},
            "args": {"x": {"shape": ["m", "n"], "values": [-1.0, 1.0]}}}
    seen = set()

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(case=cases.case_strategy(spec, "float32"))
    def collect(case):
        seen.add(case.dims["n"])
        assert case.args["x"].shape == (2, case.dims["n"])

    collect()
    assert seen == set(choices)
    # the seeded sampler (statistical checks, pinned examples) draws from the same set
    rng = np.random.default_rng(0)
    drawn = {cases.sample_case(spec, "float32", rng).dims["n"] for _ in range(60)}
    assert drawn == set(choices)


# ---------------------------------------------------------------- FD tolerance
def _fd_contract(tmp_path, fwd, bwd, values=(-2.0, 2.0)):
    inp = {"dtypes": ["float32"], "dims": {"m": [2, 64]},
           "args": {"x": {"shape": ["m"], "values": list(values)}},
           "examples": [{"m": 64}]}
    fns = {fwd: {"reference": f"{FNS}:{fwd}"}, "bwd": {"reference": f"{FNS}:{bwd}"}}
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [
        {"kind": "gradient", "input": "rows", "equation": fwd, "wrt": ["x"],
         "backward": "bwd"}]))
    return c, first_case(c, 0, "float32")


def test_fd_tolerance_includes_the_rounding_term(tmp_path):
    """f = x + 1e12 makes |L| ≈ 1e13: float64 rounding of L, not truncation, limits the
    central difference. The old fixed bound 1e-6·(1 + max|g|) rejected the correct backward."""
    from falsify.harness import backends
    from falsify.harness.kinds import gradient

    c, case = _fd_contract(tmp_path, "offset", "offset_backward")
    run_check(c, 0, "reference", "float32", case)
    # the case really is rounding-dominated: the old step and bound fail on some coordinate
    args = backends.reference_args(case)
    dy = gradient._upstream(args["x"].shape, case.seed, "float32")
    fwd = c.equations["offset"].bindings["reference"]
    fwd = backends.resolve(fwd)
    errs = [abs(gradient.central_difference(fwd, args, "x", (i,), 1e-6, dy) - dy[i])
            for i in range(args["x"].size)]
    assert max(errs) > 1e-6 * (1 + np.abs(dy).max())


def test_fd_still_catches_a_slightly_wrong_backward(tmp_path):
    # x³ on [−2, 2]: truncation ~h²·|dy|, rounding ~eps64·Σ|x³·dy|/h, both ≲ 1e-8, so a
    # backward that is off by one part in 10⁶ (|g| up to 12) is caught
    c, case = _fd_contract(tmp_path, "cube", "cube_backward_wrong")
    with pytest.raises(runtime.CheckFailed, match="central difference"):
        run_check(c, 0, "reference", "float32", case)
    c, case = _fd_contract(tmp_path, "cube", "cube_backward")
    run_check(c, 0, "reference", "float32", case)


def test_fd_directions_see_a_single_wrong_entry(tmp_path):
    """Off at one entry of 64: coordinate differences on 24 sampled entries see it with
    probability 24/64; every random direction touches it, so the check fails on every seed."""
    for seed in range(4):
        c, case = _fd_contract(tmp_path, "cube", "cube_backward_one_entry_wrong")
        case = dataclasses.replace(case, seed=seed)
        with pytest.raises(runtime.CheckFailed, match="central difference"):
            run_check(c, 0, "reference", "float32", case)


def test_fd_a_nan_gradient_where_the_function_is_smooth_fails(tmp_path):
    c, case = _fd_contract(tmp_path, "cube", "cube_backward_nan_entry")
    with pytest.raises(runtime.CheckFailed,
                       match=r"d/dx\(0,\): the reference backward gives .*nan.* is finite"):
        run_check(c, 0, "reference", "float32", case)


def test_fd_failure_names_the_coordinate_when_one_is_off(tmp_path):
    # every entry is off: the localizing coordinate differences name one of them
    c, case = _fd_contract(tmp_path, "cube", "cube_backward_wrong")
    with pytest.raises(runtime.CheckFailed, match=r"d/dx\(\d+,\): reference backward"):
        run_check(c, 0, "reference", "float32", case)


# ---------------------------------------------------------------- gradient over several outputs
def _pair_contract(tmp_path, bwd, torch_fn="pair", outputs=("y", "total"), expect_errors=False):
    """pair(x) = (x², Σx) with its outputs named; one gradient check over `outputs`."""
    inp = {"dtypes": ["float32"], "dims": {"m": [1, 16]},
           "args": {"x": {"shape": ["m"], "values": [-2.0, 2.0]}}, "examples": [{"m": 7}]}
    fns = {"pair": {"reference": f"{FNS}:pair", "torch": f"{FNS}:{torch_fn}"},
           "pair_backward": {"reference": f"{FNS}:{bwd}"}}
    chk = {"kind": "gradient", "input": "rows", "equation": "pair", "wrt": ["x"],
           "backward": "pair_backward",
           "tolerance": {"why": "two roundings of 2·x·dy, and Σx's gradient is exact",
                         "float32": {"atol": "4 * eps * ref_max"}}}
    if outputs is not None:
        chk["outputs"] = list(outputs)
    data = contract_dict(fns, {"rows": inp}, [chk])
    data["equations"]["pair"]["outputs"] = ["y", "total"]
    return load(tmp_path, data, expect_errors=expect_errors)


def test_gradient_outputs_must_be_outputs_of_the_equation(tmp_path):
    rep = _pair_contract(tmp_path, "pair_backward", outputs=["y", "totl"], expect_errors=True)
    assert [(f.rule, f.field) for f in rep.errors] == [
        ("V018", "falsification_tests[0].check.outputs[1]")], rep.errors
    assert "'totl' is not an output of equation 'pair' (declared: y, total)" in str(
        rep.errors[0])
    # an index past the declared names, and a name given twice
    rep = _pair_contract(tmp_path, "pair_backward", outputs=[0, 2], expect_errors=True)
    assert "index 2 is past the 2 outputs" in str(rep.errors), rep.errors
    rep = _pair_contract(tmp_path, "pair_backward", outputs=["total", 1], expect_errors=True)
    assert "names output 1 again" in str(rep.errors), rep.errors
    # the reference backward must accept the second output's upstream gradient, `dtotal`
    rep = _pair_contract(tmp_path, "pair_backward_without_dtotal", expect_errors=True)
    assert any(f.rule == "V018" and "takes no 'dtotal'" in f.message for f in rep.errors), \
        rep.errors


def test_gradient_over_two_outputs_catches_a_backward_that_drops_the_second(tmp_path):
    c = _pair_contract(tmp_path, "pair_backward")
    case = first_case(c, 0, "float32")
    for backend in ("reference", "torch"):
        run_check(c, 0, backend, "float32", case)
    # the reference backward drops dtotal: finite differences of x²·dy + Σx·dtotal disagree
    c = _pair_contract(tmp_path, "pair_backward_ignores_total")
    with pytest.raises(runtime.CheckFailed, match="central difference"):
        run_check(c, 0, "reference", "float32", case)
    # the implementation's backward drops it: autograd disagrees with the reference
    c = _pair_contract(tmp_path, "pair_backward", torch_fn="pair_torch_ignores_total")
    with pytest.raises(runtime.CheckFailed, match="d/dx"):
        run_check(c, 0, "torch", "float32", case)
    # ... which a check over the first output alone (the default) cannot see
    c = _pair_contract(tmp_path, "pair_backward", torch_fn="pair_torch_ignores_total",
                       outputs=None)
    run_check(c, 0, "torch", "float32", case)
    c = _pair_contract(tmp_path, "pair_backward_ignores_total", outputs=None)
    run_check(c, 0, "reference", "float32", case)


# ---------------------------------------------------------------- run reports only its own
def test_falsify_run_reports_only_the_contracts_it_ran(tmp_path):
    fns = {"add_eps": {"reference": f"{FNS}:add_eps", "torch": f"{FNS}:add_eps"}}
    data = contract_dict(fns, {}, [
        {"kind": "training", "run": f"{FNS}:intruder", "predicate": "r['ok']"}])
    cdir = tmp_path / "contracts"
    cdir.mkdir()
    path = cdir / "fix-kernel-v1.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    ledger = tmp_path / "l.json"
    # a temporary project whose own code includes the fixture functions (tests/)
    (tmp_path / "falsify.toml").write_text('generated = "gen"\nledger = "l.json"\n')
    (tmp_path / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    env = dict(os.environ, FALSIFY_QUIET="1", COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "falsify.cli", "run", str(path), "-n", "1",
                        "--no-mutants", "--format", "json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # the intruder really wrote into the ledger during the run ...
    assert "other-contract-v1|FALSIFY-OTHER-001|torch|float32" in json.loads(
        ledger.read_text())["runs"]
    # ... but this run reports only its own check
    assert "other-contract-v1" not in r.stdout + r.stderr
    entries = json.loads(r.stdout)["entries"]
    assert [e["contract"] for e in entries] == ["fix-kernel-v1"]
    assert entries[0]["outcome"] == "passed"


def test_fd_rounding_scale_covers_outputs_formed_by_cancellation():
    """KD loss at all-zero logits is exactly 0 (KL of equal distributions) yet is computed from
    O(1) intermediates: the rounding budget must not scale with |f| = 0 alone (a CI failure:
    reference backward 0.0 vs central difference -1.8e-12, tolerance 1.2e-12)."""
    import numpy as np

    from falsify.harness import runtime as rt
    from falsify.harness.cases import Case

    case = Case("float32", {"R": 1, "V": 5},
                {"student_logits": np.zeros((1, 5), np.float32),
                 "teacher_logits": np.zeros((1, 5), np.float32), "labels": np.array([0]),
                 "temperature": 2.0, "alpha": 1.0, "ignore_index": -1}, {}, 0, "zeros")
    rt.execute("kd-loss-kernel-v1", "FALSIFY-KD-002", "reference", "float32", case)


# ---------------------------------------------------------------- training evidence
def test_a_failed_training_predicate_shows_the_run_figures(tmp_path):
    """'predicate is false' alone leaves a GPU user with nothing to act on: the message names
    the scalar figures the run returned (lists and arrays stay out of it)."""
    fns = {"add_eps": {"reference": f"{FNS}:add_eps", "torch": f"{FNS}:add_eps"}}
    c = load(tmp_path, contract_dict(fns, {}, [
        {"kind": "training", "run": f"{FNS}:resume_run",
         "predicate": "r['bit_identical'] and r['max_abs_diff'] == 0.0"}]))
    with pytest.raises(runtime.CheckFailed) as e:
        run_check(c, 0, "torch", "float32")
    msg = str(e.value)
    assert "is false" in msg
    assert "bit_identical=False" in msg and "max_abs_diff=3.5e-07" in msg and "steps=5" in msg
    assert "curve" not in msg
