"""Atomic file writes with a plain file's mode. The standard library only: the llm wing and the
harness both import it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def atomic_path(path: str | Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temp file beside `path` for a writer that takes a file name (a tokenizer's save, a
    safetensors or GGUF writer). When the block ends without an error the temp file gets a plain
    file's mode and replaces `path` in one os.replace, so a reader sees the old file or the new
    one, never half of either; on an error it is removed and `path` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        plain_mode(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | Path, data: str | bytes, *, durable: bool = False) -> None:
    """Replace `path` with `data` (text is written as UTF-8 with "\\n" line ends) through
    atomic_path. `durable` fsyncs the data before the rename, for files whose loss after a crash
    costs more than the sync: ledgers and checkpoints."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
