"""`text:` input arguments (falsify/harness/cases.py): drawn strings for tokenizers and other text
kernels, by hypothesis and by the seeded sampler alike; their validation (V031); and the
plumbing that carries a str result through the check kinds unchanged."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from falsify.harness import backends, cases
from falsify.harness.validate import validate

SPECIAL = ["<|endoftext|>", "<|fim_prefix|>"]


def spec(alphabet: str, **kw) -> dict:
    return {"text": {"alphabet": alphabet, **kw}}


def _check_text(s: str, alphabet: str, max_size: int, special=()):
    assert isinstance(s, str)
    s.encode("utf-8")  # strict: no surrogates
    rest = s
    for piece in special:
        rest = rest.replace(piece, "")
    # at most max_size drawn characters plus MAX_SPLICES pieces (a whitespace run: <= 6)
    assert len(rest) <= max_size + 6 * cases.MAX_SPLICES
    if alphabet == "ascii":
        assert all(ord(c) < 128 for c in s)
    if alphabet == "assigned":
        assert all(unicodedata.category(c) != "Cn" for c in s)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), alphabet=st.sampled_from(cases.TEXT_ALPHABETS))
def test_hypothesis_text_stays_in_its_alphabet_and_size(data, alphabet):
    s = data.draw(cases.text_strategy(spec(alphabet, max_size=12, special=SPECIAL), "t"))
    _check_text(s, alphabet, 12, SPECIAL)


def test_seeded_sampler_stays_in_its_alphabet_size_and_reproduces():
    for alphabet in cases.TEXT_ALPHABETS:
        a = spec(alphabet, min_size=3, max_size=20, special=SPECIAL)
        for seed in range(200):
            s = cases.sample_text(a, np.random.default_rng(seed), "t")
            _check_text(s, alphabet, 20, SPECIAL)
            assert s == cases.sample_text(a, np.random.default_rng(seed), "t")


def test_both_paths_reach_the_edges_the_contracts_rely_on():
    """Special tokens (glued to text), astral-plane characters, NUL, combining marks and
    whitespace runs all turn up in a modest number of draws, on both paths."""
    a = spec("unicode", max_size=24, special=SPECIAL)
    sampled = [cases.sample_text(a, np.random.default_rng(i), "t") for i in range(300)]
    drawn = []

    @settings(max_examples=300, deadline=None, database=None)
    @given(s=cases.text_strategy(a, "t"))
    def collect(s):
        drawn.append(s)

    collect()
    for texts in (sampled, drawn):
        joined = "".join(texts)
        assert "<|endoftext|>" in joined and "<|fim_prefix|>" in joined
        assert any(ord(c) > 0xFFFF for c in joined)
        assert "\x00" in joined
        assert any(unicodedata.category(c) == "Mn" for c in joined)
        assert any(r in joined for r in ("  ", "\n\n", " \t", "\t ", "\r\n"))
        assert any(t.replace("<|endoftext|>", "") != t and t != "<|endoftext|>"
                   for t in texts)  # glued to other text


def test_cases_carry_text_arguments_unchanged():
    inp = {"dtypes": ["int64"], "args": {"text": spec("ascii", max_size=8),
                                          "n": {"choices": [3]}},
           "examples": [{"seed": 5}]}
    (case,) = cases.pinned_cases(inp, "int64")
    assert isinstance(case.args["text"], str) and case.args["n"] == 3
    assert backends.reference_args(case)["text"] == case.args["text"]
    assert backends.tensor_args(case, inp["args"])["text"] == case.args["text"]

    @settings(max_examples=10, deadline=None, database=None)
    @given(c=cases.case_strategy(inp, "int64"))
    def drawn(c):
        assert isinstance(c.args["text"], str)

    drawn()


def test_a_str_result_keeps_its_trailing_nul():
    """numpy's str arrays drop trailing NULs; a decoded text must arrive as it was (and is
    compared as `z.item()`: `z == s` converts s to a numpy str, losing them again)."""
    z = backends.to_numpy("ab\x00")
    assert z.dtype == object and z.ndim == 0
    assert z.item() == "ab\x00" and z.item() != "ab"


def test_bad_declarations_are_input_errors():
    import pytest

    with pytest.raises(cases.InputError, match="min_size 5 and max_size 2"):
        cases.sample_text(spec("ascii", min_size=5, max_size=2), np.random.default_rng(0), "t")


# ---------------------------------------------------------------------------- V031
BASE = Path(__file__).parent / "fixtures" / "valid" / "softmax-lite-v1.yaml"


def _findings(tmp_path, arg: str):
    text = BASE.read_text(encoding="utf-8").replace(
        "inputs:\n", "inputs:\n  words:\n    dtypes: [int64]\n    args:\n"
                     f"      s: {arg}\n", 1)
    p = tmp_path / "softmax-lite-v1.yaml"
    p.write_text(text, encoding="utf-8")
    return validate([p]).findings


def test_valid_text_argument_passes(tmp_path):
    assert _findings(tmp_path, "{text: {alphabet: assigned, max_size: 9, special: [ab]}}") == []


def test_v031_text_with_array_fields(tmp_path):
    fs = _findings(tmp_path, "{text: {alphabet: ascii}, shape: [3], values: [0, 1]}")
    assert [f.rule for f in fs] == ["V031"]
    assert "shape, values" in fs[0].message and "inputs.words.args.s" in fs[0].field


def test_v031_sizes_out_of_order(tmp_path):
    fs = _findings(tmp_path, "{text: {min_size: 70}}")
    assert [f.rule for f in fs] == ["V031"]
    assert "min_size 70 > max_size 64" in fs[0].message


def test_schema_rejects_an_unknown_alphabet(tmp_path):
    fs = _findings(tmp_path, "{text: {alphabet: latin1}}")
    assert [f.rule for f in fs] == ["V002"]
