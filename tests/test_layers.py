"""Layers point one way, read from the code's own imports (at any depth, function bodies
included, and `importlib.import_module` of a literal or an f-string with a literal prefix).

    contracts, reference          -> nothing of ours
    kernels (torch, triton)       -> reference, for shared constants only (UPPER_CASE names)
    harness                       -> contracts
    llm (the application)         -> kernels, harness, reference
    probes, mutants, proofs       -> llm, kernels, harness, reference
    bench                         -> the above
    conformance                   -> harness, contracts (adapters wrap third-party libraries)
    cli                           -> everything; nothing imports cli but falsify/__main__.py
    errors, triton_env, arguments -> leaves anyone may import (arguments: the argument checks a
                                     kernel shares with its reference; validation only, no math)

Within a layer, modules import in one direction too: no import cycle anywhere in the package,
a function-level import included (one defers an import, it does not break a cycle)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"errors", "triton_env", "arguments"}
ALLOWED = {
    "package": {"leaf"},
    "contracts": set(),
    "reference": {"leaf"},
    "kernels": {"reference-constant", "leaf"},
    "harness": {"contracts", "leaf"},
    "llm": {"kernels", "harness", "reference", "reference-constant", "contracts", "leaf"},
    "checks": {"llm", "kernels", "harness", "reference", "reference-constant", "contracts",
               "leaf"},
    "bench": {"checks", "llm", "kernels", "harness", "reference", "reference-constant",
              "contracts", "leaf"},
    "conformance": {"harness", "contracts", "leaf"},
    "cli": {"package", "bench", "conformance", "checks", "llm", "kernels", "harness", "reference",
            "reference-constant", "contracts", "leaf"},
    "main": {"package", "cli", "leaf"},
}
CONSTANT = re.compile(r"^[A-Z][A-Z0-9_]*$")


def layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "falsify":
        return None
    if len(parts) == 1:
        return "package"
    top = parts[1]
    if top in LEAVES:
        return "leaf"
    if top == "__main__":
        return "main"
    if top in ("probes", "mutants", "proofs"):
        return "checks"
    if top in ("contracts", "reference", "kernels", "harness", "llm", "bench", "conformance",
               "cli"):
        return top
    return None


def _module_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _string_prefix(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0],
                                                                          ast.Constant):
        return node.values[0].value.rstrip(".")
    return None


def imports(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) for every import in `source`, at any depth."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [a.name for a in node.names]
            if node.module == "falsify":  # `from falsify import cli`: the submodules
                out += [(node.lineno, f"falsify.{n}", []) for n in names]
            else:
                out.append((node.lineno, node.module, names))
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"):
            mod = _string_prefix(node.args[0])
            if mod:
                out.append((node.lineno, mod, []))
    return out


def violations(root: Path) -> list[tuple[str, int, str, str, str]]:
    """(file, line, importer layer, imported layer, module) for every import that points the
    wrong way under `root` (a tree holding falsify/)."""
    bad = []
    for path in sorted((root / "falsify").rglob("*.py")):
        src_layer = layer(_module_of(path, root))
        if src_layer is None:
            continue
        rel = path.relative_to(root).as_posix()
        for line, module, names in imports(path.read_text(encoding="utf-8")):
            dst = layer(module)
            if dst is None or dst == src_layer:
                continue
            if dst == "reference" and names and all(CONSTANT.match(n) for n in names):
                dst = "reference-constant"
            if dst not in ALLOWED[src_layer]:
                bad.append((rel, line, src_layer, dst, module))
    return bad


def _render(v) -> str:
    return f"{v[0]}:{v[1]}: {v[2]} -> {v[3]} ({v[4]})"


def test_layers_point_one_way():
    found = violations(ROOT)
    assert not found, "upward imports:\n" + "\n".join(map(_render, found))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_the_checker_fails_on_an_upward_import(tmp_path):
    root = _tree(tmp_path, {
        "falsify/__init__.py": "",
        "falsify/harness/model.py": "def f():\n    from falsify.cli.common import group\n",
        "falsify/reference/softmax.py": "import falsify.kernels.torch.softmax\n",
        "falsify/kernels/torch/gemm.py": "from falsify.reference.gemm import check_args\n",
        "falsify/kernels/torch/nf4.py": "from falsify.reference.nf4 import NF4_CODE\n",
        "falsify/llm/ops.py": ("import importlib\n"
                               "def k(b):\n"
                               "    return importlib.import_module(f'falsify.bench.{b}')\n"),
        "falsify/cli/run.py": "from falsify.llm import ops\n",
    })
    got = {(v[0], v[2], v[3]) for v in violations(root)}
    assert got == {("falsify/harness/model.py", "harness", "cli"),
                   ("falsify/reference/softmax.py", "reference", "kernels"),
                   ("falsify/kernels/torch/gemm.py", "kernels", "reference"),
                   ("falsify/llm/ops.py", "llm", "bench")}, got


def import_cycles(root: Path) -> list[set[str]]:
    """The groups of modules under root/falsify that import each other round (imports at any
    depth: a function-level import closes a cycle as well, it only defers it)."""
    paths = {_module_of(p, root): p for p in sorted((root / "falsify").rglob("*.py"))}
    graph = {m: set() for m in paths}
    for mod, path in paths.items():
        for _, module, names in imports(path.read_text(encoding="utf-8")):
            graph[mod] |= {m for m in [module, *(f"{module}.{n}" for n in names)]
                           if m in paths and m != mod}
    reach = {m: _reachable(graph, m) for m in graph}
    groups = {frozenset({m} | {n for n in reach[m] if m in reach[n]})
              for m in graph if m in reach[m]}
    return [set(g) for g in sorted(groups, key=sorted)]


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph[m]
    return seen


def test_no_module_imports_itself_round():
    cycles = import_cycles(ROOT)
    assert not cycles, "import cycles (each group imports itself round):\n" + \
        "\n".join(", ".join(sorted(g)) for g in cycles)


def test_the_cycle_finder_sees_a_function_level_import(tmp_path):
    root = _tree(tmp_path, {
        "falsify/__init__.py": "",
        "falsify/llm/a.py": "from falsify.llm.b import f\n",
        "falsify/llm/b.py": "def f():\n    from falsify.llm import a\n",
        "falsify/llm/c.py": "from falsify.llm import a\n",
    })
    assert import_cycles(root) == [{"falsify.llm.a", "falsify.llm.b"}]

