"""Rewards for GRPO fine-tuning: the built-in unit-test reward and a user's `module:function`.

`builtin:unit_tests` scores a completion by the fraction of its problem's unit tests that pass
(a denser signal than pass/fail: a body right on half the inputs earns 0.5). The problem's
`check(candidate)` is rewritten (with `ast`, in this process, on the trusted problem text) so
that each top-level `assert` runs in its own try block and counts; the program — prompt,
completion, rewritten check — runs in the evaluation sandbox (falsify/llm/sandbox.py) and prints
the count after a per-run marker. A completion that does not define the function, loops past
the time limit or kills its interpreter scores 0. The completion runs in the same interpreter
as the counter, so a program written to forge the marker line could: this reward is for
problems and models that are not adversarial (the toy set, small models).

A user reward is `module:function` taking (prompt, completion, problem) and returning a finite
real number. What happens when it raises (or returns something else) is the config's
`reward_error`: by default the failures are counted and the run stops after the step with the
first one named; `score:X` substitutes X, still counting and reporting every failure. Its
module must lie in the project or the installed packages unless `--allow-any-import` is given
(`check_reward_origin`).
"""

from __future__ import annotations

import ast
import importlib
import math
import numbers
import secrets
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from falsify.harness import trust
from falsify.llm.evaluate import Problem, truncate
from falsify.llm.sandbox import Limits, run_python

BUILTIN = "builtin:unit_tests"
LIMITS = Limits(cpu_s=2, wall_s=5.0, memory_mb=256)
COUNT_NAME = "_falsify_passed"


class RewardConfigError(ValueError):
    """A reward setting that cannot work (unknown builtin, a module or function not found)."""


class RewardFailed(RuntimeError):
    """The reward function raised (or returned a non-number) and the config names no score."""


def parse_reward_error(value: str) -> float | None:
    """`error` -> None (stop the run); `score:X` -> X (a finite float). Raises ValueError."""
    if value == "error":
        return None
    if value.startswith("score:"):
        try:
            x = float(value[len("score:"):])
        except ValueError:
            raise ValueError("must be error or score:<number>, e.g. score:0") from None
        if not math.isfinite(x):
            raise ValueError("score:<number> must be finite")
        return x
    raise ValueError("must be error or score:<number>, e.g. score:0")


def instrument_check(test: str) -> tuple[str, int]:
    """(check source that returns how many of its top-level asserts passed, their count)."""
    tree = ast.parse(test)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"),
              None)
    if fn is None:
        raise ValueError("the test defines no check(candidate) function")
    body, n = [ast.parse(f"{COUNT_NAME} = 0").body[0]], 0
    for st in fn.body:
        if isinstance(st, ast.Assert):
            n += 1
            guard = ast.parse(f"try:\n    pass\nexcept Exception:\n    pass\n"
                              f"else:\n    {COUNT_NAME} += 1").body[0]
            guard.body = [st]
            body.append(guard)
        else:
            body.append(st)
    if n == 0:
        raise ValueError("check(candidate) has no top-level assert to count")
    body.append(ast.parse(f"return {COUNT_NAME}").body[0])
    fn.body = body
    return ast.unparse(ast.fix_missing_locations(tree)), n


@dataclass
class UnitTestReward:
    """Fraction of the problem's asserts that pass; deterministic, so results are cached by
    (task, body) and identical completions of a group run once."""

    limits: Limits = LIMITS
    workers: int = 2
    cache: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    def program(self, p: Problem, body: str, marker: str) -> str:
        if p.task_id not in self.checks:
            self.checks[p.task_id] = instrument_check(p.test)
        check, _ = self.checks[p.task_id]
        return (f"{p.prompt}{body}\n\n{check}\n\n"
                f"print({marker!r}, check({p.entry_point}))\n")

    def one(self, p: Problem, completion: str) -> float:
        body = truncate(completion)
        key = (p.task_id, body)
        if key not in self.cache:
            marker = "@@passed-" + secrets.token_hex(8)
            r = run_python(self.program(p, body, marker), self.limits)
            passed = 0
            last = r.stdout.rstrip("\n").rsplit("\n", 1)[-1]
            if r.passed and last.startswith(marker + " "):
                passed = int(last.split()[1])
            self.cache[key] = passed / self.checks[p.task_id][1]
        return self.cache[key]

    def score(self, problems: list[Problem], completions: list[str]) -> list[float]:
        with ThreadPoolExecutor(self.workers) as ex:
            return list(ex.map(self.one, problems, completions))


def check_reward_origin(spec: str, project_root: Path | None, allow_any: bool) -> None:
    """Refuse a `module:function` reward whose module lies outside the project and the
    installed packages (see falsify.harness.trust), before anything imports it."""
    mod = spec.partition(":")[0]
    if allow_any or spec.startswith("builtin:") or not mod:
        return
    where = trust.import_origin_error(mod, project_root)
    if where:
        raise RewardConfigError(f"config field reward={spec!r}: {where}")


def load_reward(spec: str) -> Callable | UnitTestReward:
    """The reward a config names: BUILTIN or an importable `module:function`."""
    if spec.startswith("builtin:"):
        if spec != BUILTIN:
            raise RewardConfigError(f"config field reward={spec!r}: the built-in reward is "
                                    f"{BUILTIN}")
        return UnitTestReward()
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise RewardConfigError(f"config field reward={spec!r}: must be {BUILTIN} or "
                                "module:function")
    try:
        m = importlib.import_module(mod)
    except ImportError as e:
        raise RewardConfigError(f"config field reward={spec!r}: cannot import {mod!r} "
                                f"({e})") from None
    fn = getattr(m, name, None)
    if not callable(fn):
        raise RewardConfigError(f"config field reward={spec!r}: {mod!r} has no function "
                                f"{name!r}")
    return fn


@dataclass
class Scored:
    rewards: list[float]
    errors: int = 0
    first_error: str | None = None
    failed: list[int] = field(default_factory=list)  # indices whose reward raised


def score_rewards(reward, problems: list[Problem], completions: list[str],
                  on_error: float | None) -> Scored:
    """Rewards of the completions (problems[i] is completion i's). A user function's failure
    (an exception, or a value that is not a finite real number) is counted and the first one
    kept; its reward is `on_error` when the config names a score, NaN otherwise (the loop then
    stops before any update uses it)."""
    if isinstance(reward, UnitTestReward):
        return Scored(reward.score(problems, completions))
    out = Scored([])
    for i, (p, c) in enumerate(zip(problems, completions, strict=True)):
        try:
            v = reward(p.prompt, c, p)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or \
                    not math.isfinite(float(v)):
                raise TypeError(f"returned {v!r}, not a finite number")
            out.rewards.append(float(v))
        except Exception as e:  # noqa: BLE001 - counted and reported, never dropped
            out.errors += 1
            out.failed.append(i)
            if out.first_error is None:
                out.first_error = f"{p.task_id}: {type(e).__name__}: {e}"
            out.rewards.append(math.nan if on_error is None else on_error)
    return out
