"""Safe YAML reading that remembers where every value came from.

PyYAML is used for parsing; we build plain Python values from the node graph ourselves so that
every value keeps its source line (for `file:line` messages), duplicate keys are reported
instead of silently overwritten, and hostile input stays bounded: files over MAX_BYTES are
refused before reading, nesting deeper than MAX_DEPTH is refused from the event stream (which
is iterative) before any recursive composing, and alias bombs are stopped by a node budget.
Aliases are followed when values are built, so the same bounds apply again there: an alias
that refers to a node containing it (`self: &S [*S]`) is refused as recursive, and nesting
built up through aliases is held to MAX_DEPTH like written nesting.

Limits (contracts and `falsify train --config` files alike): MAX_BYTES of UTF-8 text,
MAX_DEPTH levels of nesting, MAX_NODES values after alias expansion.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

MAX_BYTES = 2 * 1024 * 1024  # contracts are small; a 10 MB file is a mistake, not a contract
MAX_NODES = 200_000  # bounds alias expansion ("billion laughs") in time and memory
MAX_DEPTH = 64  # real contracts nest < 10 deep; deep nesting overflows recursive composers
MAX_REPAIRS = 50

# libyaml is ~15x faster than the pure-Python parser (a directory of 500 contracts stays
# quick). Its composer recurses in C and can crash on deep nesting, so depth is checked on the
# event stream first (_check_depth).
_FAST = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


class YamlError(Exception):
    """A file that cannot be read as YAML. `line` is 1-based or None. `repairable`: a syntax
    error the compat loader may recover from (see `load(repair=True)`)."""

    def __init__(self, path: str, line: int | None, message: str, repairable: bool = False):
        self.path, self.line, self.message = path, line, _one_line(message)
        self.repairable = repairable
        super().__init__(f"{path}:{line or 1}: {self.message}")


@dataclass
class Located:
    """A parsed document plus the line of every JSON-pointer-like path in it."""

    data: object
    lines: dict[tuple, int] = field(default_factory=dict)
    duplicates: list[tuple[tuple, int]] = field(default_factory=list)
    # (line, message) for every line the compat loader had to re-read (load(repair=True))
    repairs: list[tuple[int, str]] = field(default_factory=list)

    def to_json(self) -> dict:
        """Plain JSON (a path is a list of keys and indices), for the parse cache
        (falsify/harness/model.py:_parse): YAML's values are JSON's, so nothing is lost."""
        return {"data": self.data, "lines": [[list(k), v] for k, v in self.lines.items()],
                "duplicates": [[list(k), v] for k, v in self.duplicates],
                "repairs": [list(r) for r in self.repairs]}

    @classmethod
    def from_json(cls, d: dict) -> Located:
        return cls(d["data"], {tuple(k): v for k, v in d["lines"]},
                   [(tuple(k), v) for k, v in d["duplicates"]],
                   [(line, msg) for line, msg in d["repairs"]])

    def line_of(self, path: tuple | list) -> int:
        """Line of the deepest known prefix of `path` (1-based)."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), 1)


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def read_text(path: str | os.PathLike, what: str = "contracts") -> str:
    """The file's text; `what` names the kind of file in the size-limit message."""
    p = Path(path)
    try:
        if not p.is_file():
            what = "a directory" if p.is_dir() else "not a regular file" if p.exists() else None
            raise YamlError(str(path), None, f"cannot read file: {what or 'no such file'}")
        # read at most MAX_BYTES + 1: stat sizes lie for /proc files and pipes
        with p.open("rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise YamlError(str(path), None, f"cannot read file: {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:
        try:
            size = f"{p.stat().st_size / 1e6:.1f} MB"
        except OSError:
            size = "too large"
        raise YamlError(str(path), None, f"file is {size}; {what} are limited to "
                                         f"{MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return raw.decode("utf-8-sig")  # a UTF-8 byte-order mark is harmless: drop it
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise YamlError(str(path), line, f"not UTF-8: byte 0x{raw[e.start]:02x} at offset "
                        f"{e.start}") from None


def _check_depth(text: str, path: str) -> None:
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=_FAST):
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise YamlError(path, ev.start_mark.line + 1,
                                    f"nested deeper than {MAX_DEPTH} levels")
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.MarkedYAMLError as e:
        # PyYAML >= 6.0.4 stops the scanner at its own depth limit (far above ours) before the
        # events above see it: the same fact, said the same way.
        if "maximum nesting depth" not in str(e.problem or ""):
            raise
        line = e.problem_mark.line + 1 if e.problem_mark else 1
        raise YamlError(path, line, f"nested deeper than {MAX_DEPTH} levels") from None


def _compose(text: str, path: str) -> yaml.Node | None:
    try:
        _check_depth(text, path)
        return yaml.compose(text, Loader=_FAST)
    except yaml.YAMLError as fast_error:
        err = fast_error
        if _FAST is not yaml.SafeLoader:
            # libyaml's messages are terse ("found undefined alias"); the pure-Python parser
            # names the culprit. Only on the error path, and the depth is already bounded.
            try:
                yaml.compose(text, Loader=yaml.SafeLoader)
            except yaml.YAMLError as e:
                err = e
            except RecursionError:
                pass
        raise _yaml_error(err, text, path) from None


def _yaml_error(e: yaml.YAMLError, text: str, path: str) -> YamlError:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        what = e.problem or str(e)
        if e.context:
            what = f"{what} ({e.context})"
        block = bool(e.context and "block scalar" in e.context)
        return YamlError(path, line, f"YAML syntax error: {what}", repairable=block)
    if isinstance(e, yaml.reader.ReaderError):
        line = text[: e.position].count("\n") + 1
        return YamlError(path, line, f"unacceptable character #x{e.character:04x} "
                                     "(control characters are not allowed in YAML)")
    return YamlError(path, None, f"YAML error: {e}")


# `key: |text…` or `- >text…`: pv files quote formulas such as |x| < eps without quotes, and
# YAML reads the leading | or > as a block-scalar header. serde_yaml rejects these too; the
# author meant a one-line string.
_BAD_BLOCK = re.compile(r"^(\s*(?:-\s+)*(?:[^\s#'\"-][^#]*?:\s+)?)([|>].*?)\s*$")
_BLOCK_HEADER = re.compile(r"^[|>][1-9+-]{0,2}\s*(#.*)?$")


def _quote_line(line: str) -> str | None:
    m = _BAD_BLOCK.match(line)
    if not m or _BLOCK_HEADER.match(m.group(2)):
        return None
    value = re.sub(r"\s+#.*$", "", m.group(2))  # a plain scalar would drop the comment too
    return m.group(1) + json.dumps(value, ensure_ascii=False)


def _repair(text: str, path: str, first: YamlError) -> tuple[yaml.Node | None, list]:
    """Quote the offending lines one at a time until the document parses (same line count,
    so every line number stays right). Gives up with the first error if a line can't be
    fixed this way."""
    lines, repairs, err = text.split("\n"), [], first
    for _ in range(MAX_REPAIRS):
        if not err.repairable or not err.line or err.line > len(lines):
            break
        fixed = _quote_line(lines[err.line - 1])
        if fixed is None:
            break
        repairs.append((err.line, f"value {lines[err.line - 1].strip()[:60]!r} is not valid "
                                  "YAML (a leading | or > starts a block scalar); read as a "
                                  "quoted string"))
        lines[err.line - 1] = fixed
        try:
            return _compose("\n".join(lines), path), repairs
        except YamlError as e:
            err = e
    raise first


# JSON (and pv's serde_yaml) has no dates or binary: keep what the author wrote.
_AS_WRITTEN = {"tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:binary"}
_STR = "tag:yaml.org,2002:str"
_PLAIN_COLLECTIONS = {"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}
# YAML 1.1 (PyYAML) reads `1e-6` as a string; YAML 1.2 and serde_yaml read a number.
_FLOAT12 = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d+$")


def load(text: str, path: str = "<string>", repair: bool = False,
         empty_ok: bool = False) -> Located:
    """Parse one YAML document. With `repair`, lines whose value starts with a stray block
    indicator are re-read as strings and listed in `Located.repairs` (compat mode only). With
    `empty_ok`, an empty document (or one of only comments) is `Located(data=None)`."""
    if not text.strip():
        if empty_ok:
            return Located(data=None)
        raise YamlError(path, 1, "empty file: a contract needs at least `metadata` and `equations`")
    repairs: list = []
    try:
        node = _compose(text, path)
    except YamlError as e:
        if not repair:
            raise
        node, repairs = _repair(text, path, e)
    if node is None:
        if empty_ok:
            return Located(data=None, repairs=repairs)
        raise YamlError(path, 1, "empty document (only comments)")
    loc = Located(data=None, repairs=repairs)
    loc.data = _Builder(path, loc).build(node, ())
    return loc


class _Builder:
    """Turns one composed YAML node tree into plain data, recording in `loc` the line of every
    value and every duplicate key. Refuses what would make the data lie or explode: tags other
    than plain maps and lists, merge keys, non-scalar keys, cycles, and more than MAX_NODES
    nodes or MAX_DEPTH levels (alias bombs)."""

    def __init__(self, path: str, loc: Located):
        self.path, self.loc = path, loc
        self.budget = MAX_NODES
        self.constructor = yaml.SafeLoader("")  # only used for scalar resolution/construction
        self.open_nodes: set[int] = set()  # collections being built: meeting one again is a cycle

    def scalar(self, n: yaml.Node):
        if n.tag in _AS_WRITTEN:
            return n.value
        if n.tag == _STR and not n.style and _FLOAT12.match(n.value):  # plain, unquoted
            return float(n.value)
        try:
            return self.constructor.construct_object(n, deep=True)
        except (yaml.constructor.ConstructorError, ValueError, OverflowError) as e:
            problem = getattr(e, "problem", None) or str(e)
            raise YamlError(self.path, n.start_mark.line + 1,
                            f"cannot read value: {problem}") from None

    def build(self, n: yaml.Node, at: tuple):
        self.budget -= 1
        if self.budget < 0:
            raise YamlError(self.path, n.start_mark.line + 1,
                            f"document expands to more than {MAX_NODES} nodes "
                            "(alias bomb or oversized file)")
        if isinstance(n, yaml.ScalarNode):
            self.loc.lines.setdefault(at, n.start_mark.line + 1)
            return self.scalar(n)
        if id(n) in self.open_nodes:
            raise YamlError(self.path, n.start_mark.line + 1,
                            "recursive alias: an alias refers to the anchored node that "
                            f"contains it (at {_pointer(at)})")
        if len(at) >= MAX_DEPTH:
            raise YamlError(self.path, n.start_mark.line + 1,
                            f"nested deeper than {MAX_DEPTH} levels (through aliases)")
        self.open_nodes.add(id(n))
        try:
            return self.collection(n, at)
        finally:
            self.open_nodes.discard(id(n))

    def collection(self, n: yaml.Node, at: tuple):
        self.loc.lines.setdefault(at, n.start_mark.line + 1)
        if not isinstance(n, yaml.ScalarNode) and n.tag not in _PLAIN_COLLECTIONS:
            # `!!python/object/apply:os.system [...]` must not read as a harmless list
            raise YamlError(self.path, n.start_mark.line + 1, f"unsupported YAML tag {n.tag!r}")
        if isinstance(n, yaml.MappingNode):
            return self.mapping(n, at)
        return [self.build(v, at + (i,)) for i, v in enumerate(n.value)]

    def mapping(self, n: yaml.MappingNode, at: tuple) -> dict:
        out = {}
        for k, v in n.value:
            if not isinstance(k, yaml.ScalarNode):
                raise YamlError(self.path, k.start_mark.line + 1, "mapping keys must be scalars")
            if k.tag.endswith(":merge") or k.value == "<<":
                raise YamlError(self.path, k.start_mark.line + 1,
                                "merge keys (<<) are not supported")
            key = self.scalar(k)
            if not isinstance(key, str):
                # JSON objects have string keys: `1:`, `yes:`, `~:` or a date are kept as
                # written (YAML 1.1 would make them int, True, None, date)
                key = k.value
            if key in out:
                self.loc.duplicates.append((at + (key,), k.start_mark.line + 1))
            self.loc.lines[at + (key,)] = k.start_mark.line + 1
            out[key] = self.build(v, at + (key,))
        return out


def _pointer(at: tuple) -> str:
    return "/" + "/".join(str(k) for k in at)


def load_file(path: str | os.PathLike, repair: bool = False) -> Located:
    return load(read_text(path), str(path), repair=repair)
