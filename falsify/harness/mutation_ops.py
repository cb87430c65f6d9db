"""Mutation operators: small, plausible bugs made in one function's AST at a time.

Our own rather than mutmut's or cosmic-ray's: both rewrite the source file on disk (mutmut
copies the tree and edits files, cosmic-ray edits in place and restores) and drive a test
command of their own over the whole suite, so they can neither leave a user's files alone while
a run is killed mid-way nor pick, per mutated function, only the contract checks whose
fingerprint reaches it (falsify.harness.mutation_select). Here a mutant is a function's new
source text; falsify.harness.mutation_apply serves it through the import system.

A mutant is named by (module, qualified function name, operator, index): the index counts the
operator's sites in the function in `ast.walk` order, so the same source gives the same ids.
A mutation whose source prints the same as the original (a no-op) is not yielded.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                ast.Pow: ast.Mult}
_CMP_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
              ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_CASTS = {"detach", "contiguous", "float", "to"}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**",
           ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
           ast.NotEq: "!="}


@dataclass(frozen=True)
class Mutant:
    module: str
    function: str  # qualified: `f`, `Class.method`
    operator: str
    index: int
    description: str
    original: str  # the function's source as ast.unparse prints it
    source: str  # the mutated function's source, unindented

    @property
    def id(self) -> str:
        return f"{self.module}:{self.function}:{self.operator}:{self.index}"

    @property
    def top_level(self) -> str:
        """The module-level name the fingerprint knows: a method counts as its class."""
        return self.function.split(".")[0]


# An operator maps a node to its sites: (description, apply), where apply edits that node (in a
# private copy of the function) in place; an edit that removes or replaces a child is made
# through its parent, which holds the reference.
Edit = tuple[str, Callable[[ast.AST], None]]


def _binop(node: ast.AST) -> list[Edit]:
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP_SWAPS:
        new = _BINOP_SWAPS[type(node.op)]
        return [(f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}",
                 lambda n: setattr(n, "op", new()))]
    return []


def _compare(node: ast.AST) -> list[Edit]:
    if not isinstance(node, ast.Compare):
        return []
    out = []
    for i, op in enumerate(node.ops):
        if type(op) in _CMP_SWAPS:
            new = _CMP_SWAPS[type(op)]

            def apply(n, i=i, new=new):
                n.ops[i] = new()
            out.append((f"{_SYMBOL[type(op)]} -> {_SYMBOL[new]}", apply))
    return out


def _constant(node: ast.AST) -> list[Edit]:
    if not isinstance(node, ast.Constant):
        return []
    v = node.value
    if isinstance(v, bool):
        return [(f"{v} -> {not v}", lambda n: setattr(n, "value", not v))]
    if isinstance(v, int):  # off by one, both ways
        return [(f"{v} -> {v + d}", lambda n, d=d: setattr(n, "value", v + d)) for d in (1, -1)]
    if isinstance(v, float):
        # 1 % is far above any float rounding a correct tolerance allows, and 0.0 has no scale
        new = float(f"{v * 1.01:.12g}") if v else 1.0  # 1.515, not 1.5150000000000001
        return [(f"{v!r} -> {new!r}", lambda n: setattr(n, "value", new))]
    return []


def _negate(node: ast.AST) -> list[Edit]:
    if isinstance(node, (ast.If, ast.While, ast.IfExp)):
        kind = {ast.If: "if", ast.While: "while", ast.IfExp: "ternary"}[type(node)]
        return [(f"{kind} condition negated",
                 lambda n: setattr(n, "test", ast.UnaryOp(ast.Not(), n.test)))]
    return []


def _swap_args(node: ast.AST) -> list[Edit]:
    if not isinstance(node, ast.Call):
        return []
    out = []
    for i in range(len(node.args) - 1):
        if not any(isinstance(a, ast.Starred) for a in node.args[i:i + 2]):
            def apply(n, i=i):
                n.args[i], n.args[i + 1] = n.args[i + 1], n.args[i]
            out.append((f"arguments {i + 1} and {i + 2} of {ast.unparse(node.func)}() swapped",
                        apply))
    return out


def _cast_sites(parent: ast.AST) -> Iterator[tuple[str, Callable[[ast.AST], None]]]:
    """Calls `x.detach()`, `.contiguous()`, `.float()`, `.to(...)` among `parent`'s direct
    children, each replaced by `x` itself."""
    for field, value in ast.iter_fields(parent):
        many = isinstance(value, list)
        for k, child in enumerate(value if many else [value]):
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                    and child.func.attr in _CASTS:
                def apply(p, field=field, k=k, many=many):
                    old = getattr(p, field)[k] if many else getattr(p, field)
                    if many:
                        getattr(p, field)[k] = old.func.value
                    else:
                        setattr(p, field, old.func.value)
                yield f".{child.func.attr}() removed", apply


def _drop_statements(node: ast.AST) -> Iterator[Edit]:
    """In each statement list of `node`: a call statement removed (`.eval()`, `.train()`,
    `opt.zero_grad()` ...), a `with X:` replaced by its body (a dropped `torch.no_grad()`)."""
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(node, field, None)
        if not isinstance(stmts, list):
            continue
        for k, s in enumerate(stmts):
            if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
                def drop(p, field=field, k=k):
                    body = getattr(p, field)
                    body[k:k + 1] = [] if len(body) > 1 else [ast.Pass()]
                yield f"call `{ast.unparse(s)}` removed", drop
            elif isinstance(s, (ast.With, ast.AsyncWith)):
                def unwrap(p, field=field, k=k):
                    body = getattr(p, field)
                    body[k:k + 1] = body[k].body
                items = ", ".join(ast.unparse(i) for i in s.items)
                yield f"`with {items}:` replaced by its body", unwrap


def _decorators(node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        for k, d in enumerate(node.decorator_list):
            def drop(p, k=k):
                del p.decorator_list[k]
            yield f"decorator @{ast.unparse(d)} removed", drop


OPERATORS: dict[str, Callable[[ast.AST], object]] = {
    "arith": _binop, "compare": _compare, "constant": _constant, "negate": _negate,
    "swap-args": _swap_args, "drop-cast": _cast_sites, "drop-statement": _drop_statements,
    "drop-decorator": _decorators,
}


def _docstring_ids(fn: ast.AST) -> set[int]:
    """Constants that are docstrings: text, never mutated, but skipped explicitly."""
    return {id(n.body[0].value) for n in ast.walk(fn)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}


def mutate_function(module: str, qualname: str, fn: ast.AST) -> Iterator[Mutant]:
    """Every mutant of the function (or method) node `fn`."""
    original = ast.unparse(fn)
    docstrings = _docstring_ids(fn)
    for op, sites in OPERATORS.items():
        index = 0
        for pos, node in enumerate(ast.walk(fn)):
            if id(node) in docstrings:
                continue
            for description, apply in list(sites(node)):
                twin = copy.deepcopy(fn)
                apply(list(ast.walk(twin))[pos])
                source = ast.unparse(ast.fix_missing_locations(twin))
                if source != original:
                    yield Mutant(module, qualname, op, index, description, original, source)
                    index += 1


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of each module-level function and each method of a
    module-level class: what the fingerprint can say a check reaches. Of a name defined twice,
    the last definition, the one that runs (and one id per mutant)."""
    found: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.pop(node.name, None)
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.pop(f"{node.name}.{sub.name}", None)
                    found[f"{node.name}.{sub.name}"] = sub
    yield from found.items()


def mutants_of_source(module: str, source: str) -> Iterator[Mutant]:
    for qualname, fn in functions(ast.parse(source)):
        yield from mutate_function(module, qualname, fn)


def splice(module_source: str, mutant: Mutant) -> str:
    """The module's source with the mutant's function in place of the original (decorators
    included), at the original's indentation: what the import system serves for the module."""
    tree = ast.parse(module_source)
    node = dict(functions(tree))[mutant.function]
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    lines = module_source.splitlines(keepends=True)
    indent = lines[first - 1][:len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    body = "".join(indent + line + "\n" if line else "\n"
                   for line in mutant.source.splitlines())
    return "".join(lines[:first - 1]) + body + "".join(lines[node.end_lineno:])
