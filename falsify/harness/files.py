"""File modes for files written through a temp file. The standard library only: the llm wing
and the harness both import it."""

from __future__ import annotations

import os
from pathlib import Path


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (/proc/self/status):
    setting and restoring it would briefly give a file another thread creates mode 0666."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0)
    os.umask(umask)
    return umask


def plain_mode(path: str | Path) -> None:
    """Give a file written through a temp file the mode a plain open() would (0o666 & ~umask,
    0644 under umask 022): mkstemp creates 0600, and so does safetensors' writer."""
    os.chmod(path, 0o666 & ~_umask())
