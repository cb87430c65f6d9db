"""The repository speaks for itself: every citation key used in the contracts, the code and the
docs is defined in falsify/contracts/SOURCES.md; every repository path named in a comment,
docstring, contract or docs page exists, as does every module named by import path (and a
`path.py:name` or `module:name` suffix names something the module defines); no text cites a
document that is not in the repository, and no ALB-/C- style id that nothing in the repository
defines.

Each scanner is a plain function over (label, text) pairs, so the tests at the bottom show that it
fails on a planted unknown key, a stale path, a missing function and an outside citation.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "falsify" / "contracts" / "SOURCES.md"
THIS = Path(__file__).resolve()

# `[milakov2018]`, `[ieee754-2019]`, `[repo:liger-kernel]`: papers end in their year, repositories
# carry the `repo:` prefix. Narrow on purpose, so indexing such as `x[i]` never reads as a key.
KEY = re.compile(r"\[((?:repo:[a-z0-9][a-z0-9._-]*)|(?:[a-z][a-z0-9-]*(?:19|20)\d\d[a-z]?))\]")
DEFINED = re.compile(r"^\|\s*`\[([^\]`]+)\]`\s*\|", re.M)

# A repository path: a known top folder, then segments, ending in a file extension; optionally
# `:name` (a function, class or constant of that module, possibly `Class.method`).
TOPS = ("falsify", "tests", "site", "evidence", "impl", "harness", "reference", "contracts",
        "kernels", "llm", "cli", "bench", "mutants", "probes", "proofs", "templates")
PATH = re.compile(
    r"(?<![\w/.~$-])((?:" + "|".join(TOPS) + r")/[A-Za-z0-9_./-]*?"
    r"(?:\.(?:py|yaml|yml|md|json|jsonl|toml)|/))(?![\w/-])"
    r"(?::([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_]\w*)?))?")
# `falsify.probes.train_loop:name`: a module of ours by its import path, optionally with a name
# in it.
MODULE = re.compile(r"(?<![\w.])(falsify(?:\.[a-z_][a-z0-9_]*)+)(?::([A-Za-z_]\w*))?")
DATA_SUFFIXES = (".toml", ".yml", ".yaml", ".json", ".md", ".py")  # falsify.toml is a file name
# `falsify/X/Y.py`, `contracts/NAME-kernel-v1.yaml`: a pattern, not a file.
PLACEHOLDER = re.compile(r"(?:^|[/.-])(?:NAME|X|Y)(?=[/.-])|[<{*]")
# Written by `pv generate`, `pv docs` and mkdocs, ignored by git: named before they exist.
GENERATED = ("tests/generated/", "site/docs/contracts/", "site/build/")

# Documents outside the repository that earlier text cited, and the ids they defined.
OUTSIDE = re.compile(
    r"\bseeds? ?00[0-4]\b|\bseeds/|\bseed §|\bseeds'|\bseed (?:ALB|KANI)|kernel-anchors"
    r"|\bthe brief\b|source: brief|; brief\b|\bAlbor\b|\b[Ss]eed formula\b|\bthe digest\b"
    r"|\bissue \d+\b|\bKernel suite I|\bALB-\d+|\bC-[A-Z]+(?:-[A-Z]+)*-\d{3}\b")


# ----------------------------------------------------------------------------- the corpus
def defined_keys(text: str | None = None) -> set[str]:
    return set(DEFINED.findall(SOURCES.read_text() if text is None else text))


def python_prose(text: str) -> list[str]:
    """The comments and docstrings of a Python source: the prose a reader follows."""
    out = [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    return out


def _python_files() -> list[Path]:
    files = sorted((ROOT / "falsify").rglob("*.py")) + sorted((ROOT / "tests").glob("*.py"))
    return [p for p in files if p.resolve() != THIS]


def _doc_files() -> list[Path]:
    # assets/ is vendored; contracts/ is generated from the contracts, which are scanned
    docs = [p for p in sorted((ROOT / "site" / "docs").rglob("*.md"))
            if not {"assets", "contracts"} & set(p.relative_to(ROOT / "site" / "docs").parts)]
    return [ROOT / "README.md", *docs,
            *sorted(p for p in (ROOT / "falsify" / "contracts").glob("*.md") if p != SOURCES)]


def prose() -> list[tuple[str, str]]:
    """(label, text): Python comments and docstrings, whole contracts, whole docs pages."""
    out = []
    for p in _python_files():
        rel = p.relative_to(ROOT).as_posix()
        out += [(rel, chunk) for chunk in python_prose(p.read_text())]
    for p in sorted((ROOT / "falsify" / "contracts").glob("*.yaml")):
        out.append((p.relative_to(ROOT).as_posix(), p.read_text()))
    for p in _doc_files():
        out.append((p.relative_to(ROOT).as_posix(), p.read_text()))
    return out


def whole_texts() -> list[tuple[str, str]]:
    """(label, text) of every scanned file in full: outside citations hide in strings too."""
    files = [*_python_files(), *sorted((ROOT / "falsify" / "contracts").glob("*.yaml")),
             *_doc_files()]
    return [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in files]


# ----------------------------------------------------------------------------- the scanners
def unknown_keys(items, keys: set[str]) -> list[str]:
    return [f"{label}: [{k}] is not defined in falsify/contracts/SOURCES.md"
            for label, text in items for k in KEY.findall(text) if k not in keys]


def _resolve(path: str, label: str) -> Path | None:
    """The file or folder `path` names: from the repository root, from falsify/ (a module path
    written relative to the package), or from the page's own folder (a docs link)."""
    for base in (ROOT, ROOT / "falsify", (ROOT / label).parent):
        target = base / path
        if target.is_file() or (path.endswith("/") and target.is_dir()):
            return target
    return None


def _generated(path: str, label: str) -> bool:
    full = ((ROOT / label).parent / path).resolve()
    names = [path] + ([full.relative_to(ROOT).as_posix()] if full.is_relative_to(ROOT) else [])
    return any(p.startswith(g) for p in names for g in GENERATED)


def _module_names(path: Path) -> set[str]:
    """Top-level names of a module, and `Class.member` for its classes' members."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                names |= {f"{node.name}.{m.name}" for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def stale_paths(items) -> list[str]:
    problems, cache = [], {}
    for label, text in items:
        for path, name in PATH.findall(text):
            if PLACEHOLDER.search(path):
                continue
            found = _resolve(path, label)
            if found is None and _generated(path, label):
                continue
            if found is None:
                problems.append(f"{label}: {path} does not exist")
            elif name and path.endswith(".py"):
                if found not in cache:
                    cache[found] = _module_names(found)
                if name not in cache[found]:
                    problems.append(f"{label}: {path} defines no {name}")
    return problems


def _module_file(parts: list[str]) -> Path | None:
    rel = Path(*parts)
    for f in (ROOT / rel.with_suffix(".py"), ROOT / rel / "__init__.py"):
        if f.is_file():
            return f
    return None


def stale_modules(items) -> list[str]:
    """`falsify.a.b`, `falsify.a.b.name` or `falsify.a.b:name`: the longest prefix that is a
    module must exist, and the first name after it must be defined there."""
    problems, cache = [], {}
    for label, text in items:
        for mod, name in MODULE.findall(text):
            if mod.endswith(DATA_SUFFIXES):
                continue
            parts = mod.split(".")
            cut = next((i for i in range(len(parts), 1, -1) if _module_file(parts[:i])), None)
            if cut is None:
                problems.append(f"{label}: module {mod} does not exist")
                continue
            attr = next((r for r in [*parts[cut:], name] if r), None)
            if attr:
                found = _module_file(parts[:cut])
                if found not in cache:
                    cache[found] = _module_names(found)
                if attr not in cache[found]:
                    problems.append(f"{label}: module {'.'.join(parts[:cut])} defines no {attr}")
    return problems


def outside_citations(items) -> list[str]:
    return [f"{label}: {m.group(0)!r} cites a document or id that is not in the repository"
            for label, text in items for m in OUTSIDE.finditer(text)]


# ----------------------------------------------------------------------------- the repository
def test_sources_define_keys():
    keys = defined_keys()
    assert {"milakov2018", "dettmers2023", "repo:liger-kernel"} <= keys


def test_every_citation_key_is_defined():
    assert unknown_keys(whole_texts(), defined_keys()) == []


def unkeyed_references(contracts: dict[str, dict]) -> list[str]:
    """A contract's metadata.references each cite at least one SOURCES.md key."""
    return [f"{name}: reference {ref!r} cites no [key]"
            for name, doc in contracts.items()
            for ref in (doc.get("metadata") or {}).get("references") or []
            if not KEY.search(str(ref))]


def test_every_contract_reference_has_a_key():
    contracts = {p.name: yaml.safe_load(p.read_text())
                 for p in sorted((ROOT / "falsify" / "contracts").glob("*.yaml"))}
    assert unkeyed_references(contracts) == []
    planted = {"x.yaml": {"metadata": {"references": ["Someone (2020) a paper"]}}}
    assert unkeyed_references(planted) == [
        "x.yaml: reference 'Someone (2020) a paper' cites no [key]"]


def test_every_named_path_exists():
    assert stale_paths(prose()) == []


def test_every_named_module_exists():
    assert stale_modules(prose()) == []


def test_no_citation_of_documents_outside_the_repository():
    assert outside_citations(whole_texts()) == []


# ----------------------------------------------------------------------------- the scanners fail
def test_unknown_key_is_reported():
    items = [("x.yaml", 'references:\n  - "[milakov2018] online softmax; [nobody2031] made up"')]
    assert unknown_keys(items, {"milakov2018"}) == [
        "x.yaml: [nobody2031] is not defined in falsify/contracts/SOURCES.md"]
    assert unknown_keys([("y.py", "[repo:nothing] and x[i] and a[2020]")], set()) == [
        "y.py: [repo:nothing] is not defined in falsify/contracts/SOURCES.md"]


def test_defined_keys_read_the_table():
    table = "| key | a |\n|---|---|\n| `[hu2021]` | Hu | LoRA |\n| `[repo:peft]` | HF |\n"
    assert defined_keys(table) == {"hu2021", "repo:peft"}


def test_stale_path_is_reported():
    items = [("a.py", "see impl/hf.py and falsify/llm/no_such_module.py"),
             ("b.md", "the library is falsify/contracts/softmax-kernel-v1.yaml")]
    assert stale_paths(items) == ["a.py: impl/hf.py does not exist",
                                  "a.py: falsify/llm/no_such_module.py does not exist"]


def test_missing_function_is_reported():
    assert stale_paths([("c.py", "tests/test_citations.py:stale_paths")]) == []
    assert stale_paths([("c.py", "tests/test_citations.py:no_such_function")]) == [
        "c.py: tests/test_citations.py defines no no_such_function"]


def test_stale_module_is_reported():
    assert stale_modules(
        [("f.py", "falsify.toml, falsify.probes.train_loop and falsify.harness")]) == []
    assert stale_modules([("f.py", "falsify.impl.llm.run:PretrainRun")]) == [
        "f.py: module falsify.impl.llm.run does not exist"]
    assert stale_modules([("f.py", "falsify.reference.softmax:no_such_name")]) == [
        "f.py: module falsify.reference.softmax defines no no_such_name"]
    assert stale_modules([("f.py", "falsify.reference.softmax.no_such_name")]) == [
        "f.py: module falsify.reference.softmax defines no no_such_name"]
    assert stale_modules([("f.py", "falsify.llm.no_such_module")]) == [
        "f.py: module falsify.llm defines no no_such_module"]


@pytest.mark.parametrize("text", [
    "seed 002 §11.2 rmsnorm_activation_reuse", "GPU backend parity spec (seeds/004)",
    "Triton interpreter (kernel-anchors §4.2)", "source: brief", "as the brief says",
    "Albor §3.1", "issue 6: >= 1.3x", "issue Kernel suite II", "ALB-060: 43 of 5000 steps",
    "C-HYPERPARAMS-001", "the seeds' ALB-076"])
def test_outside_citation_is_reported(text):
    assert outside_citations([("d.yaml", text)]) != []


@pytest.mark.parametrize("text", [
    "examples: [{seed: 1}]", "# seed 6: T = 1", "be brief", "h.hexdigest()",
    "Higham (2002) §3.1", "FALSIFY-RN-008", "MUT-ATT-001", "GACC-INV-001"])
def test_ordinary_text_is_not_reported(text):
    assert outside_citations([("e.yaml", text)]) == []
