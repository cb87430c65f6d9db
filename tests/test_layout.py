"""Every folder is its import path, and bound code lives where a reader looks for its role:
`run:` functions in falsify/probes/, symbolic targets in falsify/proofs/ (a CrossHair target
may be the proved function itself), mutants in
falsify/mutants/, reference bindings in falsify/reference/; probes import no benchmark, and the
benchmark's case list is complete in the memory subprocess that loads it as __main__."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.harness.model import discover, load_contract

ROOT = Path(__file__).resolve().parents[1]  # this checkout

# A CrossHair target may also be the function under proof analysed in place, a reference's or a
# kernel's (its PEP 316 conditions are in its own docstring: lr-schedule's integer step logic
# is the torch kernel's); z3 targets build claims and live in proofs.
PACKAGE = {"run": ("falsify.probes.",), "target": ("falsify.proofs.",),
           "crosshair": ("falsify.proofs.", "falsify.reference.", "falsify.kernels."),
           "with": ("falsify.mutants.",), "reference": ("falsify.reference.",)}


def _bindings():
    for path in discover([ROOT / "falsify" / "contracts"]):
        c, _ = load_contract(path)
        for eq in c.equations.values():
            if "reference" in eq.bindings:
                yield path.name, "reference", eq.bindings["reference"]
        for t in c.checks:
            if t.spec.get("run"):
                yield path.name, "run", t.spec["run"]
            if t.spec.get("target"):
                key = "crosshair" if t.spec.get("engine") == "crosshair" else "target"
                yield path.name, key, t.spec["target"]
        for m in c.mutants:
            yield path.name, "with", m.with_


BINDINGS = list(_bindings())


def test_every_binding_kind_is_present():
    assert {k for _, k, _ in BINDINGS} == set(PACKAGE)


@pytest.mark.parametrize("key", sorted(PACKAGE))
def test_bindings_live_in_the_package_of_their_role(key):
    wrong = [(f, ref) for f, k, ref in BINDINGS if k == key and not ref.startswith(PACKAGE[key])]
    assert not wrong, f"`{key}` bindings outside {PACKAGE[key]}: {wrong}"


def test_probes_import_no_benchmark():
    hits = []
    for path in sorted((ROOT / "falsify" / "probes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            hits += [f"{path.name}: {n}" for n in names if n.startswith("falsify.bench")]
    assert not hits


def test_bench_memory_subprocess_finds_every_case():
    """The peak-memory child runs `python -m falsify.bench.kernels --measure ...`: the module is
    __main__ there, and must still know the case the parent asked for."""
    from falsify.bench import kernels

    case = next(c for c in kernels.cases(quick=True)
                if c.kernel == "fused_linear_cross_entropy")
    r = subprocess.run([sys.executable, "-m", "falsify.bench.kernels", "--measure", *case.key,
                        "ours", "--quick"], capture_output=True, text=True,
                       timeout=600, cwd=Path(__file__).parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert '"peak_extra_bytes"' in r.stdout


def test_every_module_is_at_the_path_its_name_says():
    """`falsify.X.Y` is falsify/X/Y.py in the checkout and in the installed package: there is
    no package-dir mapping, and every folder holding Python code is a package of the tree."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    import falsify

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = pyproject["tool"]["setuptools"]
    assert "package-dir" not in setuptools, setuptools
    assert Path(falsify.__file__).resolve().parent == ROOT / "falsify"
    for path in sorted((ROOT / "falsify").rglob("*.py")):
        rel = path.relative_to(ROOT)
        for d in rel.parents:
            if d != Path("."):
                assert (ROOT / d / "__init__.py").is_file(), f"{d}/ holds {rel} but is no package"
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        spec = importlib.util.find_spec(name)
        assert spec is not None and Path(spec.origin).resolve() == path, (name, spec)
