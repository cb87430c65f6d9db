"""What a `--help` shows of a module's docstring: its whole first paragraph, on one line (a
first line alone is cut mid-sentence). A leaf module, so the cli and the benches share it."""

from __future__ import annotations


def first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").split("\n\n")[0].split())
