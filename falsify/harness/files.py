"""File modes for files written through a temp file. The standard library only: the llm wing
and the harness both import it."""

from __future__ import annotations

import os
from pathlib import Path


def plain_mode(path: str | Path) -> None:
    """Give a file written through a temp file the mode a plain open() would (0o666 & ~umask,
    0644 under umask 022): mkstemp creates 0600, and so does safetensors' writer."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
