"""Expressions written in contracts: predicates, relations, statistics and tolerances.

They are small numpy expressions (`np.abs(y.sum(-1) - 1) <= tol`). We parse them with `ast`,
refuse dunder access and statements, and evaluate with a fixed namespace, so a contract cannot
reach the file system or the interpreter's internals by accident.
"""

from __future__ import annotations

import ast
import math
from functools import lru_cache

import numpy as np


class ExprError(Exception):
    pass


def _relerr(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b) / np.maximum(np.abs(b), np.finfo(np.float64).tiny))


def _close(a, b, atol, rtol=0.0):
    """Elementwise |a-b| <= atol + rtol*|b|, NaN never close; returns a bool array."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):
        return same_inf | (np.abs(a - b) <= atol + rtol * np.abs(b))


SAFE_NAMES = {
    "np": np, "abs": abs, "min": min, "max": max, "len": len, "all": all, "any": any,
    "sum": sum, "float": float, "int": int, "range": range, "zip": zip, "sorted": sorted,
    "sqrt": math.sqrt, "log": math.log, "log2": math.log2, "exp": math.exp, "ceil": math.ceil,
    "floor": math.floor, "pi": math.pi, "inf": math.inf, "close": _close, "relerr": _relerr,
    "True": True, "False": False, "None": None,
}


@lru_cache(maxsize=4096)
def compile_expr(src: str):
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"syntax error in {src!r}: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise ExprError(f"{src!r}: attribute {node.attr!r} is not allowed")
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            raise ExprError(f"{src!r}: name {node.id!r} is not allowed")
        if isinstance(node, (ast.Lambda, ast.NamedExpr)):
            raise ExprError(f"{src!r}: lambdas and assignments are not allowed")
    return compile(tree, f"<contract expr {src!r}>", "eval")


def syntax_error(src: str) -> str | None:
    try:
        compile_expr(src)
    except ExprError as e:
        return str(e)
    return None


def evaluate(src, env: dict):
    if not isinstance(src, str):
        return src
    code = compile_expr(src)
    ns = dict(SAFE_NAMES)
    ns.update(env)
    try:
        # numpy's warning machinery imports lazily, so __import__ must exist; expressions
        # themselves cannot name it (dunder names are rejected in compile_expr).
        return eval(code, {"__builtins__": {"__import__": __import__}}, ns)  # noqa: S307
    except NameError as e:
        hint = ""
        if getattr(e, "name", None) == "eps":
            hint = (" (the input has an argument named `eps`, so a bare `eps` would be "
                    "ambiguous: write `eps_dtype` for the dtype's machine epsilon or "
                    "`args['eps']` for the argument)")
        raise ExprError(f"{src!r}: {e}{hint}") from None


EPS = {"float64": float(np.finfo(np.float64).eps), "float32": float(np.finfo(np.float32).eps),
       "float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0 ** -7}
# The machine epsilon of a named dtype, whatever dtype the case runs in: a float16 kernel that
# accumulates in float32 writes its tolerance as `eps + n * eps32`.
NAMED_EPS = {"eps64": EPS["float64"], "eps32": EPS["float32"], "eps16": EPS["float16"],
             "epsbf16": EPS["bfloat16"]}


# The smallest normal number of each dtype: below it values are subnormal (gradual underflow,
# absolute spacing tiny·eps) or flushed to zero (FTZ/DAZ on GPUs and some CPU modes), so an
# absolute error up to `tiny` there is the dtype's, not the kernel's.
NAMED_TINY = {"tiny64": 2.0 ** -1022, "tiny32": 2.0 ** -126, "tiny16": 2.0 ** -14,
              "tinybf16": 2.0 ** -126}


def eps_names(dtype: str) -> dict:
    """`eps` and `eps_dtype` (the case dtype's epsilon; float32's for integer cases), the
    named epsilons and the named smallest normals (`tiny32`, ...). Callers that also bind input
    arguments drop `eps` when one is named so."""
    e = EPS.get(dtype, EPS["float32"])
    return dict(NAMED_EPS, **NAMED_TINY, eps=e, eps_dtype=e)


# Names the harness binds in expressions. An input dim, argument, check param or `call:` key
# may not take one (it would hide it, or be hidden), except an argument or `call:` key named
# `eps`: kernels take one, so there the bare `eps` is withdrawn instead (see `eps_names`).
HARNESS_NAMES = frozenset(SAFE_NAMES) | frozenset(NAMED_EPS) | frozenset(NAMED_TINY) | {
    "eps", "eps_dtype", "dtype", "args", "y", "outs", "z", "zs", "y1", "y2", "outs1", "outs2",
    "x2", "tol", "rtol", "ref_max", "stats", "samples"}


def names_in(src: str) -> set[str]:
    """The bare names an expression reads (empty for a syntax error: reported elsewhere)."""
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def scalar_args(args: dict) -> dict:
    """The numeric scalar arguments (const or choices: a learning rate, a temperature) a
    tolerance may name, without names the harness binds (an argument `eps` would hide the
    dtype epsilon, so tolerances never see it)."""
    return {k: float(v) for k, v in args.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in HARNESS_NAMES}


def tolerance_value(val, dtype: str, dims: dict, ref_max: float = 1.0) -> float:
    """A tolerance number: a literal, or an expression in `eps`/`eps_dtype` (of the dtype),
    `eps64`/`eps32`/`eps16`/`epsbf16`, `tiny32`..., the case's dimension symbols, its scalar
    arguments (`scalar_args`) and `ref_max` (max |reference output|). An argument named `eps`
    is never seen, so `eps` is unambiguous."""
    if isinstance(val, (int, float)):
        return float(val)
    env = dict(dims)
    env.update(eps_names(dtype), ref_max=ref_max)
    try:
        out = evaluate(val, env)
    except ExprError:
        raise
    except Exception as e:
        raise ExprError(f"cannot evaluate {val!r}: {type(e).__name__}: {e}") from None
    try:
        return float(out)
    except (TypeError, ValueError):
        raise ExprError(f"{val!r} is not a number") from None
