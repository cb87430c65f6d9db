"""Semantic validation. Every rule has a stable id; messages name file, line and field.

Errors (native mode):
  V001 file unreadable / YAML syntax / not a mapping
  V002 schema violation (type, required field, enum)
  V003 unknown key
  V004 duplicate YAML key
  V005 duplicate id within a contract
  V006 duplicate id across the repository
  V007 obligation without an id or without an executable check
  V008 check names a missing obligation
  V009 applies_to names a missing equation
  V010 depends_on names a missing contract
  V011 dependency cycle
  V012 binding does not resolve to a callable
  V013 binding outside the project's packages
  V014 tolerance not positive / not evaluable
  V015 tolerance missing for a dtype the check runs
  V016 qa_gate counts or check ids do not match
  V017 metadata.version is not semver
  V018 check spec incomplete or inconsistent
  V019 mutant names a missing obligation/binding
  V020 metadata.references is empty
  V021 a name clash in expressions: an input dim/argument, check param or `call:` key named
       like a harness name (`y`, `tol`, `eps32`, ...), or a bare `eps` where an argument is
       named `eps`
  V022 an equation's `non_differentiable` names an output it does not declare in `outputs`, or
       a gradient check differentiates one of them
  V023 `metadata.inapplicable` declares a check kind inapplicable that a check of the contract
       runs
  V024 a check runs in several dtypes, but nothing takes the case dtype (every argument of its
       input declares its own `dtype`, no `call:` reads `dtype`): the variants are one
       computation under several labels, dtypes the contract lists but nobody ran
  V025 a layouts check whose `parity` is not a parity check of the same equation and input, or
       whose `zero_size` leaves out a dim that sizes an array argument of its input (a range or
       fixed dim; `choices` dims are flags) or names one that does not, or whose `no_expand` or
       `writes` names no array argument
  V027 a gradgrad or jvp check whose mode is inconsistent: it names the reference backend (the
       float64 reference is the oracle), its `expect` holds anything but `error` or an `error`
       that is not a regular expression, it checks values without a `tolerance`, or it expects
       an error and declares a tolerance nobody applies
  V028 a gradgrad or jvp check whose oracle cannot run: its `backward` equation has no
       reference binding, or a `wrt` argument is not a floating tensor argument of its input
       (missing, an integer `dtype`, a `const`/`choices` scalar, or replaced by `call`)

  V029 a compile check without a bound (neither `parity` nor `tolerance`), or whose
       `parity`/`gradient` is not a parity/gradient check of the same equation on
       torch, lacks a tolerance for a dtype the compile check runs, or names dims or `wrt`
       arguments its input does not have (`specializes` too); or a compile check on a
       backend other than torch
  V030 an equation with a backward on torch (a gradient check runs it there) whose compile
       checks never name a `gradient`: forward compiled, backward not
  V031 a `text:` argument that cannot be drawn as declared: min_size > max_size, or combined
       with a field of another argument form (shape, values, const, ...), which would be
       ignored
  V032 a `build:` on an argument that is not a drawn array (no shape, or a const / choices /
       text argument), where it would be ignored
  V033 an expression (predicate, relation, statistic, transform, `call:` or roundtrip `args`
       value, tolerance, input shape, values or assume) that leaves the allow-list of
       falsify/harness/expr.py: an attribute, call or syntax outside its tables. Checked on
       the parsed tree; nothing is evaluated
  V034 a `metadata.fixtures` entry that is not a file inside the contract's directory (absolute,
       `..`, a link out of it, a directory, missing)
  V035 an equation variant's `pins` name an argument no input has, or a value no input's
       `choices`/`const` for it holds
Warnings (compat mode, where pv would have accepted the file): W101 derived id, W102 schema,
  W103 unknown key, W104 duplicate key, W105 test without an executable check, W106 no bindings,
  W107 obligation without an executable check, W108 no references, W109 dangling reference,
  W110 a line that is not valid YAML re-read as a string (`formula: |x| < eps`),
  W111 version not semver, W112 obligation tolerance 0 (pv's "exact").
W105 is also reported in native mode (a prose-only test counts for nothing, but is allowed).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from falsify.harness import case_spec, expr, graph
from falsify.harness.case_spec import pin_admitted, pin_domain
from falsify.harness.model import (
    BACKENDS,
    Contract,
    ContractError,
    Finding,
    discover,
    json_path,
    load_contract,
)
from falsify.harness.plan import (
    INPUT_KINDS,
    REQUIRED_FIELDS,
    equation_of,
    output_index,
    runs,
    upstream_name,
    variants_of,
)
from falsify.harness.project import find_project, id_space

DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "uint8", "bool")

SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
PROJECT_PACKAGES = ("falsify",)
GATE_COUNT = re.compile(r"\bAll\s+(\d+)\s+(?:falsification\s+)?tests?\b", re.I)


@dataclass
class Report:
    contracts: list[Contract] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]


class _Ctx:
    def __init__(self, c: Contract, out: list[Finding]):
        self.c, self.out = c, out

    def add(self, rule: str, path: tuple, fieldname: str, message: str, native_only=False,
            warn_rule: str | None = None):
        """Report a finding. In compat mode a native-only rule becomes a warning."""
        sev = "error"
        if self.c.mode == "compat" and native_only:
            sev, rule = "warning", warn_rule or rule
        self.out.append(Finding(rule, sev, str(self.c.path), self.c.line(*path), fieldname,
                                message))


def project_packages(root: Path | None) -> set[str]:
    """Top-level modules a binding may import without --allow-import: falsify's, and the
    packages and modules at the project root (its own code)."""
    names = set(PROJECT_PACKAGES)
    if root is not None and root.is_dir():
        names |= {p.stem if p.suffix == ".py" else p.name for p in root.iterdir()
                  if (p.suffix == ".py" and p.is_file()) or (p / "__init__.py").is_file()}
    return names


def resolve_binding(ref: str, allow_import: bool = False):
    """Import `module:function`. Returns (callable, None) or (None, (rule, message))."""
    if ":" not in ref:
        return None, ("V012", f"binding {ref!r} is not `module:function`")
    mod, fn = ref.split(":", 1)
    proj = find_project()
    root = proj.root if proj else None
    top = mod.split(".")[0]
    if not allow_import and top not in project_packages(root):
        where = f"falsify or the project at {root}" if root else "falsify (no project here)"
        return None, ("V013", f"binding {ref!r} imports outside the project's packages "
                              f"({where}); pass --allow-import to permit it")
    if root is not None and top != "falsify" and str(root) not in sys.path:
        sys.path.insert(0, str(root))  # the project's own modules, as pytest would see them
    try:
        module = importlib.import_module(mod)
    except (Exception, SystemExit) as e:  # any import failure is a finding, not a crash
        return None, ("V012", f"binding {ref!r}: cannot import {mod!r}: "
                              f"{type(e).__name__}: {e}")
    obj = getattr(module, fn, None)
    if obj is None:
        return None, ("V012", f"binding {ref!r}: module {mod!r} has no attribute {fn!r}")
    if not callable(obj):
        return None, ("V012", f"binding {ref!r}: {fn!r} is not callable")
    return obj, None


def _check_binding(ctx: _Ctx, ref: str, path: tuple, fieldname: str, allow_import: bool,
                   import_bindings: bool):
    if not import_bindings:
        return
    _, err = resolve_binding(ref, allow_import)
    if err:
        ctx.add(err[0], path, fieldname, err[1])


# Tolerances are arithmetic in eps, ref_max and the dims: refuse anything that could run
# unbounded (9**9**9, "a" * 10**10, np.zeros(10**12)) before evaluating it.
_TOL_CALLS = {"sqrt", "log", "log2", "exp", "ceil", "floor", "min", "max", "abs", "float",
              "int"}
_TOL_NP = {"sqrt", "log", "log2", "log10", "log1p", "exp", "ceil", "floor", "maximum",
           "minimum", "abs", "cbrt"}


@functools.cache  # a pure function of the text; a contract evaluates each tolerance many times
def tolerance_expr_error(src: str) -> str | None:
    """Why `src` is not an acceptable tolerance expression, or None."""
    import ast

    err = expr.syntax_error(src)
    if err:
        return err
    tree = ast.parse(src.strip(), mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            ok = (isinstance(f, ast.Name) and f.id in _TOL_CALLS) or (
                isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                and f.value.id == "np" and f.attr in _TOL_NP)
            if not ok or node.keywords:
                return f"{src!r}: only sqrt/log/log2/exp/ceil/floor/min/max/abs calls are allowed"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.LShift)):
            exp_ = node.right
            if any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Pow, ast.LShift))
                   for n in ast.walk(exp_)) or (
                    isinstance(exp_, ast.Constant) and isinstance(exp_.value, (int, float))
                    and abs(exp_.value) > 1024):
                return f"{src!r}: exponent too large or nested"
        elif isinstance(node, ast.Attribute) and not (
                isinstance(node.value, ast.Name) and node.value.id == "np"):
            return f"{src!r}: attribute access is not allowed in a tolerance"
        elif isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            return f"{src!r}: only numbers are allowed as constants"
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Subscript,
                               ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return f"{src!r}: a tolerance is a scalar expression"
    return None


def tolerance_envs(input_spec: dict | None) -> list[dict]:
    """Dimension values a tolerance is evaluated at: every pinned example, plus the smallest
    and the largest declared dims (a tolerance must hold over the whole range)."""
    def num(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    spec = input_spec if isinstance(input_spec, dict) else {}
    dims = spec.get("dims") if isinstance(spec.get("dims"), dict) else {}
    lo, hi = {}, {}
    for k, v in dims.items():
        choices = v.get("choices") if isinstance(v, dict) else v if isinstance(v, list) else [v]
        if isinstance(choices, list) and choices and all(num(c) for c in choices):
            lo[k], hi[k] = min(choices), max(choices)
    args = spec.get("args") if isinstance(spec.get("args"), dict) else {}
    for k, a in args.items():  # scalar arguments a tolerance may name (expr.scalar_args)
        vals = ([a["const"]] if "const" in a else a.get("choices")) if isinstance(a, dict) else 0
        if (isinstance(vals, list) and vals and all(num(c) for c in vals)
                and k not in expr.HARNESS_NAMES):
            lo[k], hi[k] = min(vals), max(vals)
    examples = spec.get("examples") if isinstance(spec.get("examples"), list) else []
    envs = [{**lo, **{k: v for k, v in ex.items() if num(v)}} for ex in examples
            if isinstance(ex, dict)]
    return envs + [lo, hi] if lo else envs or [{}]


def tolerance_number(val, dtype: str, env: dict, ref_max: float = 1.0) -> float:
    """A tolerance's value, refusing unbounded expressions (raises expr.ExprError)."""
    if isinstance(val, bool) or not isinstance(val, (int, float, str)):
        raise expr.ExprError(f"{val!r} is not a number or an expression")
    if isinstance(val, str):
        err = tolerance_expr_error(val)
        if err:
            raise expr.ExprError(err)
    return expr.tolerance_value(val, dtype, env, ref_max=ref_max)


def _tolerance(ctx: _Ctx, c: Contract, tol, path: tuple, dtypes: list[str], input_spec,
               evaluate: bool = True):
    if not isinstance(tol, dict):
        return
    for dt in dtypes:
        if dt in DTYPES and dt not in tol:
            ctx.add("V015", path, json_path(path),
                    f"no tolerance for dtype {dt!r} (the check runs on {', '.join(dtypes)})")
    if not evaluate:  # its dims are unknown (the input is missing): V018 says so already
        return
    envs = tolerance_envs(input_spec)
    for dt, spec in tol.items():
        if dt == "why" or not isinstance(spec, dict):
            continue
        for key in ("atol", "rtol"):
            if key not in spec:
                continue
            val = spec[key]
            p = path + (dt, key)
            if isinstance(val, str) and expr.refusal(val):
                continue  # V033 says so; refused expressions are never evaluated
            for env in envs:
                try:
                    num = tolerance_number(val, dt, env)
                except expr.ExprError as e:
                    ctx.add("V014", p, json_path(p), f"tolerance {val!r}: {e}")
                    break
                bad = not math.isfinite(num) or num < 0 or (key == "atol" and num == 0
                                                            and not spec.get("rtol"))
                if bad:
                    ctx.add("V014", p, json_path(p),
                            f"tolerance must be positive and finite, {val!r} gives {num!r}"
                            f" at {env or 'the declared dims'}")
                    break


def validate_contract(c: Contract, out: list[Finding], allow_import=False, import_bindings=True):
    ctx = _Ctx(c, out)
    _metadata_rules(ctx, c)
    _duplicate_ids(ctx, c)
    _obligation_rules(ctx, c)
    _binding_rules(ctx, c, allow_import, import_bindings)
    _input_names(ctx, c)
    _input_texts(ctx, c)
    _build_rules(ctx, c, allow_import, import_bindings)
    _check_rules(ctx, c, allow_import, import_bindings)
    _check_compile_backward(ctx, c)
    _mutant_rules(ctx, c, allow_import, import_bindings)
    _gate_rules(ctx, c)
    _check_expressions(ctx, c)


def _metadata_rules(ctx, c: Contract) -> None:
    # V017 semver, V020 references
    if c.version and not SEMVER.match(c.version):
        ctx.add("V017", ("metadata", "version"), "metadata.version",
                f"version {c.version!r} is not semver (MAJOR.MINOR.PATCH)", native_only=True,
                warn_rule="W111")
    if not c.references:
        ctx.add("V020", ("metadata", "references"), "metadata.references",
                "no references: every contract cites its source (paper, spec, library)",
                native_only=True, warn_rule="W108")
    _fixture_rules(ctx, c)
    # V023 a kind declared inapplicable must not also run
    for kind in c.inapplicable:
        ran = [t.id for t in c.checks if t.kind == kind]
        if ran:
            ctx.add("V023", ("metadata", "inapplicable", kind), f"metadata.inapplicable.{kind}",
                    f"{kind} is declared inapplicable, but {', '.join(ran)} run(s) it: keep "
                    "the checks or the declaration, not both")



def _fixture_rules(ctx, c: Contract) -> None:
    # V034 a fixture is a file inside the contract's directory: a contract is data, and the
    # fingerprint reads these bytes, so it may name nothing else on the machine
    home = c.path.parent.resolve()
    for i, name in enumerate(c.fixtures):
        where = f"metadata.fixtures[{i}]"
        p = Path(name)
        if p.is_absolute() or ".." in p.parts:
            why = "must be a relative path without '..'"
        elif not c.fixture_path(name).resolve().is_relative_to(home):
            why = "leads out of the contract's directory (a link)"
        elif not c.fixture_path(name).is_file():
            why = "is not a file" if c.fixture_path(name).exists() else "does not exist"
        else:
            continue
        ctx.add("V034", ("metadata", "fixtures", i), where,
                f"fixture {name!r} {why} (fixtures are files beside the contract: "
                f"{c.path.parent})")

def _duplicate_ids(ctx, c: Contract) -> None:
    # V005 duplicate ids within the contract
    seen: dict[str, tuple] = {}
    groups = [("proof_obligations", [(o.id, o.index) for o in c.obligations if not o.derived_id]),
              ("falsification_tests", [(t.id, t.index) for t in c.checks]),
              ("mutants", [(m.id, m.index) for m in c.mutants]),
              ("kani_harnesses", [(h.get("id"), i) for i, h in enumerate(c.kani_harnesses)])]
    for section, ids in groups:
        for ident, i in ids:
            if not ident:
                continue
            if ident in seen:
                ctx.add("V005", (section, i, "id"), f"{section}[{i}].id",
                        f"duplicate id {ident!r} (first used at line {c.line(*seen[ident])})")
            else:
                seen[ident] = (section, i, "id")


def _obligation_rules(ctx, c: Contract) -> None:
    # Obligations: ids, applies_to, executable checks
    for o in c.obligations:
        base = ("proof_obligations", o.index)
        if o.derived_id:
            ctx.add("V007", base, f"proof_obligations[{o.index}].id",
                    f"obligation has no id (derived {o.id!r})", native_only=True,
                    warn_rule="W101")
        for a in o.applies_to:
            if a not in c.equations and a not in ("all",):
                ctx.add("V009", base + ("applies_to",), f"proof_obligations[{o.index}].applies_to",
                        f"applies_to {a!r} is not an equation of this contract "
                        f"(equations: {', '.join(c.equations)})", native_only=True,
                        warn_rule="W109")
        tol = o.tolerance
        if isinstance(tol, (int, float)) and not isinstance(tol, bool) and not tol > 0:
            # pv writes `tolerance: 0` for "exact"; native tolerances live on checks
            ctx.add("V014", base + ("tolerance",), f"proof_obligations[{o.index}].tolerance",
                    f"tolerance must be positive, got {tol}",
                    native_only=tol == 0, warn_rule="W112")
        if not c.checks_for(o.id):
            ctx.add("V007", base, f"proof_obligations[{o.index}]",
                    f"obligation {o.id} has no executable check (a falsification test with "
                    "`obligation:` and a `check:` block)", native_only=True, warn_rule="W107")


def _binding_rules(ctx, c: Contract, allow_import, import_bindings) -> None:
    native = c.mode == "native"
    # Bindings
    has_binding = False
    for name, eq in c.equations.items():
        for j, o in enumerate(eq.keeps_dtype if isinstance(eq.keeps_dtype, list) else []):
            if o not in eq.outputs:
                ctx.add("V022", ("equations", name, "keeps_dtype", j),
                        f"equations.{name}.keeps_dtype[{j}]",
                        f"{o!r} is not one of the outputs equation {name!r} declares "
                        f"({', '.join(eq.outputs) or 'none: list them in outputs'})")
        for j, o in enumerate(eq.non_differentiable):
            if o not in eq.outputs:
                ctx.add("V022", ("equations", name, "non_differentiable", j),
                        f"equations.{name}.non_differentiable[{j}]",
                        f"{o!r} is not one of the outputs equation {name!r} declares "
                        f"({', '.join(eq.outputs) or 'none: list them in outputs'})")
        for backend, ref in eq.bindings.items():
            has_binding = True
            _check_binding(ctx, ref, ("equations", name, "bindings", backend),
                           f"equations.{name}.bindings.{backend}", allow_import, import_bindings)
        for vname, v in eq.variants.items():
            if v.reference:
                _check_binding(ctx, v.reference, ("equations", name, "variants", vname,
                                                  "reference"),
                               f"equations.{name}.variants.{vname}.reference", allow_import,
                               import_bindings)
            _variant_pin_rules(ctx, c, name, vname, v.pins)
    if not has_binding and not native:
        ctx.add("W106", ("equations",), "equations",
                "no bindings: nothing can be executed against this contract", native_only=True,
                warn_rule="W106")


def _variant_pin_rules(ctx, c: Contract, eq: str, vname: str, pins: dict) -> None:
    """V035: a variant pins an argument some input draws, to a value at least one input's
    domain holds (its `choices`, its `const`, or any value of a drawn scalar; never an array).
    An input whose domain excludes the value is outside the variant (its checks are not
    applicable to it); a value no input holds would leave the variant nothing to be judged by."""
    for arg, value in pins.items():
        path = ("equations", eq, "variants", vname, "pins", arg)
        field_ = f"equations.{eq}.variants.{vname}.pins.{arg}"
        specs = [(i, (spec.get("args") or {})[arg]) for i, spec in c.inputs.items()
                 if isinstance(spec, dict) and arg in (spec.get("args") or {})]
        if not specs:
            ctx.add("V035", path, field_, f"no input has an argument {arg!r} to pin")
        elif not any(pin_admitted(a, value) for _, a in specs):
            ctx.add("V035", path, field_,
                    f"{value!r} lies outside every input's {arg!r} (" + "; ".join(
                        f"inputs.{i}: {pin_domain(a)}" for i, a in specs)
                    + "): the variant would be judged by no check")


def _build_rules(ctx, c: Contract, allow_import, import_bindings) -> None:
    for iname, spec in c.inputs.items():  # `build:` functions import like bindings (V012)
        for n, a in ((spec.get("args") or {}) if isinstance(spec, dict) else {}).items():
            if not (isinstance(a, dict) and isinstance(a.get("build"), str)):
                continue
            path, field_ = ("inputs", iname, "args", n, "build"), f"inputs.{iname}.args.{n}.build"
            clash = [k for k in ("const", "choices", "text") if k in a]
            if "shape" not in a or clash:
                ctx.add("V032", path, field_,
                        f"argument {n!r}: `build` maps a drawn array, but this argument is "
                        + (f"a {clash[0]!r} value" if clash else "a drawn scalar (no shape)")
                        + ", so it would be ignored")
            _check_binding(ctx, a["build"], path, field_, allow_import, import_bindings)


def _check_rules(ctx, c: Contract, allow_import, import_bindings) -> None:
    obligation_ids = {o.id for o in c.obligations}
    # Checks
    for t in c.checks:
        base = ("falsification_tests", t.index)
        fname = f"falsification_tests[{t.index}]"
        if t.obligation and t.obligation not in obligation_ids:
            ctx.add("V008", base + ("obligation",), fname + ".obligation",
                    f"{t.id} names obligation {t.obligation!r}, which does not exist "
                    f"(known: {', '.join(sorted(obligation_ids)) or 'none'})")
        if not t.spec:
            # A prose-only test counts for nothing; say so without failing the file.
            ctx.out.append(Finding("W105", "warning", str(c.path), c.line(*base), fname,
                                   f"{t.id} has no `check:` block: it cannot run"))
            continue
        if not t.obligation:
            ctx.add("V008", base, fname, f"{t.id} has a check but names no obligation")
        _check_spec(ctx, c, t, base, fname, allow_import, import_bindings)


def _mutant_rules(ctx, c: Contract, allow_import, import_bindings) -> None:
    obligation_ids = {o.id for o in c.obligations}
    # Mutants
    for m in c.mutants:
        base = ("mutants", m.index)
        if m.obligation not in obligation_ids:
            ctx.add("V019", base + ("obligation",), f"mutants[{m.index}].obligation",
                    f"{m.id} names obligation {m.obligation!r}, which does not exist")
        eq = c.equations.get(m.equation)
        if not eq or m.backend not in eq.bindings:
            ctx.add("V019", base + ("replaces",), f"mutants[{m.index}].replaces",
                    f"{m.id} replaces {m.replaces!r}, which is not a binding of this contract")
        _check_binding(ctx, m.with_, base + ("with",), f"mutants[{m.index}].with", allow_import,
                       import_bindings)
        if m.obligation in obligation_ids and not any(
                m.backend in [r.backend for r in runs(c, t)] for t in c.checks_for(m.obligation)):
            ctx.add("V019", base, f"mutants[{m.index}]",
                    f"{m.id}: no check of {m.obligation} runs on backend {m.backend!r}, so "
                    "nothing could kill this mutant")


def _gate_rules(ctx, c: Contract) -> None:
    native = c.mode == "native"
    obligation_ids = {o.id for o in c.obligations}
    # Kani harnesses naming obligations (compat contracts use free strings)
    for i, h in enumerate(c.kani_harnesses):
        ob = h.get("obligation")
        if isinstance(ob, str) and ob and ob not in obligation_ids:
            ctx.add("V008", ("kani_harnesses", i, "obligation"), f"kani_harnesses[{i}].obligation",
                    f"{h.get('id')} names obligation {ob!r}, which does not exist",
                    native_only=True, warn_rule="W109")
    # V016 qa_gate
    if c.qa_gate:
        crit = c.qa_gate.get("pass_criteria")
        m = GATE_COUNT.search(crit) if isinstance(crit, str) else None
        if m and int(m.group(1)) != len(c.checks):
            ctx.add("V016", ("qa_gate", "pass_criteria"), "qa_gate.pass_criteria",
                    f"pass_criteria says {m.group(1)} tests but the contract has {len(c.checks)}",
                    native_only=True, warn_rule="W109")
        check_ids = {t.id for t in c.checks}
        gate_checks = c.qa_gate.get("checks")
        for i, cid in enumerate(gate_checks if isinstance(gate_checks, list) else []):
            if native and isinstance(cid, str) and cid not in check_ids:
                ctx.add("V016", ("qa_gate", "checks", i), f"qa_gate.checks[{i}]",
                        f"qa_gate lists {cid!r}, which is not a falsification test id")


def _spec_expressions(t) -> list[tuple[tuple, str]]:
    """(path under the check, source) of every expression a check's spec evaluates."""
    spec, out = t.spec, []
    for key in ("predicate", "relation", "statistic"):
        if isinstance(spec.get(key), str):
            out.append(((key,), spec[key]))
    maps = ("transform", "call") + (("args",) if spec.get("kind") == "roundtrip" else ())
    for key in maps:
        for n, v in (spec.get(key) or {}).items() if isinstance(spec.get(key), dict) else ():
            if isinstance(v, str):
                out.append(((key, n), v))
    tol = spec.get("tolerance")
    for dt, ts in tol.items() if isinstance(tol, dict) else ():
        for key in ("atol", "rtol"):
            if isinstance(ts, dict) and isinstance(ts.get(key), str):
                out.append((("tolerance", dt, key), ts[key]))
    return out


def _input_expressions(spec) -> list[tuple[tuple, str]]:
    """(path under the input, source) of every expression an input declaration evaluates."""
    if not isinstance(spec, dict):
        return []
    out = [(("assume", i), a) for i, a in enumerate(spec.get("assume") or [])
           if isinstance(a, str)]
    args = spec.get("args") if isinstance(spec.get("args"), dict) else {}
    for n, a in args.items():
        for key in ("shape", "values"):
            vals = a.get(key) if isinstance(a, dict) else None
            out += [(("args", n, key, i), v) for i, v in enumerate(vals or [])
                    if isinstance(vals, list) and isinstance(v, str)]
    return out


def _check_expressions(ctx, c: Contract) -> None:
    """V033: every expression stays inside the allow-list. Only parsed, never evaluated."""
    found = [(("inputs", name) + p, f"input {name}: ", src) for name, spec in c.inputs.items()
             for p, src in _input_expressions(spec)]
    for t in c.checks:
        if t.spec:
            found += [(("falsification_tests", t.index, "check") + p, f"{t.id}: ", src)
                      for p, src in _spec_expressions(t)]
    for path, who, src in found:
        err = expr.refusal(src)
        if err:
            ctx.add("V033", path, json_path(path),
                    f"{who}expression outside the allow-list: {err}")


def _reserved(name, allow_eps: bool) -> bool:
    return name in expr.HARNESS_NAMES and not (allow_eps and name == "eps")


def _input_names(ctx, c: Contract) -> None:
    """V021 for input declarations: their dims and arguments become expression names."""
    for iname, spec in c.inputs.items():
        if not isinstance(spec, dict):
            continue
        for where in ("dims", "args"):
            block = spec.get(where)
            for n in block if isinstance(block, dict) else {}:
                if _reserved(n, allow_eps=where == "args"):
                    ctx.add("V021", ("inputs", iname, where, n), f"inputs.{iname}.{where}.{n}",
                            f"{where[:-1]} {n!r} has the name of a value the harness binds in "
                            "expressions; rename it" + (
                                " (only an argument may be named `eps`)" if n == "eps" else ""))


# the fields of the array and scalar argument forms; a `text:` argument is a str, so any of
# them beside it would be silently ignored
_NOT_WITH_TEXT = ("shape", "dtype", "values", "special", "const", "choices", "dense", "poison",
                  "init", "scale", "build")


def _input_texts(ctx, c: Contract) -> None:
    """V031 for `text:` arguments (falsify/harness/cases.py draws them)."""
    for iname, spec in c.inputs.items():
        args = spec.get("args") if isinstance(spec, dict) else None
        for n, a in (args if isinstance(args, dict) else {}).items():
            if not (isinstance(a, dict) and isinstance(a.get("text"), dict)):
                continue
            path, field_ = ("inputs", iname, "args", n), f"inputs.{iname}.args.{n}"
            clash = [k for k in _NOT_WITH_TEXT if k in a]
            if clash:
                ctx.add("V031", path, field_,
                        f"argument {n!r} is a `text:` string; {', '.join(clash)} belong to "
                        "array and scalar arguments and would be ignored (text options go "
                        "inside `text:`)")
            t = a["text"]
            lo, hi = t.get("min_size", 0), t.get("max_size", case_spec.DEFAULT_TEXT_MAX)
            if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
                ctx.add("V031", path + ("text",), field_ + ".text",
                        f"argument {n!r}: min_size {lo} > max_size {hi}" + (
                            f" (max_size defaults to {case_spec.DEFAULT_TEXT_MAX})"
                            if "max_size" not in t else ""))


_ARG_EXPRS = ("relation", "statistic")  # expressions evaluated with the input arguments bound


def _check_names(ctx, c: Contract, t, base, fname, inp) -> None:
    """V021 for one check: params and `call:` keys named like harness names, and a bare `eps`
    in an expression that also sees an argument named `eps`."""
    spec = t.spec
    for key in ("params", "call"):
        block = spec.get(key)
        for n in block if isinstance(block, dict) else {}:
            # `call: {dtype: dtype}` passes the case dtype to an output-dtype parameter: the
            # name then holds the value the harness binds to it anyway, so nothing is hidden
            same = key == "call" and n == "dtype" and str(block[n]).strip() == "dtype"
            if _reserved(n, allow_eps=key == "call") and not same:
                ctx.add("V021", base + ("check", key, n), f"{fname}.check.{key}.{n}",
                        f"{t.id}: {key} {n!r} has the name of a value the harness binds in "
                        "expressions; rename it")
    args = set(inp.get("args") or {}) if isinstance(inp, dict) else set()
    call = spec.get("call") if isinstance(spec.get("call"), dict) else {}
    if "eps" not in args | set(call):
        return
    exprs = {k: spec[k] for k in _ARG_EXPRS if isinstance(spec.get(k), str)}
    if spec.get("kind") != "statistical" and isinstance(spec.get("predicate"), str):
        exprs["predicate"] = spec["predicate"]  # a statistical predicate sees only `stats`, dims
    for key in ("transform", "args"):
        if spec.get("kind") in ("metamorphic", "roundtrip") and isinstance(spec.get(key), dict):
            exprs.update({f"{key}.{k}": v for k, v in spec[key].items() if isinstance(v, str)})
    for key, src in exprs.items():
        if "eps" in expr.names_in(src):
            path = base + ("check",) + tuple(key.split("."))
            ctx.add("V021", path, f"{fname}.check.{key}",
                    f"{t.id}: bare `eps` in {key} is ambiguous: the input has an argument "
                    "named `eps`. Write `eps_dtype` for the dtype's machine epsilon or "
                    "`args['eps']` for the argument")


def _check_outputs(ctx, c: Contract, t, base, fname, eq, inp, allow_import,
                   import_bindings) -> None:
    """V018 for `check.outputs`: every entry an output of the equation (a declared name, or an
    index within its names), none twice; for a gradient check, every later output named (its
    upstream gradient is passed as `d<name>`), that keyword not already an argument, and the
    reference backward accepting it."""
    spec = t.spec
    seen, selected = {}, []
    for j, entry in enumerate(spec["outputs"]):
        path, field_ = base + ("check", "outputs", j), f"{fname}.check.outputs[{j}]"
        try:
            i = output_index(eq, entry)
        except ValueError as e:
            ctx.add("V018", path, field_, f"{t.id}: outputs: {e}")
            continue
        if i in seen:
            ctx.add("V018", path, field_, f"{t.id}: outputs: {entry!r} names output {i} again "
                                          f"(as {seen[i]!r})")
            continue
        seen[i] = entry
        selected.append((j, i))
    if spec.get("kind") not in ("gradient", "gradgrad", "jvp"):
        return
    statistics = [(j, i) for j, i in selected
                  if i < len(eq.outputs) and eq.outputs[i] in eq.non_differentiable]
    for j, i in statistics:
        ctx.add("V022", base + ("check", "outputs", j), f"{fname}.check.outputs[{j}]",
                f"{t.id}: outputs: {eq.outputs[i]!r} is declared non_differentiable in "
                f"equation {eq.name!r}: it has no gradient to check")
    selected = [s for s in selected if s not in statistics]
    taken = set(inp.get("args") or {}) if isinstance(inp, dict) else set()
    taken |= set(spec["call"]) if isinstance(spec.get("call"), dict) else set()
    names = {}
    for j, i in selected:
        path, field_ = base + ("check", "outputs", j), f"{fname}.check.outputs[{j}]"
        try:
            name = upstream_name(eq, i)
        except ValueError as e:
            ctx.add("V018", path, field_, f"{t.id}: outputs: {e}")
            continue
        if i and name in taken:
            ctx.add("V018", path, field_, f"{t.id}: outputs: the upstream gradient of output "
                                          f"{i} is passed to the backward as {name!r}, which "
                                          "is already an argument of the call")
            continue
        if i:
            names[name] = j
    bwd = c.equations.get(spec.get("backward") or "")
    ref = bwd.bindings.get("reference") if bwd is not None else None
    if not (names and ref and import_bindings):
        return
    fn, _ = resolve_binding(ref, allow_import)
    try:
        params = inspect.signature(fn).parameters if fn is not None else None
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell
        params = None
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    for name, j in names.items():
        if name not in params:
            ctx.add("V018", base + ("check", "outputs", j), f"{fname}.check.outputs[{j}]",
                    f"{t.id}: outputs: the reference backward {ref} takes no {name!r}, the "
                    f"upstream gradient of output {spec['outputs'][j]!r}")


def _check_batch(ctx, t, base, fname, inp: dict, dim: str) -> None:
    """batch_invariance: `batch` is a dim of the input that some argument's shape carries."""
    dims = inp.get("dims") or {}
    if dim not in dims:
        ctx.add("V018", base + ("check", "batch"), fname + ".check.batch",
                f"{t.id}: batch {dim!r} is not a dim of input {t.spec.get('input')!r} "
                f"(dims: {', '.join(dims) or 'none'})")
    elif not any(dim in (a.get("shape") or []) for a in (inp.get("args") or {}).values()
                 if isinstance(a, dict)):
        ctx.add("V018", base + ("check", "batch"), fname + ".check.batch",
                f"{t.id}: no argument of input {t.spec.get('input')!r} has dim {dim!r} in its "
                "shape, so no row could be batched")


def _check_device_bound(ctx, c: Contract, t, base, fname) -> None:
    """device: `parity` names a parity check of the same equation with a tolerance for every
    dtype the device check runs (that tolerance, doubled, is its bound)."""
    name = t.spec["parity"]
    p = c.check(name)
    eq = equation_of(c, t)
    where = (base + ("check", "parity"), fname + ".check.parity")
    if p is None or not p.spec or p.kind != "parity" or equation_of(c, p) != eq:
        ctx.add("V018", *where, f"{t.id}: parity {name!r} must name a parity check of equation "
                f"{eq!r}: its tolerance, doubled, bounds the GPU-vs-CPU difference")
        return
    if (p.spec.get("call") or {}) != (t.spec.get("call") or {}):
        ctx.add("V018", *where, f"{t.id}: `call` {t.spec.get('call') or {}} differs from "
                f"{name}'s {p.spec.get('call') or {}}: the parity bound holds for the "
                "computation it checked, so the device check passes the same arguments")
    tol = p.spec.get("tolerance") or {}
    missing = [v for v in variants_of(c, t) if tol and v not in tol]
    if missing:
        ctx.add("V018", *where, f"{t.id}: parity check {name} declares no tolerance for "
                f"{', '.join(missing)}, which this device check runs")


def sized_dims(inp: dict) -> list[str]:
    """The dims of an input that size some array argument, flags (`choices` dims) left out:
    the dims a layouts check states the size-0 rule of."""
    dims = inp.get("dims") or {}
    used = set()
    for a in (inp.get("args") or {}).values():
        if isinstance(a, dict) and isinstance(a.get("shape"), list):
            for s in a["shape"]:
                used |= expr.names_in(s) if isinstance(s, str) else set()
    return [d for d, v in dims.items() if d in used and not isinstance(v, dict)]


def _check_layouts(ctx, c, t, base, fname, inp: dict) -> None:
    """V025: the parity check a layouts check borrows its tolerance from, and the dims whose
    size-0 rule it states."""
    spec = t.spec
    pid = spec.get("parity")
    p = c.check(pid) if isinstance(pid, str) else None
    if p is None or not p.spec or p.kind != "parity":
        ctx.add("V025", base + ("check", "parity"), fname + ".check.parity",
                f"{t.id}: parity {pid!r} is not a parity check of {c.id}")
    elif equation_of(c, p) != equation_of(c, t) or p.spec.get("input") != spec.get("input"):
        ctx.add("V025", base + ("check", "parity"), fname + ".check.parity",
                f"{t.id}: parity check {pid} runs equation {equation_of(c, p)!r} on input "
                f"{p.spec.get('input')!r}, this check {equation_of(c, t)!r} on "
                f"{spec.get('input')!r}: its tolerance judges only its own equation and input")
    zs = spec.get("zero_size")
    if isinstance(zs, dict):
        want = sized_dims(inp)
        missing = [d for d in want if d not in zs]
        extra = [d for d in zs if d not in want]
        if missing:
            ctx.add("V025", base + ("check", "zero_size"), fname + ".check.zero_size",
                    f"{t.id}: zero_size states no rule for {', '.join(missing)}, which size(s) "
                    f"arguments of input {spec.get('input')!r}: say `empty` or `error` for each")
        if extra:
            ctx.add("V025", base + ("check", "zero_size"), fname + ".check.zero_size",
                    f"{t.id}: zero_size names {', '.join(extra)}, not a range or fixed dim "
                    f"sizing an argument of input {spec.get('input')!r} "
                    f"(those: {', '.join(want) or 'none'})")
    arrays = [k for k, a in (inp.get("args") or {}).items() if isinstance(a, dict) and "shape" in a]
    for j, d in enumerate(spec.get("leading") or []):
        shapes = [a["shape"] for a in (inp.get("args") or {}).values()
                  if isinstance(a, dict) and isinstance(a.get("shape"), list)]
        elsewhere = [sh for sh in shapes if d in sh[1:]]
        if d not in sized_dims(inp) or not any(sh[:1] == [d] for sh in shapes) or elsewhere:
            ctx.add("V025", base + ("check", "leading", j), f"{fname}.check.leading[{j}]",
                    f"{t.id}: leading names {d!r}, which must be a dim of input "
                    f"{spec.get('input')!r} that is the first axis of every argument it sizes"
                    + (f" (it is not first in {elsewhere[0]})" if elsewhere else ""))
    for key in ("no_expand", "writes"):
        for j, k in enumerate(spec.get(key) or []):
            if k not in arrays:
                ctx.add("V025", base + ("check", key, j), f"{fname}.check.{key}[{j}]",
                        f"{t.id}: {key} names {k!r}, not an array argument of input "
                        f"{spec.get('input')!r} (those: {', '.join(arrays) or 'none'})")

def _check_compile(ctx, c: Contract, t, base, fname, inp) -> None:
    """V029: a compile check's bound and backward come from checks of its own equation on torch
    whose tolerances evaluate at its input's dims, for every dtype it runs."""
    spec = t.spec
    if "parity" not in spec and "tolerance" not in spec:
        ctx.add("V029", base + ("check",), fname + ".check",
                f"{t.id}: a compile check needs a bound: `parity` (that check's "
                "tolerance, doubled) or its own `tolerance`")
    for b in spec.get("backends") or []:
        if b != "torch":
            ctx.add("V029", base + ("check", "backends"), fname + ".check.backends",
                    f"{t.id}: the compile kind runs torch bindings only, not {b!r} (Triton "
                    "kernels are compiled already; the reference is numpy)")
    named = (spec.get("specializes") or {}).get("dims") or []
    dims = inp.get("dims") if isinstance(inp, dict) and isinstance(inp.get("dims"), dict) else {}
    for d in named:
        if d not in dims:
            ctx.add("V029", base + ("check", "specializes", "dims"),
                    fname + ".check.specializes.dims",
                    f"{t.id}: specializes names {d!r}, not a dim of input "
                    f"{spec.get('input')!r} (those: {', '.join(dims) or 'none'})")
    eqname = equation_of(c, t)
    dtypes = [r.variant for r in runs(c, t)]
    for key, kind in (("parity", "parity"), ("gradient", "gradient")):
        ref = spec.get(key)
        if not isinstance(ref, str):
            continue
        path, where = base + ("check", key), f"{fname}.check.{key}"
        src = c.check(ref)
        if src is None or not src.spec or src.kind != kind:
            ctx.add("V029", path, where, f"{t.id}: {ref!r} is not a {kind} check of "
                    f"{c.id}" + (f" (it is {src.kind})" if src is not None and src.spec else ""))
            continue
        if equation_of(c, src) != eqname:
            ctx.add("V029", path, where, f"{t.id}: {ref} checks equation "
                    f"{equation_of(c, src)!r}, the compile check {eqname!r}")
            continue
        if "torch" not in {r.backend for r in runs(c, src)}:
            ctx.add("V029", path, where, f"{t.id}: {ref} does not run on torch, so its bound "
                    "says nothing about the torch kernel")
        tol = src.spec.get("tolerance") or {}
        # the backward is compared in the dtypes the gradient check runs (V030 needs one)
        mine = ([d for d in dtypes if d in {r.variant for r in runs(c, src)}]
                if kind == "gradient" else dtypes)
        if kind == "gradient" and not mine:
            ctx.add("V029", path, where, f"{t.id}: {ref} runs in none of the compile check's "
                    f"dtypes ({', '.join(dtypes)}), so no backward would be compared")
        missing = [d for d in mine if d not in tol] if tol else []  # none declared: exact
        if missing:
            ctx.add("V029", path, where, f"{t.id}: {ref} declares no tolerance for "
                    f"{', '.join(missing)}, which the compile check runs")
        if not isinstance(inp, dict):
            continue
        args = inp.get("args") if isinstance(inp.get("args"), dict) else {}
        if kind == "gradient":
            absent = [w for w in src.spec.get("wrt") or [] if w not in args]
            if absent:
                ctx.add("V029", path, where, f"{t.id}: {ref} differentiates "
                        f"{', '.join(absent)}, which input {spec.get('input')!r} does not "
                        "declare")
        for dt in mine:
            entry = tol.get(dt)
            if not isinstance(entry, dict):
                continue
            for k in ("atol", "rtol"):
                if k not in entry:
                    continue
                for env in tolerance_envs(inp):
                    try:
                        tolerance_number(entry[k], dt, env)
                    except expr.ExprError as e:
                        ctx.add("V029", path, where, f"{t.id}: {ref}'s {dt} {k} "
                                f"{entry[k]!r} does not evaluate at input "
                                f"{spec.get('input')!r}'s dims: {e}")
                        break


def _check_compile_backward(ctx, c: Contract) -> None:
    """V030: an equation differentiated on torch is compiled backward too, if compiled."""
    compiled: dict[str, list] = {}
    for t in c.checks:
        if t.spec and t.kind == "compile":
            compiled.setdefault(equation_of(c, t), []).append(t)
    for eq, checks in compiled.items():
        if any(t.spec.get("gradient") for t in checks):
            continue
        grads = [g.id for g in c.checks if g.spec and g.kind == "gradient"
                 and equation_of(c, g) == eq and "torch" in {r.backend for r in runs(c, g)}]
        if grads:
            t = checks[0]
            ctx.add("V030", ("falsification_tests", t.index, "check"),
                    f"falsification_tests[{t.index}].check",
                    f"{t.id}: equation {eq!r} has a backward on torch ({', '.join(grads)}) but "
                    "no compile check names a `gradient`: forward compiled, backward not")


def _check_spec(ctx, c: Contract, t, base, fname, allow_import, import_bindings):
    spec = t.spec
    kind = spec.get("kind")
    for req in REQUIRED_FIELDS.get(kind, ()):
        if req not in spec:
            ctx.add("V018", base + ("check",), fname + ".check",
                    f"{t.id}: a {kind} check needs `{req}`")
    inp = None
    if kind in INPUT_KINDS and "input" in spec:
        inp = c.inputs.get(spec["input"])
        if inp is None:
            ctx.add("V018", base + ("check", "input"), fname + ".check.input",
                    f"{t.id}: input {spec['input']!r} is not declared under `inputs` "
                    f"(declared: {', '.join(c.inputs) or 'none'})")
    if kind in INPUT_KINDS and isinstance(inp, dict):
        listed = [v for v in variants_of(c, t) if v in case_spec.FLOAT_DTYPES]
        if len(listed) > 1 and not case_spec.dtype_takers(inp, spec.get("call")):
            ctx.add("V024", base + ("check", "input"), fname + ".check.input",
                    f"{t.id}: runs in {', '.join(listed)}, but no argument of input "
                    f"{spec['input']!r} takes the case dtype (each declares its own `dtype`) "
                    "and no `call:` reads `dtype`: every variant runs the same computation, "
                    "so the contract lists dtypes nobody ran")
    if kind in INPUT_KINDS:
        eqname = equation_of(c, t)
        eq = c.equations.get(eqname or "")
        if eq is None:
            ctx.add("V018", base + ("check",), fname + ".check",
                    f"{t.id}: equation {eqname!r} does not exist; set check.equation or the "
                    "obligation's applies_to")
        else:
            for b in spec.get("backends") or []:
                if b not in eq.bindings:
                    ctx.add("V018", base + ("check", "backends"), fname + ".check.backends",
                            f"{t.id}: backend {b!r} has no binding in equation {eqname!r}")
            if not runs(c, t):
                ctx.add("V018", base + ("check",), fname + ".check",
                        f"{t.id}: runs on no backend (equation {eqname!r} has no usable binding)")
            if isinstance(spec.get("outputs"), list):
                _check_outputs(ctx, c, t, base, fname, eq, inp, allow_import, import_bindings)
        for key in ("backward", "inverse"):
            if spec.get(key) and spec[key] not in c.equations:
                ctx.add("V018", base + ("check", key), f"{fname}.check.{key}",
                        f"{t.id}: {key} equation {spec[key]!r} does not exist")
    for key in ("run", "target", "kernel"):
        if spec.get(key):
            _check_binding(ctx, spec[key], base + ("check", key), f"{fname}.check.{key}",
                           allow_import, import_bindings)
    if "tolerance" in spec:
        dtypes = sorted({r.variant for r in runs(c, t)} | set(spec.get("dtypes") or []),
                        key=str)
        _tolerance(ctx, c, spec["tolerance"], base + ("check", "tolerance"), dtypes, inp,
                   evaluate=not (kind in INPUT_KINDS and "input" in spec and inp is None))
    _check_names(ctx, c, t, base, fname, inp)
    if kind == "batch_invariance" and inp is not None and isinstance(spec.get("batch"), str):
        _check_batch(ctx, t, base, fname, inp, spec["batch"])
    if kind == "device" and isinstance(spec.get("parity"), str):
        _check_device_bound(ctx, c, t, base, fname)
    if kind == "layouts" and inp is not None:
        _check_layouts(ctx, c, t, base, fname, inp)

    if kind == "compile":
        _check_compile(ctx, c, t, base, fname, inp)
    if kind == "gradient" and isinstance(spec.get("call"), dict):
        for w in spec.get("wrt") or []:
            if w in spec["call"]:
                ctx.add("V018", base + ("check", "call", w), f"{fname}.check.call.{w}",
                        f"{t.id}: `call` replaces {w!r}, which the check differentiates "
                        "(wrt): the gradient would be taken of a constant")
    if kind in ("gradgrad", "jvp"):
        _check_derivative_kind(ctx, c, t, base, fname, inp)
    for key in ("predicate", "relation", "statistic"):
        if isinstance(spec.get(key), str):
            err = expr.syntax_error(spec[key])
            if err:
                ctx.add("V018", base + ("check", key), f"{fname}.check.{key}",
                        f"{t.id}: {key} is not a valid expression: {err}")


def _check_derivative_kind(ctx, c: Contract, t, base, fname, inp) -> None:
    """V027 (mode) and V028 (oracle) for the gradgrad and jvp kinds."""
    spec = t.spec
    kind = spec["kind"]
    if "reference" in (spec.get("backends") or []):
        ctx.add("V027", base + ("check", "backends"), fname + ".check.backends",
                f"{t.id}: a {kind} check compares optimized backends with the float64 "
                "reference backward; the reference backend is the oracle, not a subject")
    expect = spec.get("expect")
    want = None
    if expect is not None:
        extra = sorted(set(expect) - {"error"}) if isinstance(expect, dict) else ["?"]
        if extra:
            ctx.add("V027", base + ("check", "expect"), fname + ".check.expect",
                    f"{t.id}: a {kind} check's expect takes only `error` (a regular "
                    f"expression the refusal must match), got {', '.join(map(str, extra))}")
        want = expect.get("error") if isinstance(expect, dict) else None
        if not isinstance(want, str) or not want:
            ctx.add("V027", base + ("check", "expect", "error"), fname + ".check.expect.error",
                    f"{t.id}: expect.error must be a non-empty regular expression")
            want = None
        else:
            try:
                re.compile(want)
            except re.error as e:
                ctx.add("V027", base + ("check", "expect", "error"),
                        fname + ".check.expect.error",
                        f"{t.id}: expect.error {want!r} is not a regular expression: {e}")
    if want and "tolerance" in spec:
        ctx.add("V027", base + ("check", "tolerance"), fname + ".check.tolerance",
                f"{t.id}: the check expects an error, so no value is compared and the "
                "tolerance would never apply: drop one of them")
    if expect is None and "tolerance" not in spec:
        ctx.add("V027", base + ("check",), fname + ".check",
                f"{t.id}: a {kind} check that compares values needs a `tolerance` for the "
                "backend's rounding in the case dtype (the finite-difference side is derived "
                "by the harness), or `expect: {error: ...}` where the backend refuses")
    bwd = c.equations.get(spec.get("backward") or "")
    if bwd is not None and "reference" not in bwd.bindings:
        ctx.add("V028", base + ("check", "backward"), fname + ".check.backward",
                f"{t.id}: backward equation {spec['backward']!r} has no reference binding: "
                f"the {kind} oracle is the float64 reference backward")
    if not isinstance(inp, dict):
        return
    args = inp.get("args") or {}
    call = spec.get("call") if isinstance(spec.get("call"), dict) else {}
    for j, w in enumerate(spec.get("wrt") or []):
        a = args.get(w)
        why = None
        if not isinstance(a, dict):
            why = f"is not an argument of input {spec.get('input')!r}"
        elif "const" in a or "choices" in a or "shape" not in a:
            why = "is a scalar argument, not a tensor"
        elif str(a.get("dtype", "float")).startswith(("int", "uint", "bool")):
            why = f"has the integer dtype {a['dtype']!r}"
        elif w in call:
            why = "is replaced by `call`, so the check would differentiate a constant"
        if why:
            ctx.add("V028", base + ("check", "wrt", j), f"{fname}.check.wrt[{j}]",
                    f"{t.id}: wrt {w!r} {why}: {kind} differentiates floating tensors")


def load_all(paths, mode: str | None = None) -> Report:
    """Load every contract under `paths`; unreadable files become findings."""
    rep = Report()
    files = discover(paths)
    for p in files:
        if not p.exists():
            rep.findings.append(Finding("V001", "error", str(p), 1, "<file>", "no such file"))
            continue
        try:
            c, fs = load_contract(p, mode)
        except ContractError as e:
            rep.findings.append(e.finding)
            continue
        rep.contracts.append(c)
        rep.findings += fs
    return rep


def known_contracts(rep: Report) -> dict[str, Contract]:
    """Contracts named in the report, their sibling files (so depends_on resolves when a
    single file is validated), then the project's and the library's contracts (one id
    space: a project contract may depend on a library contract)."""
    known = {c.id: c for c in rep.contracts}
    files: dict[str, Path] = {}
    for d in sorted({c.path.parent for c in rep.contracts}):
        for p in sorted(d.glob("*.y*ml")):
            files.setdefault(p.name.rsplit(".", 1)[0], p)
    for e in id_space(find_project()).values():
        files.setdefault(e.id, e.path)
    todo = [d for c in rep.contracts for d in c.depends_on]
    while todo:  # only what the named contracts reach: parsing the whole library is slow
        d = todo.pop()
        if d in known or d not in files:
            continue
        try:
            known[d] = load_contract(files[d])[0]
        except ContractError:
            continue
        todo += known[d].depends_on
    return known


def validate(paths, mode: str | None = None, allow_import=False, import_bindings=True) -> Report:
    rep = load_all(paths, mode)
    for c in rep.contracts:
        validate_contract(c, rep.findings, allow_import, import_bindings)
    known = known_contracts(rep)
    for c in rep.contracts:
        ctx = _Ctx(c, rep.findings)
        for i, d in enumerate(c.depends_on):
            if d not in known:
                ctx.add("V010", ("metadata", "depends_on", i), f"metadata.depends_on[{i}]",
                        f"depends on {d!r}, which is not a contract here", native_only=True,
                        warn_rule="W109")
    named = {c.id for c in rep.contracts}
    for cyc in graph.find_cycles(graph.build(known).deps):
        # report once, on the first member that was asked about, at the depends_on entry
        # that closes the loop
        k = next((k for k, n in enumerate(cyc[:-1]) if n in named), None)
        if k is None:
            continue
        c = known[cyc[k]]
        i = c.depends_on.index(cyc[k + 1])
        _Ctx(c, rep.findings).add("V011", ("metadata", "depends_on", i),
                                  f"metadata.depends_on[{i}]",
                                  "dependency cycle: " + " -> ".join(cyc[k:] + cyc[1:k + 1]))
    # V006 ids shared across contracts
    owner: dict[str, str] = {}
    for c in rep.contracts:
        ids = [("proof_obligations", o.index, o.id) for o in c.obligations if not o.derived_id]
        ids += [("falsification_tests", t.index, t.id) for t in c.checks]
        ids += [("mutants", m.index, m.id) for m in c.mutants]
        for section, i, ident in ids:
            if ident in owner and owner[ident] != c.id:
                _Ctx(c, rep.findings).add("V006", (section, i, "id"), f"{section}[{i}].id",
                                          f"id {ident!r} is also used by {owner[ident]}",
                                          native_only=True, warn_rule="W109")
            owner.setdefault(ident, c.id)
    rep.findings = _capped(rep.findings)
    rep.findings.sort(key=lambda f: (f.path, f.line, f.rule))
    return rep


MAX_PER_RULE = 100  # per file and rule: a 40,000-obligation file gets a readable report


def _capped(findings: list[Finding]) -> list[Finding]:
    out, seen, extra = [], {}, {}
    for f in findings:
        key = (f.path, f.rule)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= MAX_PER_RULE:
            out.append(f)
        else:
            extra.setdefault(key, f)
    for key, f in extra.items():
        n = seen[key] - MAX_PER_RULE
        out.append(Finding(f.rule, f.severity, f.path, f.line, f.field,
                           f"... and {n} more {f.rule} finding(s) in this file, not listed"))
    return out


__all__ = ["validate", "load_all", "Report", "resolve_binding", "BACKENDS"]
