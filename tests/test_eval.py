"""`falsify eval`: the unbiased pass@k estimator against its exact binomial form, the problem
file's refusals, the harness self-check, and the command end to end on a tiny model."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from falsify.llm import evaluate as EV
from tests.test_finetune import base_with_tokenizer


def _exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_unbiased_estimator(nck):
    n, c, k = nck
    got = EV.pass_at_k(n, c, k)
    want = float(_exact(n, c, k))
    # the product of ≤ n factors, each rounded once: ≤ (n + 1)·u relative to the product,
    # which is ≤ 1, so absolutely
    assert abs(got - want) <= (n + 1) * 2.0**-53 + 2.0**-53, (n, c, k, got, want)


def test_pass_at_k_anchors_and_a_biased_form_fails():
    assert EV.pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)  # c/n at k = 1
    assert EV.pass_at_k(10, 8, 5) == 1.0 and EV.pass_at_k(10, 0, 5) == 0.0
    # n where the binomials overflow a float64: the product form still works
    assert 0.0 < EV.pass_at_k(5000, 10, 100) < 1.0
    # the naive estimator 1 − (1 − c/n)^k is biased: the check above would catch it
    n, c, k = 10, 3, 5
    assert abs((1 - (1 - c / n) ** k) - float(_exact(n, c, k))) > 1e-2
    with pytest.raises(ValueError, match="need 0 <= c <= n"):
        EV.pass_at_k(3, 4, 1)


def test_truncate_keeps_the_body_only():
    assert EV.truncate("    return x\n\ndef g():\n    pass") == "    return x\n"
    assert EV.truncate("    a = 1\n    return a\nprint(1)") == "    a = 1\n    return a"
    assert EV.truncate("    return 1") == "    return 1"


def test_shipped_problems_load():
    ps = EV.load_problems()
    assert len(ps) == 40 and ps[0].task_id == "falsify/0"


@pytest.mark.parametrize("content, words", [
    (b'{"task_id": "a"}\n', ":1: a problem has exactly the keys"),
    (b'\n{"task_id": "a", "prompt": "p", "entry_point": "f", "canonical_solution": "b", '
     b'"test": "t"}\n{nope\n', ":3: not a JSON object"),
    (b'\xff\xfe', "not UTF-8"),
    (b'[' * 100_000 + b']' * 100_000 + b'\n', ":1: not a JSON object"),
    (b'{"task_id": "a", "prompt": "", "entry_point": "f", "canonical_solution": "b", '
     b'"test": "t"}\n', "prompt must be a non-empty string"),
    (b'', "no problems"),
])
def test_bad_problem_files_are_refused_naming_the_line(tmp_path, content, words):
    f = tmp_path / "p.jsonl"
    f.write_bytes(content)
    with pytest.raises(EV.EvalError) as e:
        EV.load_problems(f)
    assert str(f) in str(e.value) and words in str(e.value)


def test_the_scoring_path_scores_right_and_wrong_code(monkeypatch):
    """Sampling replaced by an oracle that answers the even problems correctly and the odd
    ones with `return None`: the sandbox and the estimator must give exactly 1/2."""
    from falsify.llm.sandbox import Limits

    ps = EV.load_problems()[:6]

    def oracle(model, tok, p, n, *a):
        right = int(p.task_id.split("/")[1]) % 2 == 0
        return [p.canonical_solution if right else "    return None\n"] * n, False

    monkeypatch.setattr(EV, "sample_completions", oracle)
    out = EV.evaluate_code(None, None, ps, 2, [1, 2], 8, 0.8, None, 0, Limits())
    assert out["pass_at_k"] == {"1": 0.5, "2": 0.5}
    assert [r["c"] for r in out["problems"]] == [2, 0, 2, 0, 2, 0]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return base_with_tokenizer(tmp_path_factory.mktemp("eval"))


def test_eval_cli_end_to_end(base, capsys):
    from falsify.cli import main

    rc = main(["eval", "--model", str(base), "--limit", "3", "--samples", "2", "--k", "1,2",
               "--max-new-tokens", "16", "--format", "json"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["harness"] == {"canonical_pass": 3, "wrong_pass": 0, "problems": 3}
    assert set(rep["pass_at_k"]) == {"1", "2"}
    assert all(0.0 <= v <= 1.0 for v in rep["pass_at_k"].values())
    assert math.isfinite(rep["perplexity"]["perplexity"]) and rep["perplexity"]["tokens"] > 100
    assert rep["containment"]["seccomp"] is True
    assert [len(r["statuses"]) for r in rep["per_problem"]] == [2, 2, 2]


def test_eval_stops_when_the_harness_cannot_tell_right_from_wrong(base, tmp_path, capsys):
    from falsify.cli import main

    p = EV.load_problems()[0]
    broken = dict(p.__dict__, canonical_solution="    return None\n")
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps(broken) + "\n")
    assert main(["eval", "--model", str(base), "--problems", str(f), "--samples", "1",
                 "--k", "1"]) == 1
    assert "harness self-check failed" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--k", "1,6"], "each k must be in 1..--samples"),
    (["--k", "x"], "comma-separated integers"),
    (["--samples", "3", "--k", "1", "--temperature", "0"], "draws the same greedy completion"),
    (["--problems", "/nonexistent/p.jsonl"], "no such file"),
])
def test_eval_refuses_bad_settings_in_one_line(base, argv, words, capsys):
    from falsify.cli import main

    assert main(["eval", "--model", str(base), *argv]) == 2
    out = capsys.readouterr()
    assert words in out.out + out.err and "Traceback" not in out.out + out.err
