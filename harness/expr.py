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
        raise ExprError(f"{src!r}: {e}") from None


EPS = {"float64": float(np.finfo(np.float64).eps), "float32": float(np.finfo(np.float32).eps),
       "float16": float(np.finfo(np.float16).eps), "bfloat16": 2.0 ** -7}


def tolerance_value(val, dtype: str, dims: dict, ref_max: float = 1.0) -> float:
    """A tolerance number: a literal, or an expression in `eps` (of the dtype), the case's
    dimension symbols and `ref_max` (max |reference output|)."""
    if isinstance(val, (int, float)):
        return float(val)
    env = dict(dims)
    env.update(eps=EPS.get(dtype, EPS["float32"]), ref_max=ref_max)
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
