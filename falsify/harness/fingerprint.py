"""What a result was computed from: a hash of the implementation a check exercised.

`impl_hash(contract, backend, check)` covers the source of what the check executes: for a
symbolic check its `target`, for a static check its `kernel`, otherwise every binding on that
backend and on `reference` (the oracle most checks compare against) plus a training check's
`run:` probe; for a mutant, its replacement as well. The local modules those import count too,
transitively: the modules of the project and of falsify itself, not third-party packages.
The ledger stores it with each entry; `pv coverage` calls an entry whose hash no longer
matches `stale`, and `falsify run --changed` re-runs only what has no passing entry for the
current hashes.

Modules are found with importlib's finders and read as source; nothing is imported beyond the
parent packages `find_spec` needs.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import site
import sys
import sysconfig
from functools import cache
from pathlib import Path

from falsify.harness.model import Check, Contract, Mutant

_FALSIFY_TREE = Path(__file__).resolve().parents[1]


def _site_dirs() -> tuple[Path, ...]:
    dirs = {*site.getsitepackages(), site.getusersitepackages(),
            *(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))}
    return tuple(Path(d).resolve() for d in dirs if d)


_SITE = _site_dirs()


def _local(path: Path, roots: tuple[Path, ...]) -> bool:
    """Under a root, and not a third-party package: a virtual environment inside a checkout (an
    editable install's `.venv/`) or a user's project holds site-packages below the root, and
    those are not the project's code. A root that is itself in site-packages (falsify installed
    from a wheel) still counts its own files."""
    return any(path.is_relative_to(r)
               and not any(path.is_relative_to(s) and not r.is_relative_to(s) for s in _SITE)
               for r in roots)


def _roots() -> tuple[Path, ...]:
    from falsify.harness import handover, project

    m = handover.active()
    if m is not None:
        return (Path(m.project_root), _FALSIFY_TREE)
    p = project.find_project()
    return (p.root, _FALSIFY_TREE) if p else (_FALSIFY_TREE,)


@cache
def _module_file(name: str, roots: tuple[Path, ...]) -> Path | None:
    """The source file of a local module (under one of `roots`), else None."""
    for r in roots:
        if str(r) not in sys.path and r != _FALSIFY_TREE:
            sys.path.insert(0, str(r))  # the project's own modules, as the run imports them
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    path = Path(spec.origin).resolve()
    return path if _local(path, roots) else None


def _imports(path: Path, module: str) -> set[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import module`
    return {n for n in out if n}


def sources(modules: set[str]) -> dict[str, Path]:
    """Module name -> file, for `modules` and every local module they import."""
    roots = _roots()
    todo, seen, out = sorted(modules), set(), {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        f = _module_file(name, roots)
        if f is None:
            continue
        out[name] = f
        todo += sorted(_imports(f, name) - seen)
    return out


def _bindings(c: Contract, backend: str) -> set[str]:
    from falsify.harness import backends as be

    refs = set()
    for eq_name, eq in c.equations.items():
        for b in sorted({backend, "reference"} & set(eq.bindings)):
            try:
                refs.add(be.binding_ref(c, eq_name, b)[0])  # --bind overrides included
            except be.BindingError:
                pass
    return refs


def _refs(c: Contract, backend: str, check: Check | None, mutant: Mutant | None) -> set[str]:
    spec = (check.spec or {}) if check is not None else {}
    if spec.get("kind") == "symbolic":
        return {spec.get("target") or ""}
    if spec.get("kind") == "static":
        return {spec.get("kernel") or ""}
    refs = _bindings(c, backend)
    if isinstance(spec.get("run"), str):
        refs.add(spec["run"])
    if mutant is not None:
        refs.add(mutant.with_)
        refs |= {t.spec["run"] for t in c.checks_for(mutant.obligation)
                 if isinstance(t.spec.get("run"), str)}
    return refs


_HASHES: dict[tuple, str] = {}


def impl_hash(c: Contract, backend: str, check: Check | None = None,
              mutant: Mutant | None = None) -> str:
    """sha256 over the (name, source) of every local module the check (or the mutant's
    checks) on `backend` executes. Cached per process: sources do not change mid-run."""
    refs = _refs(c, backend, check, mutant)
    key = (c.path, c.sha256, tuple(sorted(refs)))
    if key not in _HASHES:
        mods = {r.split(":", 1)[0] for r in refs if ":" in r}
        h = hashlib.sha256()
        for name, path in sorted(sources(mods).items()):
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]
