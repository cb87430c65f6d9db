"""The typed contract model: what every `pv` verb and `falsify` command works on.

`load_contract` reads one file (native or compat mode), validates it against the JSON Schema and
returns a `Contract` plus the list of `Finding`s. Semantic rules live in `validate.py`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import jsonschema

from falsify.errors import UsageError
from falsify.harness import yamlio
from falsify.harness.project import find_project, library_dir, resolve_id
from falsify.harness.stamp_cache import StampCache

BACKENDS = ("reference", "torch", "triton")
MAX_SCHEMA_FINDINGS = 100
MAX_SCHEMA_ERRORS = 20_000

# Keys only the native format has: their presence means the author wrote a falsify contract.
NATIVE_MARKERS = ("inputs", "mutants")


@dataclass(frozen=True)
class Finding:
    """One validation message. `rule` is stable (V0xx errors, W1xx warnings)."""

    rule: str
    severity: str  # "error" | "warning"
    path: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.severity} {self.rule} [{self.field}] {self.message}"

    def as_dict(self) -> dict:
        return dict(rule=self.rule, severity=self.severity, file=self.path, line=self.line,
                    field=self.field, message=self.message)


@dataclass(frozen=True)
class EquationVariant:
    """A different, documented convention of an equation that some implementation follows:
    `pins` fix input arguments to the one value it is defined at, `reference` (optional) is its
    own float64 reference. Judged by the equation's checks and derived bounds unchanged."""

    name: str
    convention: str
    pins: dict = field(default_factory=dict)
    reference: str | None = None


@dataclass
class Equation:
    name: str
    formula: str
    latex: str | None = None
    domain: str | None = None
    codomain: str | None = None
    invariants: list[str] = field(default_factory=list)
    derivation: str | None = None
    bindings: dict[str, str] = field(default_factory=dict)
    gpu_only: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)  # names of a tuple's outputs, in order
    # outputs that are saved statistics, returned without an autograd graph
    non_differentiable: list[str] = field(default_factory=list)
    # floating outputs the optimized backends return in the dtype the inputs came in (True:
    # every output); the parity kind checks it
    keeps_dtype: bool | list[str] = False
    variants: dict[str, EquationVariant] = field(default_factory=dict)


@dataclass
class Obligation:
    id: str
    type: str
    property: str
    formal: str | None = None
    tolerance: object = None
    applies_to: list[str] = field(default_factory=list)
    derived_id: bool = False
    index: int = 0
    judges: str | None = None  # math | policy, when the contract says; see plan.judges


@dataclass
class Check:
    """A falsification test. `spec` is the executable `check:` block (None in compat mode)."""

    id: str
    rule: str
    prediction: str
    obligation: str | None
    if_fails: str | None
    test: str | None
    spec: dict | None
    index: int = 0

    @property
    def kind(self) -> str | None:
        return self.spec.get("kind") if self.spec else None


@dataclass
class Mutant:
    id: str
    obligation: str
    replaces: str  # "<equation>.<backend>"
    with_: str
    description: str
    source: str | None = None
    index: int = 0

    @property
    def equation(self) -> str:
        return self.replaces.rsplit(".", 1)[0]

    @property
    def backend(self) -> str:
        # "" when `replaces` has no dot (the schema reports it; callers must not crash)
        parts = self.replaces.rsplit(".", 1)
        return parts[1] if len(parts) == 2 else ""


@dataclass
class Contract:
    id: str
    path: Path
    mode: str  # "native" | "compat"
    sha256: str
    raw: dict
    located: yamlio.Located
    version: str
    description: str
    references: list[str]
    depends_on: list[str]
    kernel: str | None
    status: str
    critical: bool
    equations: dict[str, Equation]
    inputs: dict[str, dict]
    obligations: list[Obligation]
    checks: list[Check]
    mutants: list[Mutant]
    kani_harnesses: list[dict]
    qa_gate: dict | None
    inapplicable: dict[str, str] = field(default_factory=dict)  # check kind -> why not
    fixtures: list[str] = field(default_factory=list)  # data files, relative to the contract

    def fixture_path(self, name: str) -> Path:
        return self.path.parent / name

    def line(self, *path) -> int:
        return self.located.line_of(path)

    def obligation(self, oid: str) -> Obligation | None:
        return next((o for o in self.obligations if o.id == oid), None)

    def check(self, cid: str) -> Check | None:
        return next((c for c in self.checks if c.id == cid), None)

    def checks_for(self, oid: str) -> list[Check]:
        return [c for c in self.checks if c.obligation == oid and c.spec]

    @property
    def symbolic_checks(self) -> list[Check]:
        return [c for c in self.checks if c.kind == "symbolic"]


class ContractError(Exception):
    """A file that cannot be turned into a Contract at all (unreadable, not a mapping)."""

    def __init__(self, finding: Finding):
        self.finding = finding
        super().__init__(str(finding))


def schema_path() -> Path:
    return library_dir() / "contract.schema.json"


@cache
def schema() -> dict:
    return json.loads(schema_path().read_text())


def detect_mode(data: dict) -> str:
    if any(k in data for k in NATIVE_MARKERS):
        return "native"
    eqs = data.get("equations")
    if isinstance(eqs, dict) and any(isinstance(e, dict) and "bindings" in e for e in eqs.values()):
        return "native"
    obs = data.get("proof_obligations")
    if isinstance(obs, list) and any(isinstance(o, dict) and "id" in o for o in obs):
        return "native"
    return "compat"


def json_path(parts) -> str:
    """`proof_obligations[2].tolerance`: the spelling the semantic rules use too."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def schema_errors(data) -> list:
    """Every JSON Schema error in `data` (bounded: the loader caps a document's size)."""
    return list(itertools.islice(_validator().iter_errors(data), MAX_SCHEMA_ERRORS))


def schema_findings(loc: yamlio.Located, path: str, mode: str,
                    errors: list | None = None) -> list[Finding]:
    """JSON Schema errors, pointed at file:line. In compat mode unknown keys and wrong
    types inside pv's free-text sections are warnings (pv ignored them too)."""
    out = []
    errors = schema_errors(loc.data) if errors is None else errors
    # a pathological file can produce an error per node: report a readable number of them
    if len(errors) > MAX_SCHEMA_FINDINGS:
        errors = errors[:MAX_SCHEMA_FINDINGS]
        out.append(Finding("V002" if mode == "native" else "W102",
                           "error" if mode == "native" else "warning", path, 1, "<root>",
                           f"more than {MAX_SCHEMA_FINDINGS} schema violations; "
                           "only the first are listed"))
    for err in sorted(errors, key=lambda e: list(map(str, e.path))):
        where = list(err.absolute_path)
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            for key in extra:
                sev = "error" if mode == "native" else "warning"
                rule = "V003" if mode == "native" else "W103"
                out.append(Finding(rule, sev, path, loc.line_of(where + [key]),
                                   json_path(where + [key]), f"unknown key {key!r}"))
            continue
        required_missing = err.validator == "required"
        sev = "error"
        if mode == "compat" and not (required_missing and len(where) <= 1):
            sev = "warning"  # pv's own loader would still have read this file
        rule = "V002" if sev == "error" else "W102"
        msg = err.message if len(err.message) < 200 else err.message[:197] + "..."
        out.append(Finding(rule, sev, path, loc.line_of(where), json_path(where), msg))
    return out


def _prefix(stem: str, data: dict) -> str:
    """The id prefix of a compat contract: from its falsification ids, else its stem."""
    for t in _list(data.get("falsification_tests")):
        if isinstance(t, dict) and isinstance(t.get("id"), str):
            m = re.match(r"^FALSIFY-(.+)-\d+$", t["id"])
            if m:
                return m.group(1)
    words = [w for w in re.split(r"[-_]", stem) if w and not re.fullmatch(r"v\d+", w)]
    return "".join(w[0] for w in words).upper() or "C"


TYPE_ABBR = {"invariant": "INV", "equivalence": "EQV", "bound": "BND", "monotonicity": "MON",
             "idempotency": "IDM", "linearity": "LIN", "symmetry": "SYM", "associativity": "ASC",
             "conservation": "CNS", "ordering": "ORD", "completeness": "CMP", "soundness": "SND"}


def _str(x) -> str | None:
    return x if isinstance(x, str) else (None if x is None else str(x))


def _text(x) -> str:
    """A free-text list item. `- For V=32000: saves 500 MB` is a one-key mapping to YAML;
    the author meant the sentence."""
    if isinstance(x, dict) and len(x) == 1:
        k, v = next(iter(x.items()))
        return f"{k}: {v}"
    return str(x)


def _variants(raw) -> dict[str, EquationVariant]:
    """An equation's `variants` (schema errors are reported by the schema; what is malformed
    here is left out, never guessed)."""
    out = {}
    for name, v in (raw or {}).items() if isinstance(raw, dict) else ():
        if isinstance(v, dict):
            pins = v.get("pins")
            out[str(name)] = EquationVariant(
                name=str(name), convention=_str(v.get("convention")) or "",
                pins=dict(pins) if isinstance(pins, dict) else {},
                reference=v["reference"] if isinstance(v.get("reference"), str) else None)
    return out


def well_typed(value, defname: str, at: tuple = (), bad: set | None = None) -> dict | None:
    """The fields of `value` that satisfy their part of `$defs/<defname>` (unknown or
    ill-typed fields dropped); None if `value` is not a mapping. `bad` holds the paths of the
    document's schema errors and `at` is where `value` sits in it; without them `value` is
    validated on its own. The schema findings report what was dropped; semantic rules, the
    planner and the runtime then only ever see well-typed fields, so a `backends: 3` or
    `input: [a]` cannot crash them."""
    if not isinstance(value, dict):
        return None
    props = schema()["$defs"][defname].get("properties", {})
    if bad is None:
        doc = {"$defs": schema()["$defs"], "$ref": f"#/$defs/{defname}"}
        errors = jsonschema.Draft202012Validator(doc).iter_errors(value)
        bad, at = {tuple(e.absolute_path) for e in errors}, ()
    n = len(at)
    dropped = {p[n] for p in bad if len(p) > n and p[:n] == at}
    return {k: v for k, v in value.items() if k in props and k not in dropped}


def build_contract(path: Path, loc: yamlio.Located, mode: str,
                   errors: list | None = None) -> Contract:
    """Turn validated data into the typed model. Tolerant of compat-mode gaps. `errors`: the
    document's schema errors, if already computed."""
    data = loc.data
    bad = {tuple(e.absolute_path) for e in (schema_errors(data) if errors is None else errors)}
    stem = path.name.rsplit(".", 1)[0]
    md = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    eqs = _build_equations(data)
    prefix = _prefix(stem, data)
    obligations = _build_obligations(data, prefix)
    checks = _build_checks(data, prefix, bad)
    mutants = _build_mutants(data, prefix)
    deps = md.get("depends_on")
    refs = md.get("references")
    return Contract(
        id=stem, path=path, mode=mode, sha256=hashlib.sha256(path.read_bytes()).hexdigest()
        if path.exists() else "", raw=data, located=loc,
        version=_str(md.get("version")) or "", description=_str(md.get("description")) or "",
        references=[str(r) for r in refs] if isinstance(refs, list) else [],
        depends_on=[str(d) for d in deps] if isinstance(deps, list) else [],
        kernel=_str(md.get("kernel")), status=_str(md.get("status")) or "draft",
        critical=bool(md.get("critical", False)), equations=eqs,
        inputs={str(k): well_typed(v, "input", ("inputs", k), bad)
                for k, v in data["inputs"].items() if isinstance(v, dict)}
        if isinstance(data.get("inputs"), dict) else {},
        obligations=obligations, checks=checks, mutants=mutants,
        # indices kept (a non-mapping becomes {}) so kani_harnesses[i] still names its line
        kani_harnesses=[well_typed(h, "kani_harness", ("kani_harnesses", i), bad) or {}
                        for i, h in enumerate(_list(data.get("kani_harnesses")))],
        qa_gate=well_typed(data.get("qa_gate"), "qa_gate", ("qa_gate",), bad),
        inapplicable={str(k): str(v) for k, v in md["inapplicable"].items()}
        if isinstance(md.get("inapplicable"), dict) else {},
        fixtures=[f for f in _list(md.get("fixtures")) if isinstance(f, str)],
    )


def _build_equations(data: dict) -> dict[str, Equation]:
    """The equations by name; a malformed field becomes empty (the schema findings say so)."""
    eqs = {}
    for name, e in (data.get("equations") or {}).items() if isinstance(data.get("equations"),
                                                                       dict) else []:
        e = e if isinstance(e, dict) else {}
        inv = e.get("invariants")
        eqs[str(name)] = Equation(
            name=str(name), formula=_str(e.get("formula")) or "", latex=_str(e.get("latex")),
            domain=_str(e.get("domain")), codomain=_str(e.get("codomain")),
            invariants=[_text(i) for i in inv] if isinstance(inv, list) else [],
            derivation=_str(e.get("derivation")),
            bindings={k: v for k, v in (e.get("bindings") or {}).items() if isinstance(v, str)}
            if isinstance(e.get("bindings"), dict) else {},
            gpu_only=dict(e.get("gpu_only") or {}) if isinstance(e.get("gpu_only"), dict) else {},
            outputs=[o for o in e["outputs"] if isinstance(o, str)]
            if isinstance(e.get("outputs"), list) else [],
            non_differentiable=[o for o in e["non_differentiable"] if isinstance(o, str)]
            if isinstance(e.get("non_differentiable"), list) else [],
            keeps_dtype=(e["keeps_dtype"] is True if isinstance(e.get("keeps_dtype"), bool)
                         else [o for o in e["keeps_dtype"] if isinstance(o, str)]
                         if isinstance(e.get("keeps_dtype"), list) else False),
            variants=_variants(e.get("variants")),
        )
    return eqs


def _build_obligations(data: dict, prefix: str) -> list[Obligation]:
    """The proof obligations, each with its id, derived where the contract gives none."""
    obligations, counters = [], {}
    raw_obs = _list(data.get("proof_obligations"))
    # derived ids: PREFIX-ABBR-NNN numbered per type in file order (same file -> same ids),
    # skipping numbers an explicit id already uses
    taken = {_str(o.get("id")) for o in raw_obs if isinstance(o, dict) and o.get("id")}
    for i, o in enumerate(raw_obs):
        o = o if isinstance(o, dict) else {}
        otype = _str(o.get("type")) or "invariant"
        oid, derived = _str(o.get("id")), False
        while not oid or (derived and oid in taken):
            counters[otype] = counters.get(otype, 0) + 1
            oid = f"{prefix}-{TYPE_ABBR.get(otype, 'OBL')}-{counters[otype]:03d}"
            derived = True
        at = o.get("applies_to")
        applies = [at] if isinstance(at, str) else [str(a) for a in at] if isinstance(at,
                                                                                       list) else []
        obligations.append(Obligation(oid, otype, _str(o.get("property")) or "",
                                      _str(o.get("formal")), o.get("tolerance"), applies, derived,
                                      i, _str(o.get("judges"))))
    return obligations


def _build_checks(data: dict, prefix: str, bad: set) -> list[Check]:
    """The falsification tests, each with its id (derived where none is given) and its
    well-typed check spec."""
    checks = []
    raw_tests = _list(data.get("falsification_tests"))
    taken = {_str(t.get("id")) for t in raw_tests if isinstance(t, dict) and t.get("id")}
    for i, t in enumerate(raw_tests):
        t = t if isinstance(t, dict) else {}
        spec = well_typed(t.get("check"), "check", ("falsification_tests", i, "check"), bad)
        cid, n = _str(t.get("id")), i + 1
        while not cid or (cid in taken and not t.get("id")):
            cid, n = f"FALSIFY-{prefix}-{n:03d}", n + 1
        checks.append(Check(cid,
                            _str(t.get("rule")) or "", _str(t.get("prediction")) or "",
                            _str(t.get("obligation")), _str(t.get("if_fails")),
                            _str(t.get("test")), spec, i))
    return checks


def _build_mutants(data: dict, prefix: str) -> list[Mutant]:
    """The declared mutants (entries that are not mappings are skipped)."""
    mutants = []
    for i, m in enumerate(_list(data.get("mutants"))):
        if isinstance(m, dict):
            mutants.append(Mutant(_str(m.get("id")) or f"MUT-{prefix}-{i + 1:03d}",
                                  _str(m.get("obligation")) or "", _str(m.get("replaces")) or ".",
                                  _str(m.get("with")) or "", _str(m.get("description")) or "",
                                  _str(m.get("source")), i))
    return mutants


def _list(x) -> list:
    return x if isinstance(x, list) else []


def load_contract(path: str | Path, mode: str | None = None) -> tuple[Contract, list[Finding]]:
    """Read, schema-check and model one contract file. Raises ContractError only when the file
    cannot be read as a YAML mapping at all; everything else becomes a Finding."""
    path = Path(path)
    spath = str(path)

    def unreadable(e: yamlio.YamlError) -> ContractError:
        return ContractError(Finding("V001", "error", spath, e.line or 1, "<file>", e.message))

    try:
        text = yamlio.read_text(path)
        loc = _parse(text, spath)
    except yamlio.YamlError as e:
        # pv files sometimes write `formula: |x| < eps` unquoted. Compat mode re-reads such
        # lines as strings (W110); a native contract must be valid YAML.
        if not e.repairable or mode == "native":
            raise unreadable(e) from None
        try:
            loc = _parse(text, spath, repair=True)
        except yamlio.YamlError:
            raise unreadable(e) from None
        if not isinstance(loc.data, dict) or (mode or detect_mode(loc.data)) == "native":
            raise unreadable(e) from None
    if not isinstance(loc.data, dict):
        raise ContractError(Finding("V001", "error", spath, 1, "<root>",
                                    f"a contract is a mapping, got {type(loc.data).__name__}"))
    mode = mode or detect_mode(loc.data)
    findings = [Finding("W110", "warning", spath, line, "<yaml>", msg)
                for line, msg in loc.repairs]
    for where, line in loc.duplicates:
        sev, rule = ("error", "V004") if mode == "native" else ("warning", "W104")
        findings.append(Finding(rule, sev, spath, line, json_path(where),
                                f"duplicate key {where[-1]!r}: YAML keeps only the last value"))
    errors = [] if _known_schema_clean(text) else schema_errors(loc.data)
    if not errors:
        _remember_schema_clean(text)
    findings += schema_findings(loc, spath, mode, errors)
    return build_contract(path, loc, mode, errors), findings


# Parsing is most of loading a contract (libyaml composes the nodes, then every value is
# built with its line): about 30 ms a file, a second for the library, paid by every `pv`
# command and every worker. A text parses the same way every time, so the result is kept as
# JSON in the user's cache directory (falsify/harness/stamp_cache.py), by the sha256 of the
# text, in the scope of the parser's own source: a change to how YAML is read drops it all.
# A text that does not parse is not kept; its error is raised afresh.
@cache
def _parse_store() -> StampCache:
    return StampCache("contract-parse", hashlib.sha256(
        Path(yamlio.__file__).read_bytes()).hexdigest(), max_entries=500)


def _parse(text: str, spath: str, repair: bool = False) -> yamlio.Located:
    key = hashlib.sha256(f"{int(repair)}\0{text}".encode()).hexdigest()
    hit = _parse_store().get(key)
    if isinstance(hit, dict):
        try:
            return yamlio.Located.from_json(hit)
        except (KeyError, TypeError, ValueError):
            pass  # an entry someone edited by hand is a miss, not a crash
    loc = yamlio.load(text, spath, repair=repair)
    _parse_store().put(key, loc.to_json(), set())
    return loc


# Checking a contract against the JSON Schema is a third of loading it. A text that passed
# once passes again under the same schema: remembered by the sha256 of the text (and of the
# schema, in the cache's scope), in the user's cache directory (falsify/harness/stamp_cache.py).
@cache
def _schema_store() -> StampCache:
    return StampCache("schema-clean", hashlib.sha256(schema_path().read_bytes()).hexdigest())


def _known_schema_clean(text: str) -> bool:
    return _schema_store().get(hashlib.sha256(text.encode()).hexdigest()) is True


def _remember_schema_clean(text: str) -> None:
    _schema_store().put(hashlib.sha256(text.encode()).hexdigest(), True, set())


def content_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class DuplicateContractId(UsageError):
    """Two different files named on the command line define the same contract id."""


def resolve_arg(p: str | Path) -> Path:
    """A command-line contract argument: an existing path as given, else a bare contract id
    (`softmax-kernel-v1`) naming a contract of the current project or of the library."""
    p = Path(p)
    if p.exists() or len(p.parts) != 1:
        return p
    return resolve_id(p.name, find_project()) or p


def discover(paths: list[str | Path]) -> list[Path]:
    """Contract files named by `paths` (files, directories searched recursively, or contract
    ids: see resolve_arg). A contract id found in two different files is an error naming
    both: merging them silently would check one and ignore the other."""
    out = []
    for p in paths:
        p = resolve_arg(p)
        if p.is_dir():
            out += sorted(q for q in p.rglob("*") if q.suffix in (".yaml", ".yml") and q.is_file())
        else:
            out.append(p)
    seen, ids, uniq = set(), {}, []
    for p in out:
        r = p.resolve()
        if r in seen:
            continue
        seen.add(r)
        cid = p.name.rsplit(".", 1)[0]
        if cid in ids:
            raise DuplicateContractId(f"contract id {cid!r} is defined twice: {ids[cid]} and {p}")
        ids[cid] = p
        uniq.append(p)
    return uniq
