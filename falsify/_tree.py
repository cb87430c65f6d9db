"""Refuse a mixed install: every `falsify.*` subpackage must come from the tree `falsify` did.

The subpackages live in separate top-level folders of a checkout (package-dir), so with one
checkout installed editable and another on sys.path, `falsify` could come from one tree and
`falsify.harness` from the other, and a run would test code nobody asked for. The check runs at
`import falsify`, on import specs only (nothing is imported).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SUBPACKAGES = ("falsify.harness", "falsify.impl", "falsify.reference", "falsify.contracts")


def package_dir(spec) -> Path | None:
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve()
    return Path(spec.origin).resolve().parent if spec.origin else None


def tree_of(pkg_dir: Path, root_pkg_dir: Path) -> Path:
    """The tree holding a subpackage: site-packages for a wheel (falsify/harness), the
    checkout root for an editable install (harness/ next to falsify/)."""
    return pkg_dir.parent.parent if pkg_dir.parent == root_pkg_dir else pkg_dir.parent


def check(falsify_file: str) -> None:
    root_pkg = Path(falsify_file).resolve().parent
    tree = root_pkg.parent
    mixed = []
    for name in SUBPACKAGES:
        d = package_dir(importlib.util.find_spec(name))
        if d is None:
            continue  # reported by the import that needs it, with its own message
        other = tree_of(d, root_pkg)
        if other != tree:
            mixed.append(f"{name} from {other}")
    if mixed:
        raise ImportError(f"mixed falsify installation: falsify comes from {tree} but "
                          f"{'; '.join(mixed)}. Install one tree (pip install -e <checkout>, "
                          "or a wheel) and run from it")
