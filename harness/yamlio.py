"""Safe YAML reading that remembers where every value came from.

PyYAML's SafeLoader is used for parsing; we build plain Python values from the node graph
ourselves so that every value keeps its source line (for `file:line` messages), duplicate keys
are reported instead of silently overwritten, and alias bombs are stopped by a node budget
instead of exhausting memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

MAX_BYTES = 2 * 1024 * 1024  # contracts are small; a 10 MB file is a mistake, not a contract
MAX_NODES = 200_000  # bounds alias expansion ("billion laughs") in time and memory


class YamlError(Exception):
    """A file that cannot be read as YAML. `line` is 1-based or None."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line, self.message = path, line, message
        super().__init__(f"{path}:{line or 1}: {message}")


@dataclass
class Located:
    """A parsed document plus the line of every JSON-pointer-like path in it."""

    data: object
    lines: dict[tuple, int] = field(default_factory=dict)
    duplicates: list[tuple[tuple, int]] = field(default_factory=list)

    def line_of(self, path: tuple | list) -> int:
        """Line of the deepest known prefix of `path` (1-based)."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)


def read_text(path: str | os.PathLike) -> str:
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise YamlError(str(path), None, f"cannot read file: {e.strerror}") from None
    if size > MAX_BYTES:
        raise YamlError(
            str(path), None, f"file is {size / 1e6:.1f} MB; contracts are limited to "
            f"{MAX_BYTES // (1024 * 1024)} MiB"
        )
    raw = p.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise YamlError(str(path), line, f"not UTF-8: byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}") from None


def load(text: str, path: str = "<string>") -> Located:
    if not text.strip():
        raise YamlError(path, 1, "empty file: a contract needs at least `metadata` and `equations`")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise YamlError(path, line, f"YAML syntax error: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise YamlError(path, None, f"YAML error: {e}") from None
    if node is None:
        raise YamlError(path, 1, "empty document")
    loc = Located(data=None)
    budget = [MAX_NODES]
    constructor = yaml.SafeLoader(text)  # only used for scalar resolution/construction

    def build(n: yaml.Node, at: tuple):
        budget[0] -= 1
        if budget[0] < 0:
            raise YamlError(path, n.start_mark.line + 1,
                            f"document expands to more than {MAX_NODES} nodes "
                            "(alias bomb or oversized contract)")
        loc.lines.setdefault(at, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            out = {}
            for k, v in n.value:
                if not isinstance(k, yaml.ScalarNode):
                    raise YamlError(path, k.start_mark.line + 1, "mapping keys must be scalars")
                key = constructor.construct_object(k, deep=True)
                if key == "<<":
                    raise YamlError(path, k.start_mark.line + 1, "merge keys (<<) are not supported")
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    raise YamlError(path, k.start_mark.line + 1, "mapping keys must be scalars")
                if key in out:
                    loc.duplicates.append((at + (key,), k.start_mark.line + 1))
                loc.lines[at + (key,)] = k.start_mark.line + 1
                out[key] = build(v, at + (key,))
            return out
        if isinstance(n, yaml.SequenceNode):
            return [build(v, at + (i,)) for i, v in enumerate(n.value)]
        try:
            return constructor.construct_object(n, deep=True)
        except yaml.constructor.ConstructorError as e:
            raise YamlError(path, n.start_mark.line + 1, f"cannot read value: {e.problem}") from None

    loc.data = build(node, ())
    return loc


def load_file(path: str | os.PathLike) -> Located:
    return load(read_text(path), str(path))
