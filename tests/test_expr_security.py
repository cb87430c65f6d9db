"""A contract is data: its expressions cannot reach files, processes or the interpreter.

Each known escape is refused twice: by `pv validate` (V033, from the parsed tree, nothing run)
and by the interpreter itself (ExprError before anything is called). A fuzz test draws
expressions from a small grammar of attribute chains and calls of arbitrary names and checks
that the interpreter either refuses them with an ExprError or evaluates them without touching
the file system.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falsify.harness import expr
from falsify.harness.validate import validate

BASE = Path(__file__).parent / "fixtures" / "valid" / "softmax-lite-v1.yaml"

ESCAPES = [
    "np.ctypeslib.load_library('libc.so.6', '/lib').system(b'x')",
    "np.savetxt('x', y)",
    "np.load('x', allow_pickle=True)",
    "().__class__.__bases__[0].__subclasses__()",
    "getattr(np, 'ctypeslib')",
    "'{0.__class__}'.format(y)",
    "(lambda: 1)()",
    "[i for i in y]",
    "(z := 1)",
    "__import__('os')",
    "np.fromfile",
    "np.memmap",
    "y.tofile('x')",
    "np.lib",
    "np.testing",
    "open('x')",
    "f'{y}'",
    "np.abs(y, out=y)",
    "np.abs(*y)",
    "y.__array__()",
    "np",
    "max",
]


def env():
    return {"y": np.array([0.25, 0.5]), "tol": 1e-6, "args": {"y": np.zeros(2)}}


@pytest.mark.parametrize("src", ESCAPES)
def test_escape_refused_at_evaluation(src, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(expr.ExprError):
        expr.evaluate(src, env())
    assert expr.refusal(src)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("src", ESCAPES)
def test_escape_refused_by_validate(src, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = BASE.read_text(encoding="utf-8")
    old = 'predicate: "(y >= 0) & (y <= 1)"'
    assert text.count(old) == 1
    quoted = src.replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace(old, f'predicate: "{quoted}"')
    p = tmp_path / "softmax-lite-v1.yaml"
    p.write_text(text, encoding="utf-8")
    findings = validate([p]).findings
    assert [f.rule for f in findings] == ["V033"], findings
    assert findings[0].line == text[:text.index(f'predicate: "{quoted}"')].count("\n") + 1
    assert [q.name for q in tmp_path.iterdir()] == [p.name]


def test_ctypeslib_escape_does_not_run(tmp_path, monkeypatch):
    """The issue's reproduction: before the allow-list this predicate ran a shell command."""
    monkeypatch.chdir(tmp_path)
    src = ("np.ctypeslib.load_library('libc.so.6', '/lib/x86_64-linux-gnu')"
           ".system(b'touch PWNED') * 0 + ((y >= 0) & (y <= 1))")
    with pytest.raises(expr.ExprError, match="ctypeslib"):
        expr.evaluate(src, env())
    assert not (tmp_path / "PWNED").exists()


def test_shipped_forms_still_evaluate():
    e = env()
    assert expr.evaluate("np.all(np.abs(y.sum(-1) - 1) <= 1 + tol)", e)
    assert expr.evaluate("0 < y[0] < y[1] <= 0.5", e)
    assert expr.evaluate("y.T.shape == (2,) and y.size == 2", e)
    assert expr.evaluate("np.maximum.reduceat(y, np.arange(0, 2, 1)).max() == 0.5", e)
    assert expr.evaluate("y.astype(np.float32).item(0) == 0.25 if tol else False", e)
    assert expr.evaluate("str(2) in 'a 2'.split() and 'aa'.count('a') == 2", e)
    assert expr.evaluate("args['y'][..., :1].sum() == 0 and {'a': [1]} == {'a': [1]}", e)
    # a receiver of the wrong type is refused when its value is known
    with pytest.raises(expr.ExprError, match="'count' of a tuple"):
        expr.evaluate("y.shape.count(2)", e)


def test_unbound_name_is_an_expr_error():
    with pytest.raises(expr.ExprError, match="'nope' is not defined"):
        expr.evaluate("nope + 1", env())


# ---------------------------------------------------------------------------- fuzz

NAMES = ["y", "np", "tol", "args", "open", "getattr", "eval", "exec", "os", "sys", "max", "abs",
         "__import__", "__builtins__", "str", "float", "type", "vars", "globals", "compile"]
ATTRS = ["sum", "max", "T", "shape", "astype", "ctypeslib", "load_library", "system", "savetxt",
         "load", "lib", "testing", "tofile", "fromfile", "memmap", "format", "__class__",
         "__bases__", "__subclasses__", "__globals__", "__dict__", "__init__", "item", "split",
         "count", "mro", "f_globals", "gi_frame", "os", "remove", "write", "open", "abs", "all"]
LITERALS = ["1", "0.5", "'x'", "b'x'", "()", "[]", "'{0.__class__}'", "'PWNED'", "None", "..."]


def _expressions():
    leaf = st.sampled_from(NAMES + LITERALS)

    def extend(inner):
        return st.one_of(
            st.builds(lambda e, a: f"{e}.{a}", inner, st.sampled_from(ATTRS)),
            st.builds(lambda e, args: f"{e}({', '.join(args)})", inner,
                      st.lists(inner, max_size=3)),
            st.builds(lambda e, k, v: f"{e}({k}={v})", inner,
                      st.sampled_from(["out", "allow_pickle", "key", "dtype"]), inner),
            st.builds(lambda a, op, b: f"({a} {op} {b})", inner,
                      st.sampled_from(["+", "*", "&", "<", "==", "and", "if 1 else"]), inner),
            st.builds(lambda e, i: f"{e}[{i}]", inner, inner),
            st.builds(lambda e: f"(lambda: {e})()", inner),
            st.builds(lambda e: f"[q for q in {e}]", inner),
            st.builds(lambda e: f"f'{{{e}}}'", inner),
        )

    return st.recursive(leaf, extend, max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(src=_expressions())
def test_fuzz_refuses_or_stays_inside(src, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("fuzz")
    before = os.getcwd()
    os.chdir(cwd)
    try:
        try:
            expr.evaluate(src, env())
        except expr.ExprError:
            pass
        except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError,
                AttributeError, OverflowError, MemoryError) as e:
            # the computation itself failed on values the table allows; it must not be a way
            # out of the tables: only statically accepted trees get this far
            assert expr.refusal(src) is None, (src, e)
        else:
            assert expr.refusal(src) is None, src
        assert list(cwd.iterdir()) == [], src
    finally:
        os.chdir(before)
