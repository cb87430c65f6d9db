"""`pv` verbs (see falsify/pv.py for exit codes and the shared loading path)."""

from __future__ import annotations


def register(sub, add_common, emit, usage_error) -> None:
    """Add this module's subcommands to the `pv` parser."""
