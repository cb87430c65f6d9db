"""`build: module:function` on an array argument (falsify/harness/cases.py): the drawn array is
mapped
to a valid instance of a structured format, by hypothesis, by the seeded sampler and in pinned
examples alike; a function returning another shape or dtype is an input error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from falsify.harness import cases
from falsify.reference import gguf_quants as R

SPEC = {
    "dims": {"n": [1, 4], "nb": [1, 3]},
    "args": {"blocks": {"shape": ["n", "34 * nb"], "dtype": "uint8", "values": [0, 255],
                        "special": [255], "build": "falsify.reference.gguf_quants:bounded_q8_0"}},
    "examples": [{"n": 2, "nb": 2}],
}


def _finite_bounded(blocks: np.ndarray) -> bool:
    w = R.q8_0_dequantize(blocks)
    return bool(np.all(np.isfinite(w)) and np.all(np.abs(w) < R.W_BOUND))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_hypothesis_draws_are_built(data):
    case = data.draw(cases.case_strategy(SPEC, "float32"))
    b = case.args["blocks"]
    assert b.dtype == np.uint8 and b.shape == (case.dims["n"], 34 * case.dims["nb"])
    assert _finite_bounded(b)


def test_seeded_and_pinned_draws_are_built():
    rng = np.random.default_rng(0)
    for _ in range(20):
        assert _finite_bounded(cases.sample_case(SPEC, "float32", rng).args["blocks"])
    (pinned,) = cases.pinned_cases(SPEC, "float32")
    assert _finite_bounded(pinned.args["blocks"])


def test_unbuilt_draws_do_hit_non_finite_scales():
    """The builder is what keeps the scales finite: the same raw draws without it do not."""
    plain = {**SPEC, "args": {"blocks": {k: v for k, v in SPEC["args"]["blocks"].items()
                                         if k != "build"}}}
    rng = np.random.default_rng(0)
    draws = [cases.sample_case(plain, "float32", rng).args["blocks"] for _ in range(40)]
    assert not all(_finite_bounded(b) for b in draws)


def test_builder_with_wrong_result_is_an_input_error():
    bad = {**SPEC, "args": {"blocks": {**SPEC["args"]["blocks"],
                                       "build": "falsify.reference.gguf_quants:q8_0_dequantize"}}}
    with pytest.raises(cases.InputError, match="build: .* must return an array of the drawn"):
        cases.sample_case(bad, "float32", np.random.default_rng(0))
