"""Checks on the code-completion evaluation set in falsify/llm/evalset/code-problems.jsonl.

Every problem's reference solution must pass its own tests, and a trivially wrong body must
fail them, so a pass@k measured on this set means something.
"""

import doctest
import json
import re
from importlib.resources import files

import pytest

KEYS = {"task_id", "prompt", "entry_point", "canonical_solution", "test"}
WRONG_BODY = "    return None\n"
DEF_LINE = re.compile(r"^def (\w+)\(", re.MULTILINE)


def _load():
    path = files("falsify.llm") / "evalset" / "code-problems.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


PROBLEMS = _load()
IDS = [p.get("task_id", f"line-{i}") for i, p in enumerate(PROBLEMS)]


def _program(problem, body):
    return (problem["prompt"] + body + "\n\n" + problem["test"] + "\n\n"
            + f"check({problem['entry_point']})\n")


def test_file_shape():
    assert len(PROBLEMS) == 40
    assert IDS == [f"falsify/{i}" for i in range(len(PROBLEMS))]
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_problem_fields(problem):
    assert set(problem) == KEYS
    assert all(isinstance(problem[k], str) for k in KEYS)
    prompt = problem["prompt"]
    assert prompt.endswith("\n")
    assert DEF_LINE.findall(prompt) == [problem["entry_point"]]
    body = problem["canonical_solution"]
    assert body.strip() and body.endswith("\n")
    assert all(line.startswith("    ") for line in body.splitlines() if line.strip())
    assert re.search(r"^def check\(candidate\):", problem["test"], re.MULTILINE)
    assert 4 <= problem["test"].count("assert ") <= 8


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_canonical_solution_passes(problem):
    exec(_program(problem, problem["canonical_solution"]), {})


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_wrong_body_fails(problem):
    with pytest.raises(Exception):  # noqa: B017 - any failure (assert or otherwise) counts
        exec(_program(problem, WRONG_BODY), {})


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_docstring_examples_hold(problem):
    namespace = {}
    exec(problem["prompt"] + problem["canonical_solution"], namespace)
    func = namespace[problem["entry_point"]]
    test = doctest.DocTestParser().get_doctest(func.__doc__, namespace, problem["task_id"],
                                               None, 0)
    assert test.examples, "the docstring should show at least one example"
    report = []
    runner = doctest.DocTestRunner(verbose=False)
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
