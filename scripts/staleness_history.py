"""How many check results each recent commit staled, under the former fingerprint scheme and
the current one.

Usage: python scripts/staleness_history.py [--commits 100] [--repo PATH] [--first-parent]
                                           [--json OUT]

A result is keyed (contract id, check id, backend) and stored with the fingerprint of the code
the check executes (falsify/harness/fingerprint.py). A commit stales a result when the key is
in both the commit and its (first) parent and the fingerprint differs. Two schemes:

- before: sha256 over the raw text of every local module the check's refs import,
  transitively (`fingerprint.sources()`'s import closure), keyed by module name;
- after: the current scheme, `fingerprint._Closure` over the normalised AST of the top-level
  statements reached from the refs.

Each commit is read from git objects (ls-tree, cat-file), never imported or checked out: the
window spans a layout move (top-level harness/, impl/, reference/, contracts/ mapped into
`falsify.*` by pyproject's package-dir, then everything under falsify/), so each commit's
module names are resolved against its own tree and pyproject. Only `fingerprint`'s hashing
code is taken from the falsify this script runs with. Mutant results are not counted.

Beside the keys, each row weighs the staled keys by the thorough runs the parent commit's
evidence/thorough-ledger.json records for them (one per dtype variant): the results a
`falsify run --changed` after that commit would have redone.

Checked against falsify itself: on this repository's HEAD every key's refs equal
`fingerprint._refs`, the after hash equals `fingerprint.impl_hash`, and the before hash the
former code's sha256 over `fingerprint.sources()`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import yaml

try:
    import tomllib
except ImportError:  # Python 3.10: the backport falsify depends on there
    import tomli as tomllib

if __package__ in (None, ""):  # run as a file: the checkout holding this script provides falsify
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from falsify.harness import fingerprint as fp  # noqa: E402

CONTRACT_DIRS = ("contracts", "falsify/contracts")
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # safe_load's semantics, in C if built


# ---------------------------------------------------------------- git objects
class Git:
    """One repository's objects, read through a single `git cat-file --batch` process."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.proc = subprocess.Popen(["git", "-C", str(repo), "cat-file", "--batch"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.blobs: dict[str, bytes] = {}

    def run(self, *args: str) -> str:
        return subprocess.run(["git", "-C", str(self.repo), *args], check=True,
                              capture_output=True, text=True).stdout

    def blob(self, sha: str) -> bytes:
        if sha not in self.blobs:
            self.proc.stdin.write(sha.encode() + b"\n")
            self.proc.stdin.flush()
            header = self.proc.stdout.readline().split()
            if len(header) < 3:
                raise RuntimeError(f"git cat-file: {sha} not found")
            data = self.proc.stdout.read(int(header[2]))
            self.proc.stdout.read(1)  # the newline after each object
            self.blobs[sha] = data
        return self.blobs[sha]

    def tree(self, commit: str) -> dict[str, str]:
        """path -> blob sha of the files this script reads: Python sources, pyproject and
        contract YAMLs."""
        out = {}
        for line in self.run("ls-tree", "-r", "-z", commit).split("\0"):
            if not line:
                continue
            meta, path = line.split("\t", 1)
            mode, kind, sha = meta.split()
            if kind == "blob" and (path.endswith((".py", ".yaml")) or path == "pyproject.toml"):
                out[path] = sha
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


class Blob:
    """A file's text as `fingerprint` reads it (`.name`, `.read_text()`), from a git blob: the
    hashing code then parses the commit's own bytes, not whatever is on disk."""

    def __init__(self, name: str, data: bytes):
        self.name, self.data = name, data

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.data.decode(encoding)


# ---------------------------------------------------------------- module resolution
def package_dirs(pyproject: bytes | None) -> list[tuple[str, str]]:
    """(package prefix, folder) pairs, longest prefix first, from setuptools' package-dir and
    packages.find.where; the identity mapping last."""
    pairs: list[tuple[str, str]] = []
    try:
        st = tomllib.loads(pyproject.decode()).get("tool", {}).get("setuptools", {}) \
            if pyproject else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        st = {}
    for pkg, folder in (st.get("package-dir") or {}).items():
        pairs.append((pkg, folder.strip("/")))
    find = (st.get("packages") or {}).get("find") if isinstance(st.get("packages"), dict) else None
    for where in (find or {}).get("where", []) if isinstance(find, dict) else []:
        pairs.append(("", where.strip("/")))
    pairs.append(("", ""))
    return sorted(pairs, key=lambda p: -len(p[0]))


class Tree:
    """One commit's files, with module name -> (path, blob sha) resolved as the installed
    package would import them."""

    def __init__(self, git: Git, commit: str):
        self.git, self.commit = git, commit
        self.files = git.tree(commit)
        pyproject = self.files.get("pyproject.toml")
        self.dirs = package_dirs(git.blob(pyproject) if pyproject else None)
        self.found: dict[str, tuple[str, str] | None] = {}
        self.reached: dict[str, frozenset[str]] = {}
        # TreeClosure's lookups: name -> (identity, parsed module); memo entry -> still valid
        self.modules: dict[str, tuple] = {}
        self.valid: dict[int, bool] = {}
        self.broken: list[str] = []  # contract files that do not parse

    def resolve(self, name: str) -> tuple[str, str] | None:
        if name not in self.found:
            self.found[name] = self._resolve(name)
        return self.found[name]

    def _resolve(self, name: str) -> tuple[str, str] | None:
        if not name or any(not p.isidentifier() for p in name.split(".")):
            return None
        pairs = [(p, f) for p, f in self.dirs if not p or name == p or name.startswith(p + ".")]
        for pkg, folder in pairs:
            if len(pkg) < len(pairs[0][0]):
                break  # the longest mapped prefix decides, as the import system's finder does
            rest = name[len(pkg):].lstrip(".").split(".") if pkg else name.split(".")
            base = PurePosixPath(folder, *[r for r in rest if r])
            for path in (f"{base}.py", f"{base}/__init__.py"):
                path = path.lstrip("/")
                if path in self.files:
                    return path, self.files[path]
        return None

    def local_modules(self, top: str) -> tuple[str, ...]:
        """Every module of the top-level package `top` in this tree, by dotted name: what a
        backend dispatch's f-string pattern is matched against."""
        key = "*" + top
        if key not in self.found:
            names = set()
            for path in self.files:
                if not path.endswith(".py"):
                    continue
                for pkg, folder in self.dirs:
                    if folder and not path.startswith(folder + "/"):
                        continue
                    parts = path[len(folder):].strip("/")[:-3].split("/")
                    parts = parts[:-1] if parts[-1] == "__init__" else parts
                    name = ".".join(x for x in (pkg, *parts) if x)
                    if name.split(".")[0] == top and \
                            all(x.isidentifier() for x in name.split(".")):
                        names.add(name)
                    break
            self.found[key] = tuple(sorted(names))
        return self.found[key]

    def dep(self, name: str):
        """What a memo entry's lookup of `name` depended on: the module's identity, or for
        `*top` the list of the package's modules."""
        if name.startswith("*"):
            return self.local_modules(name[1:])
        return identity(self.resolve(name))

    def key(self) -> str:
        """Identifies everything a fingerprint can read: the Python files and the mapping."""
        h = hashlib.sha256(repr(self.dirs).encode())
        for path, sha in sorted(self.files.items()):
            if path.endswith(".py"):
                h.update(f"{path}\0{sha}\0".encode())
        return h.hexdigest()


# ---------------------------------------------------------------- the two schemes
_PARSED: dict[tuple[str, str, bool], fp._Module | None] = {}
_IMPORTS: dict[tuple[str, str, bool], set[str]] = {}


def identity(hit: tuple[str, str] | None) -> tuple[str, bool] | None:
    """What a module's parse depends on besides its name: its bytes and whether it is a
    package's __init__ (relative imports resolve from it); not where the layout put it."""
    return (hit[1], hit[0].endswith("__init__.py")) if hit else None


def parsed(git: Git, name: str, hit: tuple[str, str]) -> fp._Module | None:
    """The parsed module, shared across commits by blob: parsing and dumping is the cost."""
    key = (name, *identity(hit))
    if key not in _PARSED:
        try:
            _PARSED[key] = fp._Module(name, Blob(PurePosixPath(hit[0]).name, git.blob(hit[1])))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            _PARSED[key] = None
    return _PARSED[key]


class TreeClosure(fp._Closure):
    """`fingerprint._Closure` with modules found in a commit's tree.

    Its per-module memo (what visiting a name, or a statement's uses, adds) also depends on
    which other modules exist and what they bind, so here each memo entry records the modules
    it looked up, with their identity; an entry is reused, in any commit, only where those
    resolve the same. Modules are shared across commits by blob, and most of a commit's
    statements are then walked once for the whole history."""

    def __init__(self, tree: Tree):
        super().__init__(())
        self.tree = tree
        self.frames: list[dict[str, tuple[str, bool] | None]] = []

    def module(self, name: str) -> fp._Module | None:
        got = self.tree.modules.get(name)
        if got is None:
            hit = self.tree.resolve(name)
            got = self.tree.modules[name] = \
                (identity(hit), parsed(self.tree.git, name, hit) if hit else None)
        if self.frames:
            self.frames[-1][name] = got[0]
        return got[1]

    def local_modules(self, top: str) -> tuple[str, ...]:
        if self.frames:
            self.frames[-1]["*" + top] = self.tree.dep("*" + top)
        return self.tree.local_modules(top)

    def _valid(self, deps: dict) -> bool:
        """Whether deps resolve the same in this tree; asked once per entry and tree."""
        ok = self.tree.valid.get(id(deps))
        if ok is None:
            ok = self.tree.valid[id(deps)] = \
                all(self.tree.dep(n) == i for n, i in deps.items())
        return ok

    def _memo(self, mod: fp._Module, key, compute):
        """The remembered result of compute() for key, valid in this tree, else computed."""
        hit = next((e for e in mod.memo.get(key, ()) if self._valid(e[0])), None)
        if hit is None:
            self.frames.append({})
            try:
                result = compute()
            finally:
                deps = self.frames.pop()
            hit = (deps, result)
            mod.memo.setdefault(key, []).append(hit)
        deps, result = hit
        if self.frames:  # an enclosing entry depends on what this one looked up
            self.frames[-1].update(deps)
        return result

    def visit_once(self, m: str, n: str | None) -> None:
        mod = self.module(m)
        if mod is None:
            return

        def compute():
            saved = self.parts, self.todo, self.fallbacks
            self.parts, self.todo, self.fallbacks = {}, [], {}
            try:
                self.visit(m, n)
                return self.parts, self.todo, self.fallbacks
            finally:
                self.parts, self.todo, self.fallbacks = saved

        parts, todo, fallbacks = self._memo(mod, ("visit", n or "*"), compute)
        self.parts.update(parts)
        self.todo += todo
        for k, v in fallbacks.items():
            self.fallbacks.setdefault(k, v)

    def uses(self, mod: fp._Module, stmt) -> None:
        def compute():
            saved = self.todo, self.fallbacks
            self.todo, self.fallbacks = [], {}
            try:
                self._uses(mod, stmt)
                return self.todo, self.fallbacks
            finally:
                self.todo, self.fallbacks = saved

        todo, fallbacks = self._memo(mod, ("uses", id(stmt)), compute)
        self.todo += todo
        for k, v in fallbacks.items():
            self.fallbacks.setdefault(k, v)


_AFTER: dict[frozenset[str], list[tuple[dict, str]]] = {}


def hash_after(tree: Tree, refs: frozenset[str]) -> str:
    """As `fingerprint._closure` hashes the parts. The parts follow from the refs and the
    modules the walk looked up, so a hash is reused wherever those resolve the same: most
    commits change no module most checks reach."""
    for deps, digest in _AFTER.get(refs, ()):
        if all(tree.dep(n) == i for n, i in deps.items()):
            return digest
    cl = TreeClosure(tree)
    cl.frames.append({})
    parts = cl.run(set(refs))
    h = hashlib.sha256()
    for (mod, name), dump in sorted(parts.items()):
        h.update(f"{mod}:{name}".encode() + b"\0" + dump.encode() + b"\0")
    _AFTER.setdefault(refs, []).append((cl.frames.pop(), h.hexdigest()))
    return h.hexdigest()


def imported(tree: Tree, name: str) -> set[str]:
    """What the module `name` imports (`fingerprint._imports`), by blob."""
    path, sha = tree.resolve(name)
    key = (sha, name, path.endswith("__init__.py"))
    if key not in _IMPORTS:
        _IMPORTS[key] = fp._imports(Blob(PurePosixPath(path).name, tree.git.blob(sha)), name)
    return _IMPORTS[key]


def reach(tree: Tree, name: str) -> frozenset[str]:
    """The local modules `name` reaches through imports, itself included: the walk of
    `fingerprint.sources()` from one module (a set's walk is the union)."""
    if name not in tree.reached:
        todo, seen, out = [name], set(), set()
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            if tree.resolve(n) is None:
                continue
            out.add(n)
            todo += imported(tree, n) - seen
        tree.reached[name] = frozenset(out)
    return tree.reached[name]


_BEFORE: dict[frozenset, str] = {}


def hash_before(tree: Tree, refs: frozenset[str]) -> str:
    """The former scheme: sha256 over (name, raw text) of every module in the closure."""
    mods = {r.split(":", 1)[0] for r in refs if ":" in r}
    files = frozenset((n, tree.resolve(n)[1]) for m in mods for n in reach(tree, m))
    if files not in _BEFORE:  # most checks reach the same files
        h = hashlib.sha256()
        for name, sha in sorted(files):
            h.update(name.encode() + b"\0" + tree.git.blob(sha) + b"\0")
        _BEFORE[files] = h.hexdigest()
    return _BEFORE[files]


# ---------------------------------------------------------------- contracts and refs
_CONTRACTS: dict[str, dict | str | None] = {}


def load_contract(git: Git, sha: str) -> dict | str | None:
    """The contract's data; None for a YAML file that is no contract (no `equations:`); the
    error's first line for one that does not parse."""
    if sha not in _CONTRACTS:
        try:
            data = yaml.load(git.blob(sha), Loader=_LOADER)
        except yaml.YAMLError as e:
            data = str(e).splitlines()[0] if b"equations:" in git.blob(sha) else None
        if isinstance(data, dict) and not isinstance(data.get("equations"), dict):
            data = None
        _CONTRACTS[sha] = data
    return _CONTRACTS[sha]


def check_refs(data: dict) -> dict[tuple[str, str], frozenset[str]]:
    """(check id, backend) -> refs, as `fingerprint._refs` takes them from a Contract: every
    backend any equation binds; checks are the falsification tests with a `check:` block."""
    eqs = {k: v for k, v in data["equations"].items() if isinstance(v, dict)}
    binds = {k: {b: r for b, r in (v.get("bindings") or {}).items() if isinstance(r, str)}
             for k, v in eqs.items() if isinstance(v.get("bindings"), dict)}
    backends = sorted({b for bs in binds.values() for b in bs})
    out = {}
    for t in data.get("falsification_tests") or []:
        if not isinstance(t, dict) or not isinstance(t.get("check"), dict) or not t.get("id"):
            continue
        spec = t["check"]
        for b in backends:
            if spec.get("kind") == "symbolic":
                refs = {spec.get("target") or ""}
            elif spec.get("kind") == "static":
                refs = {spec.get("kernel") or ""}
            else:
                refs = {r for bs in binds.values() for k, r in bs.items() if k in (b, "reference")}
                if isinstance(spec.get("run"), str):
                    refs.add(spec["run"])
            out[(str(t["id"]), b)] = frozenset(refs)
    return out


def results(git: Git, tree: Tree) -> dict[tuple[str, str, str], frozenset[str]]:
    """(contract id, check id, backend) -> refs for every contract in the tree."""
    out = {}
    for path, sha in sorted(tree.files.items()):
        p = PurePosixPath(path)
        if p.suffix != ".yaml" or str(p.parent) not in CONTRACT_DIRS:
            continue
        data = load_contract(git, sha)
        if isinstance(data, str):
            tree.broken.append(f"{path}: {data}")
        if not isinstance(data, dict):
            continue
        for (check, backend), refs in check_refs(data).items():
            out[(p.stem, check, backend)] = refs
    return out


# ---------------------------------------------------------------- per commit
_HASHED: dict[str, dict] = {}  # commit -> {key: (before, after)}
_BROKEN: dict[str, list[str]] = {}  # commit -> its contract files that do not parse
_BY_STATE: dict[tuple[str, frozenset[str]], tuple[str, str]] = {}


def hashes(git: Git, commit: str) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(before, after) per result key; memoised by the commit's Python files and refs-set, so
    a commit that touches no .py file costs only its contract parsing."""
    if commit in _HASHED:
        return _HASHED[commit]
    tree = Tree(git, commit)
    state, out = tree.key(), {}
    for key, refs in results(git, tree).items():
        sk = (state, refs)
        if sk not in _BY_STATE:
            _BY_STATE[sk] = (hash_before(tree, refs), hash_after(tree, refs))
        out[key] = _BY_STATE[sk]
    _HASHED[commit], _BROKEN[commit] = out, tree.broken
    return out


LEDGER = "evidence/thorough-ledger.json"
_LEDGERS: dict[str, dict] = {}


def ledger_runs(git: Git, commit: str | None) -> dict[tuple[str, str, str], int]:
    """Recorded thorough runs per result key (one per dtype variant and bind) in the commit's
    ledger; empty where it has none."""
    out = git.run("ls-tree", "-z", commit, "--", LEDGER).split("\t", 1) if commit else []
    sha = out[0].split()[2] if len(out) == 2 else None
    if sha is None:
        return {}
    if sha not in _LEDGERS:
        try:
            runs = json.loads(git.blob(sha)).get("runs", {})
        except (ValueError, AttributeError):
            runs = {}
        counts: dict[tuple[str, str, str], int] = {}
        for r in runs.values() if isinstance(runs, dict) else []:
            k = (r.get("contract"), r.get("check"), r.get("backend"))
            counts[k] = counts.get(k, 0) + 1
        _LEDGERS[sha] = counts
    return _LEDGERS[sha]


def compare(old: dict, new: dict, runs: dict) -> dict:
    """The row's counts; `runs` (the parent's ledger) weighs each staled key by the thorough
    runs recorded for it before the commit."""
    both = old.keys() & new.keys()
    before = [k for k in both if old[k][0] != new[k][0]]
    after = [k for k in both if old[k][1] != new[k][1]]
    return {"results": len(new), "staled_before": len(before), "staled_after": len(after),
            "added": len(new.keys() - old.keys()), "removed": len(old.keys() - new.keys()),
            "ledger_runs": sum(runs.values()),
            "ledger_staled_before": sum(runs.get(k, 0) for k in before),
            "ledger_staled_after": sum(runs.get(k, 0) for k in after)}


def history(repo: Path, n: int, first_parent: bool) -> list[dict]:
    git = Git(repo)
    try:
        fmt = ["--format=%H%x00%P%x00%s"] + (["--first-parent"] if first_parent else [])
        rows = []
        for line in git.run("log", f"-{n}", *fmt, "HEAD").splitlines():
            sha, parents, subject = line.split("\0", 2)
            parent = parents.split()[0] if parents else None
            row = {"commit": sha, "subject": subject, "parent": parent}
            new = hashes(git, sha)
            row |= compare(hashes(git, parent) if parent else {}, new, ledger_runs(git, parent))
            row["unparsed"] = _BROKEN[sha]
            rows.append(row)
        return rows
    finally:
        git.close()


# ---------------------------------------------------------------- output
def markdown(rows: list[dict], seconds: float) -> str:
    lines = ["Results are (contract, check, backend) keys; ledger runs are the parent's "
             f"{LEDGER} entries (one per dtype variant) on the keys staled.", "",
             "| commit | subject | results | staled before | staled after | added | removed "
             "| ledger runs | ledger staled before | ledger staled after |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        subj = r["subject"] if len(r["subject"]) <= 60 else r["subject"][:57] + "..."
        subj = subj.replace("|", "\\|")
        lines.append(f"| {r['commit'][:9]} | {subj} | {r['results']} | {r['staled_before']} "
                     f"| {r['staled_after']} | {r['added']} | {r['removed']} | {r['ledger_runs']} "
                     f"| {r['ledger_staled_before']} | {r['ledger_staled_after']} |")
    t = totals(rows)
    lines += ["", f"Totals over {t['commits']} commits: staled before {t['staled_before']}, "
                  f"staled after {t['staled_after']}; commits that staled anything: before "
                  f"{t['commits_staling_before']}, after {t['commits_staling_after']}. "
                  f"Ledger runs staled: before {t['ledger_staled_before']}, after "
                  f"{t['ledger_staled_after']}. Computed in {seconds:.1f} s."]
    broken = [f"- {r['commit'][:9]} {b}" for r in rows for b in r["unparsed"]]
    if broken:
        lines += ["", "Contracts that did not parse (their results are not counted):", *broken]
    return "\n".join(lines) + "\n"


def totals(rows: list[dict]) -> dict:
    return {"commits": len(rows),
            "staled_before": sum(r["staled_before"] for r in rows),
            "staled_after": sum(r["staled_after"] for r in rows),
            "commits_staling_before": sum(r["staled_before"] > 0 for r in rows),
            "commits_staling_after": sum(r["staled_after"] > 0 for r in rows),
            "ledger_staled_before": sum(r["ledger_staled_before"] for r in rows),
            "ledger_staled_after": sum(r["ledger_staled_after"] for r in rows)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int, default=100, help="how many commits back from HEAD")
    ap.add_argument("--repo", help="a path inside the repository (default: the current one)")
    ap.add_argument("--first-parent", action="store_true", help="follow first parents only")
    ap.add_argument("--json", help="also write the rows and totals here")
    a = ap.parse_args(argv)
    top = subprocess.run(["git", "-C", a.repo or ".", "rev-parse", "--show-toplevel"],
                         check=True, capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()
    rows = history(Path(top), a.commits, a.first_parent)
    seconds = time.perf_counter() - t0
    sys.stdout.write(markdown(rows, seconds))
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "totals": totals(rows),
                                            "seconds": seconds}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
