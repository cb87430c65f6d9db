"""One name everywhere: a contract's probes, mutants and proofs live in modules named after it.

The name is the contract's id without its `-kernel-v1` or `-v1` suffix, dashes as underscores
(train-loop-v1 -> `train_loop`), so a reader who opens a contract knows which files hold its
code, and a module's name says which contract it serves.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

import falsify

ROOT = Path(falsify.__file__).parent
CONTRACTS = sorted((ROOT / "contracts").glob("*.yaml"))
FOLDERS = ("probes", "mutants", "proofs")

# Modules shared by several contracts; each needs a reason to exist outside one contract's name.
SHARED = {
    "proofs/bitvec.py": "the IEEE bit-vector helpers every kernel's z3 proofs are written with",
}

BINDING = re.compile(r"^falsify\.(probes|mutants|proofs)\.(\w+)(?::|$)")


def module_name(contract_id: str) -> str:
    return re.sub(r"(-kernel)?-v1$", "", contract_id).replace("-", "_")


def bindings(node, path=""):
    """Every (yaml path, value) of a `run:`, `with:` or `target:` key, however deep."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("run", "with", "target") and isinstance(v, str):
                yield f"{path}.{k}", v
            yield from bindings(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from bindings(v, f"{path}[{i}]")


def test_module_name_rule():
    assert module_name("train-loop-v1") == "train_loop"
    assert module_name("cross-entropy-kernel-v1") == "cross_entropy"


def test_every_probe_mutant_and_proof_module_is_named_after_a_contract():
    names = {module_name(p.stem) for p in CONTRACTS}
    strays = [f"{folder}/{f.name}" for folder in FOLDERS
              for f in sorted((ROOT / folder).glob("*.py"))
              if f.name != "__init__.py" and f.stem not in names
              and f"{folder}/{f.name}" not in SHARED]
    assert strays == [], f"modules named after no contract: {strays}"
    for shared in SHARED:
        assert (ROOT / shared).is_file(), f"{shared} is listed as shared but does not exist"


def test_every_binding_points_into_its_own_contracts_modules():
    wrong = []
    for path in CONTRACTS:
        own = module_name(path.stem)
        for where, value in bindings(yaml.safe_load(path.read_text(encoding="utf-8"))):
            m = BINDING.match(value)
            if m and m.group(2) != own:
                wrong.append(f"{path.name}{where}: {value} (expected falsify.{m.group(1)}.{own})")
    assert wrong == [], "bindings into another contract's module:\n" + "\n".join(wrong)
