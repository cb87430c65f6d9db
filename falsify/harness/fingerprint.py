"""What a result was computed from: a fingerprint of the code a check executes.

`impl_hash(contract, backend, check)` starts from what the check calls: for a symbolic check
its `target`, for a static check its `kernel`, otherwise every binding on that backend and on
`reference` (the oracle most checks compare against) plus a training check's `run:` probe; for
a mutant, its replacement as well. From each `module:function` it follows the names the
function's body uses (module-level functions, classes, assignments, and names imported from
other local modules: `from x import f` is f in x, `import x as X; X.f` is f in x),
transitively, through the modules of the project and of falsify itself, not third-party
packages. What it hashes is the normalised AST of those top-level statements (`ast.dump`
without positions, docstrings removed): a comment, a docstring, formatting, or an edit to a
function nothing reached uses leaves the hash alone; a constant, a default argument or a
decorator of a reached function changes it. A module's statements that bind no name (a
registration call) run on import and count for every function reached in it.

Where a reference cannot be followed statically (a module object used itself rather than an
attribute of it, `getattr` with a computed name on what may be any module (`sys.modules[m]`,
a call's result), `globals()`, a star import), the whole module counts, with everything it
uses. A backend dispatch, `importlib.import_module(f"falsify.kernels.{backend}.adamw")` (or of
a name the statement assigns such an f-string), counts every local module the f-string can
name whole: `falsify.kernels.*.adamw`, a module-level string constant filled in. An
`import_module` of a name with no such pattern counts its caller's module whole, and reaches
only what the check's own bindings name. `fallbacks(contract)` lists each (check, module,
reason) where a module counts whole, for `pv audit`.

The contract's fixtures (`metadata.fixtures`: data files its checks read, such as a trained
tokenizer) count by their bytes, for every check of the contract.

The ledger stores the hash with each entry; `pv coverage` calls an entry whose hash no longer
matches `stale`, and `falsify run --changed` re-runs only what has no passing entry for the
current hashes. Entries written under the former scheme (the raw text of every imported module)
read as stale once.

A top-level name is found with importlib's finders (which import nothing for a top-level
name), its submodules as paths under it, and every module is parsed as source: computing a
fingerprint imports nothing.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import hashlib
import importlib.util
import site
import sys
import sysconfig
from functools import cache
from glob import escape as glob_escape
from pathlib import Path

from falsify.harness import stamp_cache
from falsify.harness.model import Check, Contract, Mutant
from falsify.harness.stamp_cache import StampCache

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
def _top_locations(top: str, roots: tuple[Path, ...]) -> tuple[Path, ...]:
    """Where the top-level module or package `top` lies, if it is local (under one of
    `roots`): its file, or its package directories. Found with `find_spec` of the top-level
    name alone, which imports nothing."""
    for r in roots:
        if str(r) not in sys.path and r != _FALSIFY_TREE:
            sys.path.insert(0, str(r))  # the project's own modules, as the run imports them
    loaded = sys.modules.get(top)
    try:
        spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError, AttributeError):
        return ()
    if spec is None:
        return ()
    if spec.submodule_search_locations:
        locs = [Path(p).resolve() for p in spec.submodule_search_locations]
    elif spec.origin and spec.origin.endswith(".py"):
        locs = [Path(spec.origin).resolve()]
    else:
        return ()
    return tuple(p for p in locs if _local(p, roots))


@cache
def _module_file(name: str, roots: tuple[Path, ...]) -> Path | None:
    """The source file of a local module (under one of `roots`), else None. A submodule is
    looked up as a path under its top-level package, so nothing is imported: finding
    `pkg.sub.f` with importlib would run `pkg/sub.py` (and whatever it imports)."""
    top, _, rest = name.partition(".")
    for loc in _top_locations(top, roots):
        if not rest:
            f = loc / "__init__.py" if loc.is_dir() else loc
            if f.is_file():
                return f
            continue
        if not loc.is_dir():
            continue
        base = loc.joinpath(*rest.split("."))
        for f in (base.with_name(base.name + ".py"), base / "__init__.py"):
            if f.is_file():
                return f
    return None


@cache
def _local_modules(top: str, roots: tuple[Path, ...]) -> tuple[str, ...]:
    """Every module of the local top-level package `top` (its .py files, by dotted name)."""
    out = []
    for loc in _top_locations(top, roots):
        if not loc.is_dir():
            out.append(top)
            continue
        for f in sorted(loc.rglob("*.py")):
            parts = f.relative_to(loc).with_suffix("").parts
            if all(p.isidentifier() for p in parts):
                parts = parts[:-1] if parts[-1] == "__init__" else parts
                out.append(".".join((top, *parts)))
    return tuple(out)


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


_DYNAMIC = {"getattr", "globals", "vars", "locals", "__import__", "import_module", "exec", "eval"}


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    """Docstrings are documentation: drop the first string statement of every body."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _bound(stmt: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name.split(".")[0]) for a in stmt.names if a.name != "*"}
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
            and isinstance(n.ctx, (ast.Store, ast.Del))} | \
        {a.asname or a.name.split(".")[0] for n in ast.walk(stmt)
         if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names if a.name != "*"}


class _Module:
    """One local module, parsed once: its top-level statements by the names they bind (a
    statement that binds nothing, such as a registration call, runs on import and counts for
    every name of the module), and where each imported name comes from."""

    def __init__(self, name: str, path: Path):
        self.name, self.path = name, path
        tree = _strip_docstrings(ast.parse(path.read_text(encoding="utf-8")))
        self.dump = ast.dump(tree)
        pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.binds: dict[str, list[ast.stmt]] = {}
        self.prelude: list[ast.stmt] = []
        self.imports: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attr)
        self.star = False
        self.memo: dict = {}  # per statement and per name: what reaching it adds
        for stmt in tree.body:
            names = _bound(stmt)
            for n in names:
                self.binds.setdefault(n, []).append(stmt)
            if not names:
                self.prelude.append(stmt)
        for node in ast.walk(tree):  # imports inside functions bind names there too
            if isinstance(node, ast.Import):
                for a in node.names:
                    # `import a.b` binds `a`; `import a.b as X` binds X to a.b
                    self.imports[a.asname or a.name.split(".")[0]] = \
                        (a.name if a.asname else a.name.split(".")[0], None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    parent = ".".join(parts[:len(parts) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                for a in node.names:
                    if a.name == "*":
                        self.star = True
                    else:
                        self.imports[a.asname or a.name] = (base, a.name)


@cache
def _parsed(path: Path, stamp: tuple[int, int], name: str) -> _Module | None:
    try:
        return _Module(name, path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _plain(e: ast.expr) -> bool:
    """A name, an attribute chain off one (`self.inner`, `pkg.sub`) or a getattr of either:
    what it denotes is a value, or a module object whose use `follow` counts whole; unlike
    `sys.modules[m]` or a call's result, which may be any module."""
    if isinstance(e, ast.Attribute):
        return _plain(e.value)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "getattr":
        return bool(e.args) and _plain(e.args[0])
    return isinstance(e, ast.Name)


def _dynamic(call: ast.Call) -> str | None:
    """Why `call` names code in a way the fingerprint cannot follow, or None."""
    f = call.func
    fname = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if fname not in _DYNAMIC or (isinstance(f, ast.Attribute) and fname != "import_module"):
        return None
    literal = [a for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if fname == "getattr" and len(call.args) >= 2 and call.args[1] in literal:
        return None  # obj.attr spelled as a call: an attribute of a value, not a code lookup
    if fname == "getattr" and call.args and _plain(call.args[0]):
        # getattr(x, name) on a plain name reaches no more than `x.attr` would: for a value,
        # the methods of a class its construction already reached; for a module object, the
        # name is a use of the module itself, which counts it whole (`follow`)
        return None
    if fname == "import_module" and call.args and call.args[0] in literal:
        return None  # followed as an import (below)
    if fname == "import_module":
        return ("import_module() of a name known only at run time (what it imports counts "
                "only where the check's own bindings name it)")
    return f"{fname}() with a name known only at run time"


def _glob_part(mod: _Module, part: ast.expr) -> str:
    """One piece of an f-string as a glob: its text, a module-level string constant's value
    (`{KD_MODULE}`), or `*` for a value known only at run time."""
    if isinstance(part, ast.Constant):
        return glob_escape(str(part.value))
    v = part.value if isinstance(part, ast.FormattedValue) else None
    if isinstance(v, ast.Name) and part.format_spec is None and part.conversion == -1:
        stmts = mod.binds.get(v.id, [])
        value = stmts[0].value if len(stmts) == 1 and isinstance(stmts[0], ast.Assign) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return glob_escape(value.value)
    return "*"


class _Closure:
    """The top-level statements a set of `module:function` refs execute, transitively."""

    def __init__(self, roots: tuple[Path, ...]):
        self.roots = roots
        self.parts: dict[tuple[str, str], str] = {}
        self.fallbacks: dict[str, str] = {}
        self.seen: set[tuple[str, str | None]] = set()
        self.todo: list[tuple[str, str | None]] = []

    def module(self, name: str) -> _Module | None:
        path = _module_file(name, self.roots)
        if path is None:
            return None
        st = path.stat()
        return _parsed(path, (st.st_mtime_ns, st.st_size), name)

    def local_modules(self, top: str) -> tuple[str, ...]:
        return _local_modules(top, self.roots)

    def whole(self, module: str, reason: str) -> None:
        if self.module(module) is not None:
            self.fallbacks.setdefault(module, reason)
            self.todo.append((module, None))

    def run(self, refs: set[str]) -> dict[tuple[str, str], str]:
        for r in sorted(refs):
            mod, _, qual = r.partition(":")
            self.todo.append((mod, qual.split(".")[0] or None))
            if not qual:
                self.whole(mod, "bound as a module, not a function")
        while self.todo:
            item = self.todo.pop()
            if item in self.seen:
                continue
            self.seen.add(item)
            self.visit_once(*item)
        return self.parts

    def visit_once(self, m: str, n: str | None) -> None:
        """`visit`, remembered per module version and name across closures: most checks reach
        the same statements, and walking and dumping them dominates the cost."""
        mod = self.module(m)
        if mod is None:
            return
        memo = mod.memo.get(n or "*")
        if memo is None:
            saved = self.parts, self.todo, self.fallbacks
            self.parts, self.todo, self.fallbacks = {}, [], {}
            try:
                self.visit(m, n)
                memo = mod.memo[n or "*"] = (self.parts, self.todo, self.fallbacks)
            finally:
                self.parts, self.todo, self.fallbacks = saved
        self.parts.update(memo[0])
        self.todo += memo[1]
        for k, v in memo[2].items():
            self.fallbacks.setdefault(k, v)

    def visit(self, m: str, n: str | None) -> None:
        mod = self.module(m)
        if mod is None:
            return  # third-party or missing: outside the project's code
        # statements that bind nothing run on every import
        self.parts[(m, "")] = "\n".join(ast.dump(s) for s in mod.prelude)
        for s in mod.prelude:
            self.uses(mod, s)
        if n is None:
            self.parts[(m, "*")] = mod.dump
            self.todo += [(m, b) for b in mod.binds]
            return
        stmts = mod.binds.get(n, [])
        for i, s in enumerate(stmts):
            self.parts[(m, f"{n}#{i}")] = ast.dump(s)
            if not isinstance(s, (ast.Import, ast.ImportFrom)):
                self.uses(mod, s)
        if n in mod.imports and not self.is_module(mod, n):
            self.follow(mod, n, None)  # module objects are followed where they are used
        elif not stmts and mod.star:
            self.whole(m, f"{n} may come from a star import")

    def is_module(self, mod: _Module, name: str) -> bool:
        """Whether the imported `name` is a module object (`import x`, `from pkg import sub`)."""
        if name not in mod.imports:
            return False
        base, attr = mod.imports[name]
        if attr is None:
            return True
        owner = self.module(base)
        return self.module(f"{base}.{attr}") is not None and \
            (owner is None or attr not in owner.binds)

    def follow(self, mod: _Module, name: str, chain: list[str] | None) -> None:
        """Resolve a use of the imported `name`, with the attributes read off it (`chain`)."""
        base, attr = mod.imports[name]
        target = base if attr is None else f"{base}.{attr}"
        if not self.is_module(mod, name):
            self.todo.append((base, attr))  # `from x import f`: f in x
            return
        cur = target  # a module object: walk `X.sub.f` down to f in X.sub
        for a in chain or []:
            if self.module(f"{cur}.{a}") is None:
                self.todo.append((cur, a))
                return
            cur = f"{cur}.{a}"
        self.whole(cur, f"the module object {name} is used itself, not an attribute of it")

    def imported_by_pattern(self, mod: _Module, stmt: ast.stmt, call: ast.Call) -> bool:
        """`import_module(f"pkg.{backend}.kernel")`, or of a name the statement assigns such
        an f-string to: every local module the pattern can name counts whole (`pkg.*.kernel`,
        a formatted value standing for any run of characters), since which one runs is decided
        at run time. False where the name has no such pattern, or the pattern names nothing."""
        f = call.func
        if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")) != "import_module" \
                or not call.args:
            return False
        arg, values = call.args[0], []
        if isinstance(arg, ast.JoinedStr):
            values = [arg]
        elif isinstance(arg, ast.Name):
            values = [n.value for n in ast.walk(stmt) if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
        if not values or not all(isinstance(v, ast.JoinedStr) for v in values):
            return False
        found = False
        for v in values:
            pattern = "".join(_glob_part(mod, p) for p in v.values)
            for name in self.local_modules(pattern.split(".")[0]):
                if fnmatch.fnmatchcase(name, pattern):
                    found = True
                    self.whole(name, f"imported by {mod.name} as importlib.import_module"
                                     f"({pattern!r})")
        return found

    def uses(self, mod: _Module, stmt: ast.stmt) -> None:
        """Queue what `stmt` uses; the same statement reached again queues the same."""
        memo = mod.memo.get(id(stmt))
        if memo is None:
            todo, fb = self.todo, self.fallbacks
            self.todo, self.fallbacks = [], {}
            try:
                self._uses(mod, stmt)
                memo = mod.memo[id(stmt)] = (self.todo, self.fallbacks)
            finally:
                self.todo, self.fallbacks = todo, fb
        self.todo += memo[0]
        for k, v in memo[1].items():
            self.fallbacks.setdefault(k, v)

    def _uses(self, mod: _Module, stmt: ast.stmt) -> None:
        chains: dict[int, list[str]] = {}  # id(Name) -> attributes read off it
        for node in ast.walk(stmt):
            if isinstance(node, ast.Attribute):
                attrs, v = [], node
                while isinstance(v, ast.Attribute):
                    attrs.insert(0, v.attr)
                    v = v.value
                if isinstance(v, ast.Name) and len(attrs) > len(chains.get(id(v), [])):
                    chains[id(v)] = attrs
            elif isinstance(node, ast.Call):
                why = _dynamic(node)
                if why and self.imported_by_pattern(mod, stmt, node):
                    continue
                if why:
                    self.whole(mod.name, why)
                elif isinstance(node.func, (ast.Name, ast.Attribute)) and node.args and \
                        getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
                    self.whole(node.args[0].value, "imported with importlib.import_module")
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
                continue
            x = node.id
            if self.is_module(mod, x):
                self.follow(mod, x, chains.get(id(node), []))
            elif x in mod.binds or x in mod.imports:
                self.todo.append((mod.name, x))
            elif mod.star and x not in dir(builtins):
                self.whole(mod.name, f"{x} may come from a star import")


def _bindings(c: Contract, backend: str) -> set[str]:
    from falsify.harness import binding as be

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
_FALLBACKS: dict[tuple, dict[str, str]] = {}
_STORES: dict[tuple[Path, ...], StampCache] = {}


def _store(roots: tuple[Path, ...]) -> StampCache:
    """The persisted hashes for these roots; the algorithm's own source is part of the scope,
    so a change to how fingerprints are taken drops every earlier one, and so is the
    interpreter's environment (`sys.prefix`): another virtual environment can resolve a
    top-level name to other files while the project's own are unchanged."""
    if roots not in _STORES:
        algo = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        _STORES[roots] = StampCache("fingerprints",
                                    "\0".join([algo, sys.prefix, *map(str, roots)]))
    return _STORES[roots]


def _closure(refs: set[str]) -> tuple[str, dict[str, str]]:
    """(hash, fallbacks) for `refs`: from this process's memory, else from the stamp cache
    while every file it was computed from is unchanged, else computed."""
    key = tuple(sorted(refs))
    if key not in _HASHES:
        roots = _roots()
        store, skey = _store(roots), "\n".join(key)
        hit = store.get(skey)
        if hit is None:
            cl = _Closure(roots)
            parts = cl.run(refs)
            h = hashlib.sha256()
            for (mod, name), dump in sorted(parts.items()):
                h.update(f"{mod}:{name}".encode() + b"\0" + dump.encode() + b"\0")
            hit = [h.hexdigest(), cl.fallbacks]
            files = {_module_file(m, roots) for m, _ in parts}
            store.put(skey, hit, {f for f in files if f is not None})
        _HASHES[key], _FALLBACKS[key] = hit[0], dict(hit[1])
    return _HASHES[key], _FALLBACKS[key]


def reset_cache() -> None:
    """Forget the hashes computed so far in this process (the stamp cache checks its files
    itself); for a caller that edits sources between two calls."""
    _HASHES.clear()
    _FALLBACKS.clear()
    _module_file.cache_clear()
    _top_locations.cache_clear()
    _local_modules.cache_clear()
    stamp_cache.forget()


def impl_hash(c: Contract, backend: str, check: Check | None = None,
              mutant: Mutant | None = None) -> str:
    """sha256 over the normalised AST of every top-level statement the check (or the mutant's
    checks) on `backend` executes, by module and name, and over the bytes of the contract's
    fixtures (the data files its checks read)."""
    code = _closure(_refs(c, backend, check, mutant))[0]
    if not c.fixtures:
        return code
    h = hashlib.sha256(code.encode())
    for name in c.fixtures:
        h.update(b"\0" + name.encode() + b"\0" + _file_digest(c.fixture_path(name)).encode())
    return h.hexdigest()


def _file_digest(path: Path) -> str:
    """A fixture's sha256 (read once per process, as every source stamp: `reset_cache`); a
    missing one hashes as such, so its results read as stale, and V034 says why."""
    return stamp_cache.stamp(path) or "missing"


def fallbacks(c: Contract, backends: tuple[str, ...] | None = None) -> list[tuple[str, str, str]]:
    """(check, module, reason) for each module a check's fingerprint counts whole, because a
    reference in what the check executes could not be followed to a function."""
    out = set()
    for check in c.checks:
        for b in backends or tuple(sorted({b for eq in c.equations.values()
                                           for b in eq.bindings})):
            for mod, why in _closure(_refs(c, b, check, None))[1].items():
                out.add((check.id, mod, why))
    return sorted(out)
