"""No function or method under falsify/ is longer than 80 lines (end_lineno − lineno + 1, so
the def line through the last line of its body; decorators not counted). A long function hides
its steps: split it into helpers whose names say what each step does."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80


def long_functions(root: Path, limit: int = LIMIT) -> list[tuple[str, int, str, int]]:
    """(file, line, qualified name, length) of every function longer than `limit` lines in the
    .py files under root/falsify, nested functions and methods included."""
    found = []
    for path in sorted((root / "falsify").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        found += [(rel, line, name, n) for line, name, n in
                  _lengths(ast.parse(path.read_text(encoding="utf-8")), "") if n > limit]
    return found


def _lengths(node: ast.AST, prefix: str):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            if not isinstance(child, ast.ClassDef):
                yield child.lineno, name, child.end_lineno - child.lineno + 1
            yield from _lengths(child, name + ".")
        else:
            yield from _lengths(child, prefix)


def test_no_function_is_longer_than_the_limit():
    found = long_functions(ROOT)
    assert not found, f"functions over {LIMIT} lines (split them into named helpers):\n" + \
        "\n".join(f"{f}:{line}: {name} ({n} lines)" for f, line, name, n in found)


def test_the_checker_names_a_long_method_and_spares_a_short_one(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(80))
    (tmp_path / "falsify").mkdir()
    (tmp_path / "falsify" / "m.py").write_text(
        "class C:\n    def long(self):\n" + body + "\n"
        "def short():\n    return 1\n")
    assert long_functions(tmp_path) == [("falsify/m.py", 2, "C.long", 81)]
