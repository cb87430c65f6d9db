"""A machine-local cache of facts derived from source files, each kept with the stamps of
the files and directories it was derived from (the sha256 of a file's bytes; of a directory's
sorted entry names), and trusted only while every stamp still matches. Content, not
modification times: a checkout, a copy or a coarse clock cannot make an edit look unchanged.

It holds fingerprints (falsify/harness/fingerprint.py): walking the AST of every module a
check reaches costs seconds per process, and `pv coverage` or `falsify run --changed` would
otherwise pay it on every call. It holds parsed contracts too, by the sha256 of their text
(falsify/harness/model.py: `_parse`), and the texts known to pass the schema. A directory's
stamp changes when a file is added to it or removed, so a new module that would shadow a name
also invalidates.

It lives in the user's cache directory (`$FALSIFY_CACHE_DIR`, else `$XDG_CACHE_HOME/falsify`,
else `~/.cache/falsify`), never in the project: a repository someone else wrote cannot ship a
cache that vouches for its own code. It is JSON, written atomically, merged with what other
processes wrote meanwhile; a missing, unreadable or foreign-format file is an empty cache."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
from pathlib import Path

from falsify.harness.files import atomic_write

FORMAT = 1
MAX_ENTRIES = 20_000  # the oldest go first: a cache that grows with every edit stays bounded


def cache_dir() -> Path:
    if os.environ.get("FALSIFY_CACHE_DIR"):
        return Path(os.environ["FALSIFY_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "falsify"


_STAMPS: dict[Path, str | None] = {}


def stamp(path: Path) -> str | None:
    """The digest of a file's bytes or a directory's entry names; None if it is gone. Read once
    per process (`forget` after editing sources mid-process)."""
    if path not in _STAMPS:
        try:
            data = ("\0".join(sorted(os.listdir(path))).encode() if path.is_dir()
                    else path.read_bytes())
            _STAMPS[path] = hashlib.sha256(data).hexdigest()
        except OSError:
            _STAMPS[path] = None
    return _STAMPS[path]


def forget() -> None:
    _STAMPS.clear()


class StampCache:
    """{key: (value, {path: stamp})} for one purpose and one set of roots."""

    def __init__(self, purpose: str, scope: str, max_entries: int = MAX_ENTRIES):
        digest = hashlib.sha256(f"{FORMAT}\0{scope}".encode()).hexdigest()[:16]
        self.path = cache_dir() / f"{purpose}-{digest}.json"
        self.max_entries = max_entries  # large values (parsed documents) keep fewer
        self.entries = self._read()
        self.new: dict[str, dict] = {}
        self._registered = False

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        ok = isinstance(data, dict) and data.get("format") == FORMAT and \
            isinstance(data.get("entries"), dict)
        return data["entries"] if ok else {}

    def get(self, key: str):
        e = self.entries.get(key)
        if not isinstance(e, dict) or not isinstance(e.get("stamps"), dict):
            return None
        if any(stamp(Path(p)) != s for p, s in e["stamps"].items()):
            return None
        return e.get("value")

    def put(self, key: str, value, files: set[Path]) -> None:
        paths = set(files) | {f.parent for f in files}
        stamps = {str(p): stamp(p) for p in sorted(paths)}
        if any(s is None for s in stamps.values()):
            return  # a file vanished while it was read: do not vouch for it
        self.entries[key] = self.new[key] = {"value": value, "stamps": stamps}
        if not self._registered:
            atexit.register(self.save)
            self._registered = True

    def save(self) -> None:
        """Merge this process's new entries into the file, atomically."""
        if not self.new:
            return
        try:
            merged = {**self._read(), **self.new}
            merged = dict(list(merged.items())[-self.max_entries:])
            atomic_write(self.path, json.dumps({"format": FORMAT, "entries": merged}))
            self.new = {}
        except OSError:
            pass  # a cache that cannot be written only costs time on the next call
