"""What changed between two versions of a contract, and the semver bump that demands.

A contract is a promise about kernels. Taking something away or making it weaker breaks
whoever relied on it (major): removing an obligation, check, mutant, binding or input; loosening
a tolerance (larger atol/rtol, or an expression that evaluates larger at the input's examples);
narrowing an input range or dtype list; changing a formula, predicate or formal statement.
Adding checks, dtypes, backends or examples strengthens it (minor). Rewording prose (description,
property, rule, if_fails, references, derivations) is a patch. What we cannot classify is
treated as major: a change the tool cannot prove harmless is not harmless.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field

from falsify.harness.model import Contract
from falsify.harness.plan import runs
from falsify.harness.validate import SEMVER, tolerance_envs, tolerance_number

BUMPS = ("none", "patch", "minor", "major")
RANK = {b: i for i, b in enumerate(BUMPS)}


@dataclass
class Change:
    section: str  # equations, inputs, proof_obligations, falsification_tests, mutants, ...
    key: str  # the item's id or name ("" for a whole section)
    what: str  # added | removed | changed
    field: str  # dotted path inside the item ("" for the item itself)
    old: object
    new: object
    bump: str
    why: str

    def as_dict(self) -> dict:
        return dict(section=self.section, key=self.key, what=self.what, field=self.field,
                    old=self.old, new=self.new, bump=self.bump, why=self.why)

    def __str__(self) -> str:
        sign = {"added": "+", "removed": "-", "changed": "~"}[self.what]
        where = " ".join(x for x in (self.section, self.key, self.field) if x)
        if self.what == "changed":
            detail = f": {_short(self.old)} -> {_short(self.new)}"
        else:
            detail = f": {_short(self.new if self.what == 'added' else self.old)}" \
                if not isinstance(self.new if self.what == "added" else self.old, dict) else ""
        return f"  {sign} {where}{detail}  [{self.bump}: {self.why}]"


def _short(v, n: int = 70) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."


@dataclass
class DiffResult:
    old: Contract
    new: Contract
    changes: list[Change] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def required(self) -> str:
        return max((c.bump for c in self.changes), key=RANK.__getitem__, default="none")

    @property
    def declared(self) -> str | None:
        return declared_bump(self.old.version, self.new.version)

    @property
    def suggested_version(self) -> str | None:
        return bump_version(self.old.version, self.required)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        counts = {b: sum(c.bump == b for c in self.changes) for b in BUMPS[1:]}
        return {
            "old": {"id": self.old.id, "path": str(self.old.path), "version": self.old.version},
            "new": {"id": self.new.id, "path": str(self.new.path), "version": self.new.version},
            "changes": [c.as_dict() for c in self.changes], "counts": counts,
            "required": self.required, "declared": self.declared,
            "suggested_version": self.suggested_version, "ok": self.ok,
            "problems": self.problems,
        }


# ------------------------------------------------------------------------------ versions


def _semver(v: str) -> tuple[int, int, int] | None:
    m = SEMVER.match(v or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def declared_bump(old: str, new: str) -> str | None:
    """The bump NEW's version carries over OLD's: none/patch/minor/major, "backwards", or
    None when either is not semver. Pre-release and build suffixes are ignored."""
    a, b = _semver(old), _semver(new)
    if a is None or b is None:
        return None
    if b < a:
        return "backwards"
    if b[0] > a[0]:
        return "major"
    if b[1] > a[1]:
        return "minor"
    return "patch" if b[2] > a[2] else "none"


def bump_version(old: str, bump: str) -> str | None:
    v = _semver(old)
    if v is None:
        return None
    if bump == "major":
        return f"{v[0] + 1}.0.0"
    if bump == "minor":
        return f"{v[0]}.{v[1] + 1}.0"
    if bump == "patch":
        return f"{v[0]}.{v[1]}.{v[2] + 1}"
    return f"{v[0]}.{v[1]}.{v[2]}"


# ------------------------------------------------------------------------------ helpers


class _Out:
    def __init__(self):
        self.changes: list[Change] = []

    def add(self, section, key, what, fld, old, new, bump, why):
        self.changes.append(Change(section, str(key), what, fld, old, new, bump, why))

    def text(self, section, key, fld, a, b, bump="patch", why="wording"):
        """Free text: a patch when only wording changed, `bump` otherwise."""
        if a == b:
            return
        if _norm(a) == _norm(b):
            self.add(section, key, "changed", fld, a, b, "patch", "whitespace only")
        else:
            self.add(section, key, "changed", fld, a, b, bump, why)

    def members(self, section, key, fld, a, b, removed="major", added="minor",
                noun="entry"):
        """A list compared as a set: removals and additions separately."""
        a, b = _as_list(a), _as_list(b)
        ka, kb = [_canon(x) for x in a], [_canon(x) for x in b]
        for x, k in zip(a, ka):
            if k not in kb:
                self.add(section, key, "removed", fld, x, None, removed,
                         f"{noun} removed" if removed == "major" else f"{noun} removed ({removed})")
        for x, k in zip(b, kb):
            if k not in ka:
                self.add(section, key, "added", fld, None, x, added, f"{noun} added")

    def number(self, section, key, fld, a, b, larger="major", why="larger"):
        """A number where larger is weaker (larger="major") or stronger (larger="minor")."""
        if a == b:
            return
        if _isnum(a) and _isnum(b):
            if b > a:
                self.add(section, key, "changed", fld, a, b, larger, f"{why}: {a} -> {b}")
            else:
                smaller = "minor" if larger == "major" else "major"
                self.add(section, key, "changed", fld, a, b, smaller, f"smaller: {a} -> {b}")
        else:
            self.add(section, key, "changed", fld, a, b, "major", "changed (not comparable)")

    def flag(self, section, key, fld, a, b, weaker_when_false=True):
        """A boolean whose True side is the stronger contract (poison, critical)."""
        if bool(a) == bool(b):
            return
        weakened = bool(a) and not bool(b) if weaker_when_false else bool(b) and not bool(a)
        self.add(section, key, "changed", fld, a, b, "major" if weakened else "minor",
                 "weakened" if weakened else "strengthened")

    def opaque(self, section, key, fld, a, b, bump="major", why="changed"):
        if _canon(a) != _canon(b):
            self.add(section, key, "changed", fld, a, b, bump, why)


def _norm(s) -> str:
    return "".join(str(s).split()) if s is not None else ""


def _canon(x) -> str:
    return json.dumps(x, sort_keys=True, default=str)


def _as_list(x) -> list:
    if x is None:
        return []
    return x if isinstance(x, list) else [x]


def _isnum(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _d(x) -> dict:
    return x if isinstance(x, dict) else {}


def _same_expr(a, b) -> bool:
    """Two expressions that parse to the same tree differ only in formatting."""
    if not (isinstance(a, str) and isinstance(b, str)):
        return False
    try:
        return ast.dump(ast.parse(a.strip(), mode="eval")) == \
            ast.dump(ast.parse(b.strip(), mode="eval"))
    except SyntaxError:
        return False


def _keyed(items: list, key_of) -> dict:
    out = {}
    for i, x in enumerate(items):
        out.setdefault(key_of(i, x), x)
    return out


# ------------------------------------------------------------------------- intervals


def _intervals(spec) -> list[tuple[float, float]] | None:
    """A dim / param / value range as closed intervals: int k, [lo, hi], {choices: [...]},
    or a list of choices. None when it is not numeric."""
    if _isnum(spec):
        return [(spec, spec)]
    if isinstance(spec, dict) and isinstance(spec.get("choices"), list):
        spec = spec["choices"]
        return [(v, v) for v in spec] if all(_isnum(v) for v in spec) else None
    if isinstance(spec, list) and len(spec) == 2 and all(_isnum(v) for v in spec):
        return [(min(spec), max(spec))]
    if isinstance(spec, list) and spec and all(_isnum(v) for v in spec):
        return [(v, v) for v in spec]
    return None


def _covers(outer, inner) -> bool:
    return all(any(lo <= a and b <= hi for lo, hi in outer) for a, b in inner)


def _range_change(out: _Out, section, key, fld, a, b, as_choices=False):
    """Narrowing a range is major, widening minor, a shifted range (neither) major."""
    if _canon(a) == _canon(b):
        return
    if as_choices and isinstance(a, list) and isinstance(b, list):
        ia = [(v, v) for v in a] if all(_isnum(v) for v in a) else None
        ib = [(v, v) for v in b] if all(_isnum(v) for v in b) else None
    else:
        ia, ib = _intervals(a), _intervals(b)
    if ia is None or ib is None:
        out.add(section, key, "changed", fld, a, b, "major", "changed (not comparable)")
    elif _covers(ib, ia):
        out.add(section, key, "changed", fld, a, b, "minor", "range widened")
    else:
        out.add(section, key, "changed", fld, a, b, "major", "range narrowed or shifted")


# -------------------------------------------------------------------------- sections


def _metadata(out: _Out, a: Contract, b: Contract):
    ma, mb = _d(a.raw.get("metadata")), _d(b.raw.get("metadata"))
    s = "metadata"
    out.text(s, "", "description", ma.get("description"), mb.get("description"))
    out.members(s, "", "references", ma.get("references"), mb.get("references"),
                removed="patch", added="patch", noun="reference")
    out.members(s, "", "depends_on", ma.get("depends_on"), mb.get("depends_on"),
                removed="minor", added="minor", noun="dependency")
    for k in ("created", "author"):
        out.text(s, "", k, ma.get(k), mb.get(k))
    out.opaque(s, "", "kernel", ma.get("kernel"), mb.get("kernel"),
               why="kernel renamed: every file name changes")
    if (ma.get("status") or "draft") != (mb.get("status") or "draft"):
        weakened = ma.get("status") == "complete"
        out.add(s, "", "changed", "status", ma.get("status"), mb.get("status"),
                "major" if weakened else "minor",
                "no longer held to the coverage gate" if weakened else "now held to the gate")
    out.flag(s, "", "critical", ma.get("critical"), mb.get("critical"))
    known = {"version", "description", "references", "depends_on", "created", "author",
             "kernel", "status", "critical"}
    for k in sorted((set(ma) | set(mb)) - known, key=str):
        out.opaque(s, "", str(k), ma.get(k), mb.get(k), "patch", "unclassified metadata")


def _equations(out: _Out, a: Contract, b: Contract):
    ea, eb = _d(a.raw.get("equations")), _d(b.raw.get("equations"))
    s = "equations"
    for name in ea:
        if name not in eb:
            out.add(s, name, "removed", "", ea[name], None, "major", "equation removed")
    for name in eb:
        if name not in ea:
            out.add(s, name, "added", "", None, eb[name], "minor", "equation added")
    for name in (n for n in ea if n in eb):
        x, y = _d(ea[name]), _d(eb[name])
        for k in ("formula", "domain", "codomain"):
            out.text(s, name, k, x.get(k), y.get(k), "major", f"{k} changed")
        for k in ("latex", "derivation"):
            out.text(s, name, k, x.get(k), y.get(k))
        out.members(s, name, "invariants", x.get("invariants"), y.get("invariants"),
                    noun="invariant")
        ba, bb = _d(x.get("bindings")), _d(y.get("bindings"))
        for be in sorted(set(ba) | set(bb), key=str):
            if be not in bb:
                out.add(s, name, "removed", f"bindings.{be}", ba[be], None, "major",
                        "binding removed")
            elif be not in ba:
                out.add(s, name, "added", f"bindings.{be}", None, bb[be], "minor",
                        "binding added")
            elif ba[be] != bb[be]:
                out.add(s, name, "changed", f"bindings.{be}", ba[be], bb[be], "major",
                        "binding points at another function")
        ga, gb = _d(x.get("gpu_only")), _d(y.get("gpu_only"))
        for dt in sorted(set(ga) | set(gb), key=str):
            if dt not in ga:
                out.add(s, name, "added", f"gpu_only.{dt}", None, gb[dt], "major",
                        "dtype no longer checked without a GPU")
            elif dt not in gb:
                out.add(s, name, "removed", f"gpu_only.{dt}", ga[dt], None, "minor",
                        "dtype now checked without a GPU")
            else:
                out.text(s, name, f"gpu_only.{dt}", ga[dt], gb[dt])
        oa, ob = _as_list(x.get("outputs")), _as_list(y.get("outputs"))
        if oa != ob:  # names checks use: appending is new vocabulary, anything else renames
            if ob[:len(oa)] == oa:
                out.add(s, name, "added", "outputs", oa or None, ob, "minor",
                        "output names added")
            else:
                out.add(s, name, "changed", "outputs", oa, ob, "major",
                        "outputs renamed, removed or reordered")
        # an output declared non-differentiable no longer needs a gradient check (weaker)
        out.members(s, name, "non_differentiable", x.get("non_differentiable"),
                    y.get("non_differentiable"), removed="minor", added="major",
                    noun="non-differentiable output")
        known = {"formula", "domain", "codomain", "latex", "derivation", "invariants",
                 "bindings", "gpu_only", "outputs", "non_differentiable"}
        for k in sorted((set(x) | set(y)) - known, key=str):
            out.opaque(s, name, str(k), x.get(k), y.get(k), why="unclassified field changed")


def _inputs(out: _Out, a: Contract, b: Contract):
    ia, ib = _d(a.raw.get("inputs")), _d(b.raw.get("inputs"))
    s = "inputs"
    for name in ia:
        if name not in ib:
            out.add(s, name, "removed", "", ia[name], None, "major", "input removed")
    for name in ib:
        if name not in ia:
            out.add(s, name, "added", "", None, ib[name], "minor", "input added")
    for name in (n for n in ia if n in ib):
        x, y = _d(ia[name]), _d(ib[name])
        out.members(s, name, "dtypes", x.get("dtypes"), y.get("dtypes"), noun="dtype")
        da, db = _d(x.get("dims")), _d(y.get("dims"))
        for k in sorted(set(da) | set(db), key=str):
            if k not in db:
                out.add(s, name, "removed", f"dims.{k}", da[k], None, "major", "dim removed")
            elif k not in da:
                out.add(s, name, "added", f"dims.{k}", None, db[k], "minor", "dim added")
            else:
                _range_change(out, s, name, f"dims.{k}", da[k], db[k])
        envs = tolerance_envs(x) + tolerance_envs(y)
        aa, ab = _d(x.get("args")), _d(y.get("args"))
        for k in sorted(set(aa) | set(ab), key=str):
            if k not in ab:
                out.add(s, name, "removed", f"args.{k}", aa[k], None, "major", "argument removed")
            elif k not in aa:
                out.add(s, name, "added", f"args.{k}", None, ab[k], "minor", "argument added")
            else:
                _arg(out, s, name, f"args.{k}", _d(aa[k]), _d(ab[k]), envs)
        out.members(s, name, "examples", x.get("examples"), y.get("examples"), noun="example")
        out.members(s, name, "assume", x.get("assume"), y.get("assume"), removed="minor",
                    added="major", noun="assumption (narrows the cases)")
        out.number(s, name, "max_elements", x.get("max_elements"), y.get("max_elements"),
                   larger="minor", why="larger cases allowed")
        known = {"dtypes", "dims", "args", "examples", "assume", "max_elements"}
        for k in sorted((set(x) | set(y)) - known, key=str):
            out.opaque(s, name, str(k), x.get(k), y.get(k), why="unclassified field changed")


def _eval_bounds(v, envs) -> list[float] | None:
    """A bound (number or expression in the dims) at every env; None if not evaluable."""
    vals = []
    for env in envs or [{}]:
        try:
            vals.append(tolerance_number(v, "float32", env))
        except Exception:  # noqa: BLE001 - any failure means "cannot compare"
            return None
    return vals


def _arg(out: _Out, s, name, fld, x: dict, y: dict, envs):
    va, vb = x.get("values"), y.get("values")
    if _canon(va) != _canon(vb):
        lo_a, hi_a = (va + [None, None])[:2] if isinstance(va, list) else (None, None)
        lo_b, hi_b = (vb + [None, None])[:2] if isinstance(vb, list) else (None, None)
        la, lb = _eval_bounds(lo_a, envs), _eval_bounds(lo_b, envs)
        ha, hb = _eval_bounds(hi_a, envs), _eval_bounds(hi_b, envs)
        if va is None or vb is None or None in (la, lb, ha, hb):
            out.add(s, name, "changed", f"{fld}.values", va, vb, "major",
                    "value range changed (not comparable)")
        elif all(p <= q for p, q in zip(lb, la)) and all(p >= q for p, q in zip(hb, ha)):
            out.add(s, name, "changed", f"{fld}.values", va, vb, "minor", "value range widened")
        else:
            out.add(s, name, "changed", f"{fld}.values", va, vb, "major",
                    "value range narrowed or shifted")
    out.members(s, name, f"{fld}.special", x.get("special"), y.get("special"),
                noun="special value")
    if "choices" in x or "choices" in y:
        _range_change(out, s, name, f"{fld}.choices", x.get("choices"), y.get("choices"),
                      as_choices=True)
    out.flag(s, name, f"{fld}.poison", x.get("poison"), y.get("poison"))
    for k in ("shape", "dtype", "const", "init", "scale", "dense", "build"):
        out.opaque(s, name, f"{fld}.{k}", x.get(k), y.get(k),
                   why="changes what the kernel is called with")


def _obligation_entries(c: Contract) -> dict:
    """key -> (display id, raw dict). Compat obligations have ids derived from their position,
    and inserting one renumbers the rest, so derived ones are matched by their (unique)
    property text instead of their id."""
    raw = _as_list(c.raw.get("proof_obligations"))
    texts = [_norm(o.property).lower() for o in c.obligations if o.derived_id]
    out = {}
    for o in c.obligations:
        text = _norm(o.property).lower()
        key = ("text", text) if o.derived_id and text and texts.count(text) == 1 else o.id
        out[key] = (o.id, _d(raw[o.index]) if o.index < len(raw) else {})
    return out


def _obligations(out: _Out, a: Contract, b: Contract):
    s = "proof_obligations"
    oa, ob = _obligation_entries(a), _obligation_entries(b)
    # unmatched on both sides with the same derived id: the same obligation, reworded
    lost = {oid: k for k, (oid, _) in oa.items() if k not in ob}
    for k in [k for k in ob if k not in oa]:
        if ob[k][0] in lost:
            target = lost[ob[k][0]]
            ob[target] = ob.pop(k)
    for k, (oid, x) in oa.items():
        if k not in ob:
            out.add(s, oid, "removed", "", x, None, "major", "obligation removed")
    for k, (oid, y) in ob.items():
        if k not in oa:
            out.add(s, oid, "added", "", None, y, "minor", "obligation added")
    for key in (k for k in oa if k in ob):
        (_, x), (k, y) = oa[key], ob[key]
        out.opaque(s, k, "type", x.get("type"), y.get("type"), why="obligation type changed")
        out.text(s, k, "property", x.get("property"), y.get("property"))
        out.text(s, k, "formal", x.get("formal"), y.get("formal"), "major",
                 "formal statement changed")
        out.number(s, k, "tolerance", x.get("tolerance"), y.get("tolerance"),
                   why="tolerance loosened")
        out.members(s, k, "applies_to", x.get("applies_to"), y.get("applies_to"),
                    noun="equation")
        out.opaque(s, k, "over", x.get("over"), y.get("over"), why="reals/float changed")
        out.opaque(s, k, "lean", x.get("lean"), y.get("lean"), "patch", "proof metadata")


def _checks(out: _Out, a: Contract, b: Contract):
    s = "falsification_tests"
    raw_a = _as_list(a.raw.get("falsification_tests"))
    raw_b = _as_list(b.raw.get("falsification_tests"))
    ca = {c.id: _d(raw_a[c.index]) if c.index < len(raw_a) else {} for c in a.checks}
    cb = {c.id: _d(raw_b[c.index]) if c.index < len(raw_b) else {} for c in b.checks}
    for k in ca:
        if k not in cb:
            out.add(s, k, "removed", "", ca[k], None, "major", "check removed")
    for k in cb:
        if k not in ca:
            out.add(s, k, "added", "", None, cb[k], "minor", "check added")
    for k in (k for k in ca if k in cb):
        x, y = ca[k], cb[k]
        for f in ("rule", "if_fails", "test"):
            out.text(s, k, f, x.get(f), y.get(f))
        out.text(s, k, "prediction", x.get("prediction"), y.get("prediction"), "major",
                 "prediction changed")
        out.opaque(s, k, "obligation", x.get("obligation"), y.get("obligation"),
                   why="check now covers another obligation")
        xa, xb = x.get("check"), y.get("check")
        if xa is None and xb is not None:
            out.add(s, k, "added", "check", None, xb, "minor", "prose test became executable")
        elif xa is not None and xb is None:
            out.add(s, k, "removed", "check", xa, None, "major", "check no longer executable")
        elif xa is not None:
            _spec(out, s, k, _d(xa), _d(xb), a, b)


def _input_of(c: Contract, spec: dict) -> dict:
    name = spec.get("input")
    return c.inputs.get(name, {}) if isinstance(name, str) else {}


def _spec(out: _Out, s, k, x: dict, y: dict, a: Contract, b: Contract):
    for f in ("kind", "input", "equation", "backward", "inverse", "run", "target", "kernel",
              "engine", "args", "expect", "call", "transform", "wrt", "bound"):
        out.opaque(s, k, f"check.{f}", x.get(f), y.get(f), why=f"check {f} changed")
    for f in ("predicate", "relation", "statistic"):
        if x.get(f) != y.get(f):
            if _same_expr(x.get(f), y.get(f)):
                out.add(s, k, "changed", f"check.{f}", x.get(f), y.get(f), "patch",
                        "formatting only")
            else:
                out.add(s, k, "changed", f"check.{f}", x.get(f), y.get(f), "major",
                        f"{f} changed")
    # Backends and dtypes: compare where the check actually runs (explicit lists, the
    # input's dtypes, the equation's bindings and gpu_only all feed into it).
    ra = {(r.backend, r.variant) for r in runs(a, a.check(k))} if a.check(k) else set()
    rb = {(r.backend, r.variant) for r in runs(b, b.check(k))} if b.check(k) else set()
    for be, v in sorted(ra - rb):
        out.add(s, k, "removed", "runs", f"{be}/{v}", None, "major", "no longer runs there")
    for be, v in sorted(rb - ra):
        out.add(s, k, "added", "runs", None, f"{be}/{v}", "minor", "now also runs there")
    for f in ("backends", "dtypes"):
        if ra == rb:
            out.opaque(s, k, f"check.{f}", x.get(f), y.get(f), "patch",
                       "same backends and dtypes in effect")
    out.members(s, k, "check.outputs", x.get("outputs"), y.get("outputs"), noun="output")
    out.members(s, k, "check.gpu_targets", x.get("gpu_targets"), y.get("gpu_targets"),
                noun="GPU target")
    for f in ("max_examples", "samples"):
        out.number(s, k, f"check.{f}", x.get(f), y.get(f), larger="minor",
                   why="more examples")
    out.flag(s, k, "check.poison", x.get("poison"), y.get("poison"))
    if x.get("timeout_s") != y.get("timeout_s"):
        out.add(s, k, "changed", "check.timeout_s", x.get("timeout_s"), y.get("timeout_s"),
                "patch", "a timeout is 'unproven', never 'passed'")
    pa, pb = _d(x.get("params")), _d(y.get("params"))
    for p in sorted(set(pa) | set(pb), key=str):
        if p not in pb:
            out.add(s, k, "removed", f"check.params.{p}", pa[p], None, "major",
                    "parameter removed")
        elif p not in pa:
            out.add(s, k, "added", f"check.params.{p}", None, pb[p], "major",
                    "parameter added: the relation changed")
        else:
            _range_change(out, s, k, f"check.params.{p}", pa[p], pb[p])
    envs = tolerance_envs(_input_of(a, x)) + tolerance_envs(_input_of(b, y))
    _tolerances(out, s, k, x.get("tolerance"), y.get("tolerance"), envs)
    known = {"kind", "input", "equation", "backward", "inverse", "run", "target", "kernel",
             "engine", "args", "expect", "call", "transform", "wrt", "bound", "predicate",
             "relation", "statistic", "backends", "dtypes", "outputs", "gpu_targets",
             "max_examples", "samples", "poison", "timeout_s", "params", "tolerance"}
    for f in sorted((set(x) | set(y)) - known, key=str):
        out.opaque(s, k, f"check.{f}", x.get(f), y.get(f), why="unclassified field changed")


REF_MAXES = (1.0e-3, 1.0, 1.0e3)


def _tol_values(val, dtype, envs) -> list[float] | None:
    if val is None:
        return [0.0] * (len(envs) * len(REF_MAXES))  # the runtime reads a missing one as 0
    vals = []
    for env in envs:
        for rm in REF_MAXES:
            try:
                vals.append(tolerance_number(val, dtype, env, ref_max=rm))
            except Exception:  # noqa: BLE001 - any failure means "cannot compare"
                return None
    return vals


def _tolerances(out: _Out, s, k, ta, tb, envs):
    ta, tb = _d(ta), _d(tb)
    envs = envs or [{}]
    out.text(s, k, "check.tolerance.why", ta.get("why"), tb.get("why"))
    for dt in sorted((set(ta) | set(tb)) - {"why"}, key=str):
        fld = f"check.tolerance.{dt}"
        if dt not in tb:
            out.add(s, k, "removed", fld, ta[dt], None, "major",
                    f"no tolerance declared for {dt} any more")
            continue
        if dt not in ta:
            out.add(s, k, "added", fld, None, tb[dt], "minor", f"tolerance for {dt} added")
            continue
        xa, xb = _d(ta[dt]), _d(tb[dt])
        for key in ("atol", "rtol"):
            va, vb = xa.get(key), xb.get(key)
            if _canon(va) == _canon(vb):
                continue
            f = f"{fld}.{key}"
            na, nb = _tol_values(va, dt, envs), _tol_values(vb, dt, envs)
            if na is None or nb is None:
                out.add(s, k, "changed", f, va, vb, "major",
                        "tolerance changed and cannot be evaluated to compare")
                continue
            looser = [(p, q, i) for i, (p, q) in enumerate(zip(na, nb)) if q > p * (1 + 1e-12)]
            if looser:
                p, q, i = looser[0]
                env = envs[i // len(REF_MAXES)]
                where = ", ".join(f"{d}={v}" for d, v in env.items()) or "the defaults"
                out.add(s, k, "changed", f, va, vb, "major",
                        f"tolerance loosened: {q:.3g} > {p:.3g} at {where}")
            elif any(q < p for p, q in zip(na, nb)):
                out.add(s, k, "changed", f, va, vb, "minor", "tolerance tightened")
            else:
                out.add(s, k, "changed", f, va, vb, "patch", "same value, rewritten")


def _mutants(out: _Out, a: Contract, b: Contract):
    s = "mutants"
    ma = _keyed(_as_list(a.raw.get("mutants")), lambda i, m: str(_d(m).get("id", f"#{i}")))
    mb = _keyed(_as_list(b.raw.get("mutants")), lambda i, m: str(_d(m).get("id", f"#{i}")))
    for k in ma:
        if k not in mb:
            out.add(s, k, "removed", "", ma[k], None, "major",
                    "mutant removed: a bug the checks no longer have to catch")
    for k in mb:
        if k not in ma:
            out.add(s, k, "added", "", None, mb[k], "minor", "mutant added")
    for k in (k for k in ma if k in mb):
        x, y = _d(ma[k]), _d(mb[k])
        for f in ("obligation", "replaces", "with"):
            out.opaque(s, k, f, x.get(f), y.get(f), why=f"mutant {f} changed")
        for f in ("description", "source"):
            out.text(s, k, f, x.get(f), y.get(f))


def _kani(out: _Out, a: Contract, b: Contract):
    s = "kani_harnesses"
    ha = _keyed(a.kani_harnesses, lambda i, h: str(h.get("id", f"#{i}")))
    hb = _keyed(b.kani_harnesses, lambda i, h: str(h.get("id", f"#{i}")))
    for k in ha:
        if k not in hb:
            out.add(s, k, "removed", "", ha[k], None, "major", "harness removed")
    for k in hb:
        if k not in ha:
            out.add(s, k, "added", "", None, hb[k], "minor", "harness added")
    for k in (k for k in ha if k in hb):
        x, y = ha[k], hb[k]
        for f in ("property", "description"):
            out.text(s, k, f, x.get(f), y.get(f))
        out.number(s, k, "bound", x.get("bound"), y.get("bound"), larger="minor",
                   why="deeper bound")
        for f in ("obligation", "strategy", "solver", "harness"):
            out.opaque(s, k, f, x.get(f), y.get(f), why=f"harness {f} changed")


def _qa_gate(out: _Out, a: Contract, b: Contract):
    s = "qa_gate"
    x, y = _d(a.raw.get("qa_gate")), _d(b.raw.get("qa_gate"))
    if x and not y:
        out.add(s, "", "removed", "", x, None, "major", "quality gate removed")
        return
    if y and not x:
        out.add(s, "", "added", "", None, y, "minor", "quality gate added")
        return
    out.members(s, "", "checks", x.get("checks"), y.get("checks"), noun="gate check")
    for f in ("id", "name", "description", "pass_criteria", "falsification"):
        out.text(s, "", f, x.get(f), y.get(f))


def _enforcement(out: _Out, a: Contract, b: Contract):
    s = "enforcement"
    x, y = _d(a.raw.get("enforcement")), _d(b.raw.get("enforcement"))
    for k in x:
        if k not in y:
            out.add(s, k, "removed", "", x[k], None, "major", "rule removed")
    for k in y:
        if k not in x:
            out.add(s, k, "added", "", None, y[k], "minor", "rule added")
    for k in (k for k in x if k in y):
        for f in ("description", "reference"):
            out.text(s, k, f, _d(x[k]).get(f), _d(y[k]).get(f))
        for f in ("check", "severity"):
            out.opaque(s, k, f, _d(x[k]).get(f), _d(y[k]).get(f), why=f"rule {f} changed")


def _phases(out: _Out, a: Contract, b: Contract):
    s = "kernel_structure"

    def phases(c):
        ph = _d(c.raw.get("kernel_structure")).get("phases")
        return _keyed(_as_list(ph), lambda i, p: str(_d(p).get("name", f"#{i}")))

    x, y = phases(a), phases(b)
    for k in x:
        if k not in y:
            out.add(s, k, "removed", "", x[k], None, "major", "phase removed")
    for k in y:
        if k not in x:
            out.add(s, k, "added", "", None, y[k], "minor", "phase added")
    for k in (k for k in x if k in y):
        out.text(s, k, "description", _d(x[k]).get("description"), _d(y[k]).get("description"))
        out.text(s, k, "invariant", _d(x[k]).get("invariant"), _d(y[k]).get("invariant"),
                 "major", "phase invariant changed")


SECTIONS = {"metadata", "equations", "inputs", "proof_obligations", "falsification_tests",
            "mutants", "kani_harnesses", "qa_gate", "enforcement", "kernel_structure"}
OTHER_BUMPS = {"verification_summary": "patch", "simd_dispatch": "minor"}


def diff(a: Contract, b: Contract) -> DiffResult:
    out = _Out()
    for f in (_metadata, _equations, _inputs, _obligations, _checks, _mutants, _kani,
              _qa_gate, _enforcement, _phases):
        f(out, a, b)
    for k in sorted((set(a.raw) | set(b.raw)) - SECTIONS, key=str):
        out.opaque(str(k), "", "", a.raw.get(k), b.raw.get(k), OTHER_BUMPS.get(k, "major"),
                   "section changed")
    res = DiffResult(a, b, out.changes)
    res.problems = _version_problems(res)
    return res


def _version_problems(res: DiffResult) -> list[str]:
    old, new = res.old.version, res.new.version
    if _semver(new) is None:
        return [f"NEW version {new!r} is not semver, so it cannot carry a bump"]
    if _semver(old) is None:
        return [f"OLD version {old!r} is not semver, so the bump cannot be checked"]
    declared, required = res.declared, res.required
    if declared == "backwards":
        return [f"version went backwards: {old} -> {new}"]
    if RANK[declared] < RANK[required]:
        n = sum(c.bump == required for c in res.changes)
        return [f"{n} change(s) need a {required} bump ({old} -> {res.suggested_version} or "
                f"later), but NEW's version {new} is only a {declared} bump"
                if declared != "none" else
                f"{n} change(s) need a {required} bump ({old} -> {res.suggested_version} or "
                f"later), but NEW's version is still {new}"]
    return []


def render_text(res: DiffResult) -> str:
    a, b = res.old, res.new
    name = a.id if a.id == b.id else f"{a.id} -> {b.id}"
    lines = [f"{name}: {a.version or '?'} -> {b.version or '?'}"]
    if not res.changes:
        lines.append("  no changes")
    order = {s: i for i, s in enumerate(
        ["metadata", "equations", "inputs", "proof_obligations", "falsification_tests",
         "mutants", "kani_harnesses", "qa_gate", "enforcement", "kernel_structure"])}
    for c in sorted(res.changes, key=lambda c: (order.get(c.section, 99), c.section, c.key)):
        lines.append(str(c))
    counts = ", ".join(f"{sum(c.bump == bmp for c in res.changes)} {bmp}"
                       for bmp in ("major", "minor", "patch"))
    lines.append(f"required bump: {res.required} ({counts}); "
                 f"declared: {res.declared or 'n/a'}"
                 + (f"; suggested version: {res.suggested_version}"
                    if res.suggested_version and res.required != "none" else ""))
    return "\n".join(lines)


__all__ = ["diff", "DiffResult", "Change", "declared_bump", "bump_version", "render_text",
           "BUMPS"]
