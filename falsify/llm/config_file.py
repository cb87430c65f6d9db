"""Reading a `--config` file of `falsify train` / `falsify finetune`: a flat YAML mapping of
config fields.

The file is read with the strict loader the contracts use (falsify.harness.yamlio), so bad input
is a `ConfigFileError` naming `file:line`, never a traceback:

- a missing file, a directory, a device, bytes that are not UTF-8, a YAML syntax error;
- a tag (`!!python/object/apply:...`, `!thing`): only plain YAML values are read;
- a key given twice (YAML would silently keep the last value);
- a top level that is not a mapping.

Limits (those of yamlio): at most 2 MiB of text (`MAX_BYTES`), 64 levels of nesting
(`MAX_DEPTH`, counted through aliases too), 200,000 values once aliases are expanded
(`MAX_NODES`: an alias bomb is refused); an alias that contains itself is refused. An empty
file (or one of only comments) sets no field. Whether each value fits its field is checked by
the config's own parser (`config_from_dict`), whose errors name the field and, for a value read
from a file, `file:line` (the lines travel with the mapping: `FieldLines`).
"""

from __future__ import annotations

from pathlib import Path

from falsify.harness import yamlio

LIMITS = (f"at most {yamlio.MAX_BYTES // 2**20} MiB, {yamlio.MAX_DEPTH} levels of nesting and "
          f"{yamlio.MAX_NODES:,} values after alias expansion")


class ConfigError(ValueError):
    """A bad config field; the message names it. Every config reader raises it (the config
    classes in falsify/llm/config.py re-export it), so it lives here, below them."""


class ConfigFileError(ConfigError):
    """A config file that cannot be read as a mapping of fields; the message is `file:line: …`."""

    def __init__(self, path: str, line: int | None, message: str):
        self.path, self.line = path, line
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}")


def read_config_file(path: str | Path) -> dict:
    """The file's top-level mapping (field name -> plain YAML value), with each field's line."""
    spath = str(path)
    try:
        loc = yamlio.load(yamlio.read_text(path, what="config files"), spath, empty_ok=True)
    except yamlio.YamlError as e:
        raise ConfigFileError(spath, e.line, e.message) from None
    if loc.duplicates:
        key_path, line = loc.duplicates[0]
        if len(key_path) == 1:
            raise ConfigFileError(spath, line, f"config field {key_path[0]!r} is given twice; "
                                               "remove one (YAML would keep only the last)")
        raise ConfigFileError(spath, line, f"key {key_path[-1]!r} is given twice in "
                                           f"{'/'.join(map(str, key_path[:-1]))}")
    if loc.data is None:
        return FieldLines()
    if not isinstance(loc.data, dict):
        raise ConfigFileError(spath, 1, "top level must be a mapping of config fields "
                                        f"(field: value), not a {_kind(loc.data)}")
    return FieldLines(loc.data, lines={k: loc.line_of((k,)) for k in loc.data})


class FieldLines(dict):
    """A config file's fields, with the line each was written on (`lines`): the config's own
    value checks run after reading, and their errors must still say `file:line`."""

    def __init__(self, *args, lines: dict[str, int] | None = None):
        super().__init__(*args)
        self.lines = lines or {}


def _kind(value) -> str:
    return {list: "list", str: "string"}.get(type(value), type(value).__name__)
