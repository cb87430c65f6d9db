"""The false alarms fresh runs raised on correct code, each pinned at its exact failing case.

- lr-schedule FALSIFY-LRS-001: step 575 of T = 576 (W = 0, lr_max = 3e-4, lr_min = 0); the
  result is 7e-6·lr_max, its rounding error of lr_max's scale (the tolerance is 8·eps·lr_max).
- adamw FALSIFY-AW-007: v = 1.46e-41, a float32 subnormal, g = 0: β2·v rounds on the subnormal
  grid (2^-149 apart), 5e-5 relative; the predicate allows tiny32 absolute below the normals.
- kd-loss FALSIFY-KD-002 (and cross-entropy FALSIFY-CE-004): R = 1 with its only label
  ignored: L is NaN by definition, the gradient 0; the finite differences leave the undefined
  output out instead of producing a NaN tolerance.
- kd-loss FALSIFY-KD-017 (jvp, found by the clean-clone CI) and FALSIFY-KD-016 (gradgrad,
  found by fresh seeds): the same all-ignored row in forward mode and under double backward;
  its tangent and ∂S/∂dy are NaN, so undefined outputs are left out of both sides.
- grpo-loss FALSIFY-GRPO-006 (found by a fresh seed in `falsify bench self`): an fp16 logp whose
  ratio to old_logp lies 1e-6 from the clip boundary 1 − ε, closer than a finite-difference
  step: the central difference averages the two slopes and Richardson's widening does not
  cover a kink that close. The one-sided difference on the side without the kink does.
- rope FALSIFY-ROPE-001/003 (found by the thorough profile): subnormal inputs. A rounding that
  lands on the fp32 subnormal grid errs by up to 2^-150 absolutely, whatever the relative
  bound says; an fp16 output below 6.1e-5 by up to 2^-25.
The contracts also pin these cases as `examples:` (run by the generated tests on every backend).
"""

from __future__ import annotations

import numpy as np
import pytest

from falsify.harness import cases, runtime
from falsify.harness.kinds import gradient
from tests.test_check_semantics import contract_dict, first_case, load, run_check


def _lrs_case():
    return cases.Case("float64", {"n": 1, "W": 0, "T": 576},
                      dict(step=np.array([575]), lr_max=3.0e-4, lr_min=0.0), {}, 1)


def test_lrs_end_of_decay_is_within_the_derived_bound():
    c = _lrs_case()
    runtime.execute("lr-schedule-kernel-v1", "FALSIFY-LRS-001", "torch", "float64", c)
    # the case is the one that failed: the old bound 8·eps·ref_max is smaller than the error
    from falsify.kernels.torch.lr_schedule import lr_at_step
    from falsify.reference.lr_schedule import lr_at

    got, ref = lr_at_step(575, 0, 576, 3.0e-4, 0.0), float(lr_at(np.array([575]), 0, 576,
                                                                     3.0e-4, 0.0)[0])
    err = abs(got - ref)
    assert err > 8 * np.finfo(np.float64).eps * ref
    assert err <= 8 * np.finfo(np.float64).eps * 3.0e-4


def test_lrs_bound_still_catches_a_one_step_shift():
    from falsify.harness import backends

    with backends.overriding("lr-schedule-kernel-v1:lr_at.torch",
                             "tests.test_false_alarms:_shifted"):
        with pytest.raises(runtime.CheckFailed, match="arbiter"):
            runtime.execute("lr-schedule-kernel-v1", "FALSIFY-LRS-001", "torch", "float64",
                            _lrs_case())


def _shifted(step, warmup, total, lr_max, lr_min):
    """The schedule evaluated one step late: a real off-by-one."""
    from falsify.kernels.torch.lr_schedule import lr_at

    return lr_at(step - 1, warmup, total, lr_max, lr_min)


@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
@pytest.mark.parametrize("beta2", [0.999, 0.95])
def test_adamw_subnormal_v_is_in_the_domain(backend, beta2):
    v = np.array([[1.460012869980027e-41, 2.0 ** -149]], np.float32)
    c = cases.Case("float32", {"r": 1, "c": 2},
                   dict(param=np.array([[0.5, -0.5]], np.float32),
                        grad=np.zeros((1, 2), np.float32), m=np.zeros((1, 2), np.float32), v=v,
                        step=10, lr=0.001, beta1=0.9, beta2=beta2, eps=1.0e-8,
                        weight_decay=0.01), {}, 1)
    runtime.execute("adamw-kernel-v1", "FALSIFY-AW-007", backend, "float32", c)


def _all_ignored_kd(dtype):
    return cases.Case(dtype, {"R": 1, "V": 1},
                      dict(student_logits=np.zeros((1, 1), cases.NP_STORAGE[dtype]),
                           teacher_logits=np.full((1, 1), 0.5, cases.NP_STORAGE[dtype]),
                           labels=np.array([-1]), temperature=2.0, alpha=0.5, ignore_index=-1),
                      {}, 1)


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_kd_no_counted_token_has_zero_gradient(backend, dtype):
    runtime.execute("kd-loss-kernel-v1", "FALSIFY-KD-002", backend, dtype, _all_ignored_kd(dtype))


@pytest.mark.parametrize("check", ["FALSIFY-KD-016", "FALSIFY-KD-017"])
def test_kd_higher_derivatives_leave_an_undefined_loss_out(check):
    # jvp (KD-017): the clean-clone CI's derandomized example; gradgrad (KD-016): two fresh
    # seeds. The loss is NaN (0/0), its tangent and ∂S/∂dy NaN, the reference's 0: both kinds
    # compare only outputs defined at x, as the gradient kind does
    c = _all_ignored_kd("float32")
    c.dims["V"] = 2
    c.args["student_logits"] = np.array([[0.82177, -1.38128]], np.float32)
    c.args["teacher_logits"] = c.args["student_logits"].copy()
    runtime.execute("kd-loss-kernel-v1", check, "torch", "float32", c)


@pytest.mark.parametrize("backend", ["reference", "torch", "triton"])
def test_ce_mean_with_no_counted_token(backend):
    c = cases.Case("float32", {"T": 1, "V": 5},
                   dict(logits=np.linspace(-3, 3, 5, dtype=np.float32)[None],
                        labels=np.array([-1]), ignore_index=-1, reduction="mean", z_loss=0.0,
                        label_smoothing=0.1), {}, 1)
    runtime.execute("cross-entropy-kernel-v1", "FALSIFY-CE-004", backend, "float32", c)


def test_fd_demands_zero_gradient_for_an_undefined_output(tmp_path):
    """An output NaN at x passes no gradient: a backward that passes one still fails."""
    c, case = _fd_contract(tmp_path, "nan_mean", "nan_mean_backward_leaks", (0.5, 1.0))
    with pytest.raises(runtime.CheckFailed, match="central difference"):
        run_check(c, 0, "reference", "float32", case)
    c, case = _fd_contract(tmp_path, "nan_mean", "nan_mean_backward", (0.5, 1.0))
    run_check(c, 0, "reference", "float32", case)


def test_non_finite_finite_differences_are_an_error_not_a_verdict(tmp_path):
    # exp overflows within one step of x = 709.78 (h ≈ 4e-3): D(h) = inf
    c, case = _fd_contract(tmp_path, "exp", "exp_backward", (709.78, 709.78))
    case = first_case(c, 0, "float64")
    with pytest.raises(gradient.FiniteDifferenceError, match="not finite") as e:
        run_check(c, 0, "reference", "float64", case)
    assert not runtime.is_falsification(e.value)


def _fd_contract(tmp_path, fwd, bwd, values):
    inp = {"dtypes": ["float32", "float64"], "dims": {"m": [1, 4]},
           "args": {"x": {"shape": ["m"], "values": list(values)}},
           "examples": [{"m": 3}]}
    fns = {fwd: {"reference": f"tests.fixtures.alarm_fns:{fwd}"},
           "bwd": {"reference": f"tests.fixtures.alarm_fns:{bwd}"}}
    c = load(tmp_path, contract_dict(fns, {"rows": inp}, [
        {"kind": "gradient", "input": "rows", "equation": fwd, "wrt": ["x"], "backward": "bwd"}]))
    return c, first_case(c, 0, "float64" if fwd == "exp" else "float32")


def _rope_case(dtype, x, pos, c=None):
    return cases.Case(dtype, {"b": 1, "s": 1, "h": 1, "half": 1},
                      dict(x=np.array(x, cases.NP_STORAGE[dtype]).reshape(1, 1, 1, 2),
                           pos=np.array([pos]), theta=10000.0),
                      {} if c is None else {"c": c}, 0)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rope_smallest_subnormal_pair_is_within_the_derived_bound(backend):
    # y2 = x2·c + x1·s = 1.38·2^-149 exactly; fp32 rounds each product up to 2^-149: 2^-148
    runtime.execute("rope-kernel-v1", "FALSIFY-ROPE-001", backend, "float32",
                    _rope_case("float32", [1e-45, 1e-45], 1))


@pytest.mark.parametrize("dtype,x,c", [("float32", [5.588e-42, 0.0], 1),
                                       ("float16", [1e-5, 0.0], 72)])
def test_rope_relative_position_holds_on_subnormal_outputs(dtype, x, c):
    runtime.execute("rope-kernel-v1", "FALSIFY-ROPE-003", "torch", dtype,
                    _rope_case(dtype, x, 0, c))


def test_rope_subnormal_floor_still_catches_a_wrong_sign():
    """The absolute floor is 3·2^-150: a sign error on sin moves y by ~|x|, caught even here."""
    from falsify.harness import backends

    with backends.overriding("rope-kernel-v1:rope.torch", "tests.test_false_alarms:_rope_minus"):
        with pytest.raises(runtime.CheckFailed):
            runtime.execute("rope-kernel-v1", "FALSIFY-ROPE-001", "torch", "float32",
                            _rope_case("float32", [3e-40, 1e-40], 1))


def _rope_minus(x, pos, theta):
    from falsify.kernels.torch.rope import rope

    return rope(x, -pos, theta)


def _grpo_clip_boundary_case():
    """The falsifying example: logp[14] − old_logp = −0.22314453 in fp16, log(0.8) − 9.8e-7."""
    lp = [-2.303, -1.865, -2.816, -2.275, -0.838, -0.1534, -2.738, -3.64, -0.9346, -2.559,
          -0.1333, -0.6387, -1.072, -2.412, -0.7344]
    return cases.Case("float16", {"B": 1, "T": 15}, dict(
        logp=np.array([lp], np.float16), old_logp=np.full((1, 15), -0.511, np.float16),
        ref_logp=np.zeros((1, 15), np.float16), advantages=np.array([-1.0], np.float16),
        mask=np.ones((1, 15), np.int64), clip_eps=0.2, beta=0.04), {}, 0)


def test_grpo_clip_boundary_within_a_step_is_judged_on_the_kink_free_side():
    runtime.execute("grpo-loss-kernel-v1", "FALSIFY-GRPO-006", "reference", "float16",
                    _grpo_clip_boundary_case())


@pytest.mark.parametrize("bwd, passes", [
    ("floor_at_kink_backward", True),                # the slope of x's own side
    ("floor_at_kink_backward_other_side", False),    # the far side's slope: wrong at x
    ("floor_at_kink_backward_doubled", False)])      # a wrong formula
def test_a_kink_closer_than_a_step_passes_the_right_slope_only(tmp_path, bwd, passes):
    """x = 0.3 + 1e-6 sits 1e-6 above the kink of max(x, 0.3), closer than 3h/4 (h ≈ 6e-6):
    the central difference averages slopes 0 and 1 there; the one-sided difference above the
    kink is exact."""
    c, _ = _fd_contract(tmp_path, "floor_at_kink", bwd, (-1.0, 1.0))
    case = cases.Case("float64", {"m": 3},
                      {"x": np.array([0.3 + 1e-6, 0.9, -0.5])}, {}, 0)
    if passes:
        run_check(c, 0, "reference", "float64", case)
    else:
        with pytest.raises(runtime.CheckFailed):
            run_check(c, 0, "reference", "float64", case)
