"""Expressions written in contracts: predicates, relations, statistics, transforms, `call:`
values, input shapes and tolerances.

A contract is data, and a contract from someone else's repository must not run that author's
code. So an expression is not handed to `eval`: it is parsed with `ast`, every node is checked
against an allow-list (`refusal`), and the checked tree is evaluated by walking it here
(`evaluate`). Allowed: literals, the names the check binds, arithmetic, bitwise, unary and
boolean operators, (chained) comparisons, conditional expressions, subscripts and slices,
tuples, lists and dicts, calls of the functions in `FUNCTIONS`, the constants in `CONSTANTS`,
and the methods and attributes in `METHODS` and `ATTRIBUTES` on values of the listed types.
Nothing else: no other attribute, no other call, no lambda, comprehension, walrus, f-string,
starred argument or keyword `out=` (which would write into the check's own arrays).
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


# The only callables an expression can reach, by the name it is written with. Each is pure: it
# reads its arguments and returns a value; none opens a file, imports, or takes a callable.
FUNCTIONS = {
    "abs": abs, "min": min, "max": max, "len": len, "all": all, "any": any, "sum": sum,
    "float": float, "int": int, "str": str, "range": range, "zip": zip, "sorted": sorted,
    "sqrt": math.sqrt, "log": math.log, "log2": math.log2, "exp": math.exp,
    "ceil": math.ceil, "floor": math.floor, "close": _close, "relerr": _relerr,
    "np.abs": np.abs, "np.all": np.all, "np.allclose": np.allclose, "np.any": np.any,
    "np.arange": np.arange, "np.argmax": np.argmax, "np.argmin": np.argmin,
    "np.argsort": np.argsort, "np.array": np.array, "np.array_equal": np.array_equal,
    "np.asarray": np.asarray, "np.clip": np.clip, "np.concatenate": np.concatenate,
    "np.cos": np.cos, "np.cumsum": np.cumsum, "np.diff": np.diff, "np.einsum": np.einsum,
    "np.exp": np.exp, "np.expm1": np.expm1, "np.float32": np.float32,
    "np.float64": np.float64, "np.floor": np.floor, "np.full_like": np.full_like,
    "np.int64": np.int64, "np.isclose": np.isclose, "np.isfinite": np.isfinite,
    "np.isinf": np.isinf, "np.isnan": np.isnan, "np.isposinf": np.isposinf, "np.log": np.log,
    "np.log1p": np.log1p, "np.max": np.max, "np.maximum": np.maximum,
    "np.maximum.reduceat": np.maximum.reduceat, "np.mean": np.mean, "np.min": np.min,
    "np.minimum": np.minimum, "np.ones": np.ones, "np.prod": np.prod, "np.repeat": np.repeat,
    "np.round": np.round, "np.sign": np.sign, "np.signbit": np.signbit, "np.sin": np.sin,
    "np.sqrt": np.sqrt, "np.std": np.std, "np.sum": np.sum, "np.tanh": np.tanh,
    "np.unique": np.unique, "np.var": np.var, "np.where": np.where, "np.zeros": np.zeros,
}
# Values an expression may name that the check does not bind (a binding of the same name wins
# for the bare ones, as before; V021 keeps contracts from declaring them).
CONSTANTS = {
    "pi": math.pi, "inf": math.inf, "np.pi": np.pi, "np.inf": np.inf, "np.nan": np.nan,
    "np.float16": np.float16, "np.float32": np.float32, "np.float64": np.float64,
    "np.int32": np.int32, "np.int64": np.int64, "np.bool_": np.bool_, "float": float,
    "int": int,
}
_ARRAY = (np.ndarray, np.generic)
# Methods, by the types of value they may be called on: the ones shipped contracts use.
METHODS = {
    "all": _ARRAY, "astype": _ARRAY, "item": _ARRAY, "max": _ARRAY, "mean": _ARRAY,
    "ravel": _ARRAY, "reshape": _ARRAY, "sum": _ARRAY, "count": (str,), "split": (str,),
}
# Attributes read without a call, by the types of value they may be read on.
ATTRIBUTES = {"T": _ARRAY, "shape": _ARRAY, "size": _ARRAY}

_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult,
        ast.LShift, ast.RShift, ast.BitOr, ast.BitXor, ast.BitAnd, ast.UAdd, ast.USub, ast.Not,
        ast.Invert, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
        ast.In, ast.NotIn, ast.Is, ast.IsNot)
_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp,
          ast.Compare, ast.IfExp, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Dict,
          ast.Call, ast.Attribute, ast.keyword) + _OPS
_LITERALS = (int, float, complex, str, bool, type(None), type(Ellipsis))


def _dotted(node) -> str | None:
    """`np.maximum.reduceat` for an attribute chain on a bare name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _refuse(src: str, node, why: str):
    text = ast.unparse(node) if hasattr(node, "lineno") else type(node).__name__
    where = f" (column {node.col_offset + 1})" if hasattr(node, "col_offset") else ""
    raise ExprError(f"{src!r}: {why}: `{text}`{where}")


def _check_call(src: str, node: ast.Call) -> list:
    """The parts of a call still to check; refuses a callee outside the tables."""
    f = node.func
    if any(isinstance(a, ast.Starred) for a in node.args):
        _refuse(src, node, "starred arguments are not allowed")
    for k in node.keywords:
        if k.arg is None or k.arg == "out" or k.arg.startswith("_"):
            _refuse(src, node, f"keyword {'**' if k.arg is None else k.arg!r} is not allowed")
    rest = list(node.args) + [k.value for k in node.keywords]
    name = _dotted(f)
    if isinstance(f, ast.Name) or (name and name.split(".")[0] == "np"):
        if name not in FUNCTIONS:
            _refuse(src, f, "not a function an expression may call (see expr.FUNCTIONS)")
        return rest
    if isinstance(f, ast.Attribute) and f.attr in METHODS:
        return [f.value, *rest]
    _refuse(src, f, "not a function or method an expression may call")
    return rest


def _check_node(src: str, node) -> list:
    """Refuses `node` if it leaves the allow-list; returns its children still to check."""
    if not isinstance(node, _NODES):
        _refuse(src, node, f"{type(node).__name__} is not allowed in an expression")
    if isinstance(node, ast.Constant) and not isinstance(node.value, _LITERALS):
        _refuse(src, node, f"a {type(node.value).__name__} literal is not allowed")
    if isinstance(node, ast.Name):
        if node.id.startswith("_"):
            _refuse(src, node, "names starting with '_' are not allowed")
        if node.id == "np" or (node.id in FUNCTIONS and node.id not in CONSTANTS):
            _refuse(src, node, "a module or function is not a value (call it)")
    if isinstance(node, ast.Call):
        return _check_call(src, node)
    if isinstance(node, ast.Attribute):
        name = _dotted(node)
        if name and name.split(".")[0] == "np":
            if name not in CONSTANTS:
                _refuse(src, node, "not a numpy constant an expression may name")
            return []
        if node.attr not in ATTRIBUTES:
            _refuse(src, node, f"attribute {node.attr!r} is not allowed")
        return [node.value]
    return list(ast.iter_child_nodes(node))


@lru_cache(maxsize=4096)
def compile_expr(src: str) -> ast.Expression:
    """The parsed and allow-list-checked tree of `src` (raises ExprError)."""
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"syntax error in {src!r}: {e.msg}") from None
    todo = [tree]
    while todo:
        todo.extend(_check_node(src, todo.pop()))
    return tree


def syntax_error(src: str) -> str | None:
    """Why `src` does not parse as an expression, or None (nothing is evaluated)."""
    try:
        ast.parse(src.strip(), mode="eval")
    except SyntaxError as e:
        return f"syntax error in {src!r}: {e.msg}"
    return None


def refusal(src: str) -> str | None:
    """Why `src` leaves the allow-list, or None; a syntax error is `syntax_error`'s to say."""
    if syntax_error(src):
        return None
    try:
        compile_expr(src)
    except ExprError as e:
        return str(e)
    return None


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
           ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
           ast.Pow: lambda a, b: a ** b, ast.MatMult: lambda a, b: a @ b,
           ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
           ast.BitOr: lambda a, b: a | b, ast.BitXor: lambda a, b: a ^ b,
           ast.BitAnd: lambda a, b: a & b}
_UNARY = {ast.UAdd: lambda a: +a, ast.USub: lambda a: -a, ast.Not: lambda a: not a,
          ast.Invert: lambda a: ~a}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b}


class _Walker:
    """Evaluates a tree `compile_expr` accepted. Attribute and method receivers are checked
    against their allowed types here, since only the value says what a name holds."""

    def __init__(self, src: str, env: dict):
        self.src, self.env = src, env

    def name(self, node: ast.Name):
        if node.id in self.env:
            return self.env[node.id]
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        hint = ""
        if node.id == "eps":
            hint = (" (the input has an argument named `eps`, so a bare `eps` would be "
                    "ambiguous: write `eps_dtype` for the dtype's machine epsilon or "
                    "`args['eps']` for the argument)")
        raise ExprError(f"{self.src!r}: name {node.id!r} is not defined{hint}")

    def member(self, node: ast.Attribute, table: dict):
        obj = self.ev(node.value)
        if not isinstance(obj, table[node.attr]):
            _refuse(self.src, node, f"{node.attr!r} of a {type(obj).__name__} is not allowed")
        return getattr(obj, node.attr)

    def call(self, node: ast.Call):
        name = _dotted(node.func)
        if name in FUNCTIONS and (isinstance(node.func, ast.Name) or name.startswith("np.")):
            fn = FUNCTIONS[name]
        else:
            fn = self.member(node.func, METHODS)
        args = [self.ev(a) for a in node.args]
        return fn(*args, **{k.arg: self.ev(k.value) for k in node.keywords})

    def compare(self, node: ast.Compare):
        left, last = self.ev(node.left), len(node.ops) - 1
        for i, (op, right_node) in enumerate(zip(node.ops, node.comparators)):
            right = self.ev(right_node)
            out = _COMPARE[type(op)](left, right)
            # as in Python, a < b < c is (a < b) and (b < c): only a link before the last is
            # tested for truth
            if i == last or not out:
                return out
            left = right
        return out

    def boolop(self, node: ast.BoolOp):
        for v in node.values:
            out = self.ev(v)
            if bool(out) == isinstance(node.op, ast.Or):
                return out
        return out

    def ev(self, node):  # noqa: C901, PLR0911 - one branch per node kind
        t = type(node)
        if t is ast.Constant:
            return node.value
        if t is ast.Name:
            return self.name(node)
        if t is ast.BinOp:
            return _BINOPS[type(node.op)](self.ev(node.left), self.ev(node.right))
        if t is ast.UnaryOp:
            return _UNARY[type(node.op)](self.ev(node.operand))
        if t is ast.Compare:
            return self.compare(node)
        if t is ast.BoolOp:
            return self.boolop(node)
        if t is ast.IfExp:
            return self.ev(node.body) if self.ev(node.test) else self.ev(node.orelse)
        if t is ast.Subscript:
            return self.ev(node.value)[self.ev(node.slice)]
        if t is ast.Slice:
            return slice(*(None if p is None else self.ev(p)
                           for p in (node.lower, node.upper, node.step)))
        if t is ast.Tuple:
            return tuple(self.ev(e) for e in node.elts)
        if t is ast.List:
            return [self.ev(e) for e in node.elts]
        if t is ast.Dict:
            return {self.ev(k): self.ev(v) for k, v in zip(node.keys, node.values)}
        if t is ast.Call:
            return self.call(node)
        if t is ast.Attribute:
            name = _dotted(node)
            if name in CONSTANTS and name.startswith("np."):
                return CONSTANTS[name]
            return self.member(node, ATTRIBUTES)
        _refuse(self.src, node, f"{t.__name__} is not allowed in an expression")
        return None


def evaluate(src, env: dict):
    """The value of the contract expression `src` with the check's names `env` bound. Raises
    ExprError for an expression outside the allow-list or a name nobody binds; an error of the
    computation itself (a shape mismatch) propagates as raised."""
    if not isinstance(src, str):
        return src
    tree = compile_expr(src)
    return _Walker(src, env).ev(tree.body)


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
HARNESS_NAMES = frozenset(k for k in (*FUNCTIONS, *CONSTANTS) if "." not in k) | {
    "np", "True", "False", "None"} | frozenset(NAMED_EPS) | frozenset(NAMED_TINY) | {
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
