"""The user's project: where contracts, generated tests, the ledger and docs pages live.

A project is declared by a `[tool.falsify]` table in `pyproject.toml`, or by a `falsify.toml`
holding the same keys at top level, found by walking up from the working directory (the
nearest directory that declares one wins; within one directory `falsify.toml` wins over
`pyproject.toml`). Every relative path resolves from the directory of that file:

    [tool.falsify]
    contracts = ["contracts"]           # project contract directories
    generated = "tests/generated"       # generated modules of the project's own contracts
    ledger = ".falsify/ledger.json"     # results ledger
    docs = "site/docs/contracts"        # generated contract pages
    backends = ["reference", "torch", "triton"]   # default backends for `falsify run`
    profile = "fast"                    # default hypothesis profile (fast | ci | thorough)
    overrides = []                      # project contract ids that replace library ids
    evidence = []                       # committed ledgers (paths or globs) the docs publish
    equivalent_mutants = "equivalent-mutants.yaml"  # `falsify mutate`'s declared equivalents
    # conformance = a committed `falsify conformance` ledger (no default): its docs page

`evidence` names ledgers committed with the project, each carrying its provenance (commit,
profile, date): `pv generate` builds the docs pages from them (falsify.harness.evidence), not
from the local `ledger`, whose results nobody else can see. `conformance` names a committed
conformance ledger (`falsify conformance --ledger`): `pv generate` writes the conformance
page from it; none (the default), no page.

Every key is optional (the defaults are shown). Commands
that write (run, mutants, generate) need a project; read-only verbs work on the files they are
given without one. Nothing is ever written inside the installed package: the contract library
(`library_dir()`) is read-only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import jsonschema

from falsify.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, as a backport
    import tomli as tomllib

PROFILES = ("fast", "ci", "thorough")
BACKENDS = ("reference", "torch", "triton")
DEFAULTS = {"contracts": ["contracts"], "generated": "tests/generated",
            "ledger": ".falsify/ledger.json", "docs": "site/docs/contracts",
            "backends": list(BACKENDS), "profile": "fast", "overrides": [], "evidence": [],
            "equivalent_mutants": "equivalent-mutants.yaml"}

_STR_LIST = {"type": "array", "items": {"type": "string", "minLength": 1}}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "contracts": {**_STR_LIST, "minItems": 1},
        "generated": {"type": "string", "minLength": 1},
        "ledger": {"type": "string", "minLength": 1},
        "docs": {"type": "string", "minLength": 1},
        "backends": {"type": "array", "items": {"enum": list(BACKENDS)}, "minItems": 1,
                     "uniqueItems": True},
        "profile": {"enum": list(PROFILES)},
        "overrides": {**_STR_LIST, "uniqueItems": True},
        "evidence": {**_STR_LIST, "uniqueItems": True},
        "equivalent_mutants": {"type": "string", "minLength": 1},
        "conformance": {"type": "string", "minLength": 1},
    },
}


class ProjectError(UsageError):
    """A project file that cannot be read or declares bad keys (exit 2, one line)."""


@dataclass(frozen=True)
class Project:
    root: Path
    contract_dirs: tuple[Path, ...]
    generated_dir: Path
    ledger_path: Path
    docs_dir: Path
    backends: tuple[str, ...]
    profile: str
    overrides: tuple[str, ...]
    source: Path  # the falsify.toml or pyproject.toml it came from
    evidence: tuple[str, ...] = ()  # paths or globs relative to `root`, as declared
    # mutants `falsify mutate` made that cannot change what the code computes, each with why
    # (falsify/harness/equivalents.py); None: the default file, which may be absent
    equivalent_mutants: Path | None = None
    conformance: Path | None = None  # the committed conformance ledger the docs page shows

    @property
    def state_dir(self) -> Path:
        """Local state, never committed (`falsify init` adds it to .gitignore): hypothesis'
        examples, caches, and the modules of `scratch_generated_dir`."""
        return self.root / ".falsify"

    @property
    def equivalents_path(self) -> Path:
        return self.equivalent_mutants or self.root / DEFAULTS["equivalent_mutants"]

    @property
    def scratch_generated_dir(self) -> Path:
        """Where `falsify run` generates the test modules of contracts that are not the
        project's own (library contracts, files outside its contract directories): the
        `generated` dir holds exactly what `pv generate` writes, and `pv generate --check`
        guards it."""
        return self.state_dir / "generated"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProjectError(f"{path}: cannot read: {e}") from None


def _table(path: Path, text: str) -> dict | None:
    """The falsify table of `path` (whose text is `text`), or None when a pyproject.toml
    declares none."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProjectError(f"{path}: not valid TOML: {e}") from None
    if path.name == "falsify.toml":
        return data
    tool = data.get("tool")
    table = tool.get("falsify") if isinstance(tool, dict) else None
    if table is not None and not isinstance(table, dict):
        raise ProjectError(f"{path}: [tool.falsify] must be a table")
    return table


def _schema_error(path: Path, table: dict) -> str | None:
    prefix = "" if path.name == "falsify.toml" else "tool.falsify."
    err = jsonschema.exceptions.best_match(_validator().iter_errors(table))
    if err is None:
        return None
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(SCHEMA["properties"]))
        return (f"{path}: unknown key {prefix + extra[0]!r} (known: "
                f"{', '.join(SCHEMA['properties'])})")
    key = ".".join(str(p) for p in err.absolute_path)
    return f"{path}: {prefix}{key}: {err.message}"


@cache
def _validator():
    return jsonschema.Draft202012Validator(SCHEMA)


# (file, its text) -> the project it declares. A command asks for its project many times (the
# fingerprint of every check does), and a validated file that still reads the same declares
# the same project; an edited one is read afresh.
_LOADED: dict[tuple[Path, str], Project | None] = {}


def load(path: Path) -> Project | None:
    """The project declared by one file; None for a pyproject.toml without [tool.falsify]."""
    path = Path(path).resolve()
    text = _read(path)
    if (path, text) not in _LOADED:
        _LOADED[(path, text)] = _load(path, text)
    return _LOADED[(path, text)]


def _load(path: Path, text: str) -> Project | None:
    table = _table(path, text)
    if table is None:
        return None
    err = _schema_error(path, table)
    if err:
        raise ProjectError(err)
    cfg = {**DEFAULTS, **table}
    root = path.parent

    def at(p: str) -> Path:
        return (root / p).resolve()

    return Project(root=root, contract_dirs=tuple(at(d) for d in cfg["contracts"]),
                   generated_dir=at(cfg["generated"]), ledger_path=at(cfg["ledger"]),
                   docs_dir=at(cfg["docs"]), backends=tuple(cfg["backends"]),
                   profile=cfg["profile"], overrides=tuple(cfg["overrides"]), source=path,
                   evidence=tuple(cfg["evidence"]),
                   equivalent_mutants=(at(table["equivalent_mutants"])
                                       if "equivalent_mutants" in table else None),
                   conformance=at(table["conformance"]) if "conformance" in table else None)


def find_project(start: Path | None = None) -> Project | None:
    """The nearest project at or above `start` (default: the working directory)."""
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        for name in ("falsify.toml", "pyproject.toml"):
            f = d / name
            if f.is_file():
                project = load(f)
                if project is not None:
                    return project
    return None


def require_project(action: str) -> Project:
    """The current project, or a usage error that says how to make one."""
    project = find_project()
    if project is None:
        raise UsageError(f"{action} needs a project, and none was found from {Path.cwd()} "
                         "(no falsify.toml, and no pyproject.toml with [tool.falsify], here or "
                         "above): run `falsify init` to create one")
    return project


@cache
def library_dir() -> Path:
    """The contract library shipped with falsify (package data of `falsify.contracts`)."""
    lib = resources.files("falsify.contracts")
    path = Path(str(lib))
    if not (path.is_dir() and (path / "contract.schema.json").is_file()):
        raise RuntimeError(f"falsify's contract library is not a directory on disk ({lib}); "
                           "install falsify unzipped")
    return path.resolve()


# --------------------------------------------------------------------------------- id space
CONTRACT_SUFFIXES = (".yaml", ".yml")


def _files(d: Path) -> list[Path]:
    return sorted(p.resolve() for p in d.rglob("*") if p.suffix in CONTRACT_SUFFIXES
                  and p.is_file()) if d.is_dir() else []


def _stem(p: Path) -> str:
    return p.name.rsplit(".", 1)[0]


def library_files() -> dict[str, Path]:
    """Contract id -> file, for every contract in the shipped library."""
    return {_stem(p): p for p in _files(library_dir())}


def project_files(project: Project) -> dict[str, Path]:
    """Contract id -> file in the project's contract directories. An id found twice is an
    error naming both files."""
    out: dict[str, Path] = {}
    for d in project.contract_dirs:
        for p in _files(d):
            cid = _stem(p)
            if cid in out and out[cid] != p:
                raise ProjectError(f"contract id {cid!r} is defined twice: {out[cid]} and {p}")
            out[cid] = p
    return out


@dataclass(frozen=True)
class Entry:
    id: str
    path: Path
    origin: str  # "library" | "project" | "overrides library"


def id_space(project: Project | None) -> dict[str, Entry]:
    """Every contract id the project can name: the library's and the project's, one id space.
    A project contract with a library id is an error naming both files unless the project
    lists the id in `overrides`. A project directory that is the library directory (an
    editable checkout of falsify itself) holds the same files: no clash."""
    lib = library_files()
    space = {cid: Entry(cid, p, "library") for cid, p in lib.items()}
    if project is None:
        return space
    for cid, p in project_files(project).items():
        if cid in lib and lib[cid] != p:
            if cid not in project.overrides:
                raise ProjectError(
                    f"contract id {cid!r} is both a project contract ({p}) and a library "
                    f"contract ({lib[cid]}): rename it, or list it under `overrides` in "
                    f"{project.source} to replace the library contract deliberately")
            space[cid] = Entry(cid, p, "overrides library")
        elif cid not in lib:
            space[cid] = Entry(cid, p, "project")
    return space


def project_contracts(project: Project) -> list[Path]:
    """The contract files the project itself declares (its directories), sorted by id."""
    return [p for _, p in sorted(project_files(project).items())]


def resolve_id(name: str, project: Project | None) -> Path | None:
    """The file of a bare contract id (`softmax-kernel-v1`, `.yaml` optional)."""
    e = id_space(project).get(name.removesuffix(".yaml").removesuffix(".yml"))
    return e.path if e else None


def default_paths(paths: list, whole_space: bool = False) -> list:
    """The contracts a verb works on when none are named: the project's contract directories
    (with `whole_space`, every id the project can name: its contracts and the library's);
    without a project, the library."""
    if paths:
        return list(paths)
    proj = find_project()
    space = id_space(proj)  # a project/library clash is an error whatever the verb
    if whole_space:
        return [e.path for _, e in sorted(space.items())]
    if proj is not None:
        return list(proj.contract_dirs)
    return [library_dir()]
