"""Command-line flags generated from a verb's config dataclass(es), once, for every verb that has
one: each field `name` is `--name` (underscores as hyphens), plus the short aliases the verb
declares in its own table (`--out` for out_dir, ...). A new field is a new flag, no other edit.

A flag's value is not converted here: it is handed, as text, to the same parser `key=value`
goes through (`flag_overrides` turns the flags given into `key=value` items), so both forms
accept and refuse the same values with the same error naming the field. A bool field is a
`--name/--no-name` switch.

`key=value` is the old form, accepted for this release after the flags: it comes last and wins,
and each command line that uses it prints one note naming the equivalent flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from falsify.llm.config import ConfigError, coerce_value

OLD_FORM_NOTE = "note: key=value is the old form, kept for this release: use"


@dataclass(frozen=True)
class FlagSpec:
    """The config flags one verb has (kept in the parsed arguments as `config_flags`)."""

    fields: tuple[str, ...]  # every generated flag's field, in the dataclass's order
    bools: frozenset[str]  # those that are --name/--no-name switches
    skip: frozenset[str] = frozenset()  # fields the verb gives a hand-written flag


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _no_flag(name: str) -> str:
    return "--no-" + name.replace("_", "-")


def _union_fields(classes: Sequence[type]) -> dict[str, tuple[object, object]]:
    """{field: (type, default)} over `classes`, the first class that has a field giving it."""
    out: dict[str, tuple[object, object]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in out:
                continue
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = f.default
            out[f.name] = (hints[f.name], default)
    return out


def _metavar(tp) -> str:
    """N, X, A,B or TEXT: what the field's text form is (its `X | None` takes null too)."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) else tp
    if typing.get_origin(base) is list:
        return "A,B"
    return {int: "N", float: "X"}.get(base, "TEXT")


def _show(default) -> str:
    if default is None:
        return "null"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, list):
        return ",".join(map(str, default)) or "none"
    return str(default)


def add_config_flags(parser: argparse.ArgumentParser, classes: Sequence[type],
                     aliases: Mapping[str, Sequence[str]] = {},
                     helps: Mapping[str, str] = {}, skip: Sequence[str] = (),
                     title: str = "config fields", description: str = "",
                     show_defaults: bool = True,
                     choices: Mapping[str, Sequence[str]] = {}) -> FlagSpec:
    """A `--field-name` flag (dest: the field) for every field of `classes` but `skip`, with
    the extra option strings of `aliases` ({field: ["--short", ...]}) and the help texts of
    `helps` ({field: text}; default "config field NAME"), each followed by the default
    (unless `show_defaults` is false: a config whose defaults come from elsewhere). `choices`
    ({field: values}) only shows a field's values in --help: the config's own rule checks
    them, so a flag and key=value are refused alike."""
    known = _union_fields(classes)
    if parser.usage is None:  # a line per field would be a page of usage before the help
        parser.usage = "%(prog)s [options] [--FIELD VALUE ...]"
    # (`choices` may be a shared table, config.CHOICES, naming fields other configs have)
    stray = (set(aliases) | set(helps) | set(skip)) - set(known)
    if stray:  # a table naming a field the config does not have: a renamed field left behind
        raise ValueError(f"flag tables name unknown config fields: {', '.join(sorted(stray))}")
    group = parser.add_argument_group(
        title, "each sets the config field of its name" + description + "; key=value (the "
               "old form) still works for this release and comes last")
    names, bools = [], set()
    for name, (tp, default) in known.items():
        if name in skip:
            continue
        opts = [flag(name), *aliases.get(name, ())]
        text = helps.get(name, f"config field {name}")
        if show_defaults and default is not dataclasses.MISSING:
            text += f" (default: {_show(default)})"
        text = text.replace("%", "%%")  # argparse formats help with %
        if tp is bool:
            group.add_argument(*opts, dest=name, action=argparse.BooleanOptionalAction,
                               default=None, help=text)
            bools.add(name)
        else:
            group.add_argument(*opts, dest=name, default=None, help=text,
                               metavar="{" + ",".join(choices[name]) + "}" if name in choices
                               else _metavar(tp))
        names.append(name)
    spec = FlagSpec(tuple(names), frozenset(bools), frozenset(skip))
    parser.set_defaults(config_flags=spec)
    return spec


def flag_overrides(args) -> list[str]:
    """The config flags given on this command line as `key=value` items, in field order."""
    out = []
    for name in args.config_flags.fields:
        v = getattr(args, name)
        if v is not None:
            out.append(f"{name}={str(v).lower() if isinstance(v, bool) else v}")
    return out


def config_overrides(args, middle: Sequence[str] = ()) -> list[str]:
    """What the config loader applies, in order: the flags, `middle` (a verb's hand-written
    flags as `key=value`), then the old-form `key=value` items, which so win."""
    return [*flag_overrides(args), *middle, *args.overrides]


def _as_flag(item: str, spec: FlagSpec) -> list[str] | None:
    """`key=value` as the flag(s) that say the same; None when no flag does."""
    key, _, value = item.partition("=")
    if key in spec.bools:
        try:  # read as the config reads it: true/false, 1/0, yes/no
            on = coerce_value(key, bool, value, from_text=True)
        except ConfigError:
            return None
        return [flag(key) if on else _no_flag(key)]
    if key in spec.fields:
        return [f"{flag(key)}={value}"]  # `=`: a value starting with '-' stays a value
    return None


def note_old_form(args, file=None) -> None:
    """One line on stderr when the command line uses `key=value`, naming the flags to use
    instead. The ranks of a data-parallel job stay silent: their launcher said it (WORLD_SIZE
    is what falsify.llm.distributed.launched_world_size reads; not imported here, as it
    brings torch)."""
    if not args.overrides or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return
    spec, said = args.config_flags, []
    for item in args.overrides:
        key, _, value = item.partition("=")
        switch = _as_flag(item, spec) if key in spec.bools else None
        if switch:
            said.extend(switch)
        elif key in spec.skip:  # a hand-written list flag: one item per use (--data FILE)
            said.extend(f"{flag(key)} {shlex.quote(v)}" for v in value.split(",") if v)
        elif value.startswith("-"):  # `--sample-prompt -x` would read -x as an option
            said.append(f"{flag(key)}={shlex.quote(value)}")
        else:
            said.append(f"{flag(key)} {shlex.quote(value)}")
    print(f"{OLD_FORM_NOTE} {' '.join(said)}", file=file or sys.stderr)


def rank_argv(args) -> list[str]:
    """The config flags and old-form overrides of this command line as flags (what a
    data-parallel job's ranks are given), in the order the loader applies them, so the last
    still wins. An item no flag says (an unknown field, a bad bool, a field with a
    hand-written flag) stays `key=value`, for the rank's loader to take or refuse by name as
    it would here."""
    out: list[str] = []
    for item in config_overrides(args):
        out.extend(_as_flag(item, args.config_flags) or [item])
    return out


class _Renamed(argparse.Action):
    """A value option under its new name and its old one; each use of the old one still works
    and prints one line naming the new one."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        if option_string != self.option_strings[0]:
            print(f"note: {option_string} is the old name, kept for this release: use "
                  f"{self.option_strings[0]}", file=sys.stderr)


def add_renamed(parser, new: str, old: str, **kwargs) -> None:
    """`new` (the flag, shown in --help) with `old` as an alias noted on use."""
    parser.add_argument(new, old, action=_Renamed, **kwargs)
