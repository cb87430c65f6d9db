"""What every command module shares: the usage error (defined in falsify.errors, a leaf every
layer may raise it from), the parser class, the exit codes, the
contract-reading options and output of the `pv` verbs, and the one way a command line is
parsed and dispatched.

A verb module exposes `register(sub)`: it adds its subparser(s) to `sub` (the parsers are
`Parser`s, so a bad flag raises `UsageError`) and sets `func` to the function that runs the
command with the parsed arguments and returns the exit code. `build_parser` assembles a
program from a list of such modules and `dispatch` runs it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from types import ModuleType

import falsify
from falsify.errors import UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2  # 1: a check failed, a violation, a survivor


class HelpFormatter(argparse.HelpFormatter):
    """argparse measures subcommand names without the indentation it prints them with, so a
    verb longer than the other entries ("equations") gets its help on the next line; this
    measures them as printed, so every verb keeps its help on its own line."""

    def add_argument(self, action):
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and hasattr(action, "_get_subactions"):
            names = [len(self._format_action_invocation(a)) for a in action._get_subactions()]
            self._action_max_length = max([self._action_max_length]
                                          + [n + self._current_indent + 2 for n in names])


class RawDescriptionHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """For a program whose description is its module docstring, laid out by hand."""


class Parser(argparse.ArgumentParser):
    # True on a verb whose positionals may come before, between or after its flags
    # (`falsify finetune lr=1e-3 --rank 8 seed=1`: the old form's overrides among the flags).
    # A subcommand's parser is run by its parent through parse_known_args, so that is where
    # intermixing has to happen.
    intermixed = False
    _intermixing = False

    def __init__(self, *a, **k):
        k.setdefault("formatter_class", HelpFormatter)
        super().__init__(*a, **k)
        # the innermost (sub)command parsed names itself, for errors found after parsing
        self.set_defaults(command_prog=self.prog)

    def error(self, message):
        raise UsageError(f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):
        if not self.intermixed or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back in here
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _module(m: str | ModuleType) -> ModuleType:
    return importlib.import_module(m) if isinstance(m, str) else m


def add_verbs(parser: argparse.ArgumentParser, modules: Sequence[str | ModuleType],
              dest: str, title: str = "commands"):
    """A subcommand group on `parser`, filled by each module's `register(sub)`, in order (the
    order of `--help`)."""
    sub = parser.add_subparsers(dest=dest, title=title, metavar="COMMAND",
                                parser_class=Parser)
    for m in modules:
        _module(m).register(sub)
    return sub


def group(sub, name: str, help_: str, modules: Sequence[str | ModuleType]) -> Parser:
    """A verb with subcommands of its own (`falsify bench kernels`): a parser that, given no
    subcommand, prints its help and exits 2."""
    p = sub.add_parser(name, help=help_, description=help_)
    add_verbs(p, modules, dest=f"{name}_cmd")

    def no_subcommand(args) -> int:
        p.print_help(sys.stderr)
        return EXIT_USAGE

    p.set_defaults(func=no_subcommand)
    return p


def add_verbs_for(parser: argparse.ArgumentParser, index: dict[str, tuple[str, str]],
                  argv: Sequence[str], dest: str, title: str = "commands"):
    """As `add_verbs`, for one command line: the module of the verb `argv` names registers its
    verbs; every other verb is a bare entry with its one-line help from `index` (verb ->
    (module, help), in `--help` order), so neither `--help` nor a light verb imports the
    modules of the heavy ones (torch: seconds)."""
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = index[chosen][0] if chosen in index else None
    sub = parser.add_subparsers(dest=dest, title=title, metavar="COMMAND",
                                parser_class=Parser)
    for name, (mod, help_) in index.items():
        if mod != module:
            sub.add_parser(name, help=help_)
    if module is not None:
        _module(module).register(sub)
    return sub


def build_parser(prog: str, description: str, modules: Sequence[str | ModuleType],
                 epilog: str | None = None, index: dict[str, tuple[str, str]] | None = None,
                 argv: Sequence[str] | None = None) -> Parser:
    """The program's parser: every verb registered by its module, or, given `index` and the
    command line, only the verb it names (`add_verbs_for`)."""
    p = Parser(prog=prog, description=description, epilog=epilog,
               formatter_class=RawDescriptionHelpFormatter)
    # Both entry points report the package's version, so `pv` and `falsify` never disagree;
    # each names itself first (`pv (falsify) 0.1.0`), as a command's --version does.
    name = "falsify" if prog == "falsify" else f"{prog} (falsify)"
    p.add_argument("--version", action="version", version=f"{name} {falsify.__version__}")
    if index is not None and argv is not None:
        add_verbs_for(p, index, argv, dest="verb")
    else:
        add_verbs(p, modules, dest="verb")
    return p


def dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Parse and run; a usage or I/O error is one line on stderr and exit 2, never a
    traceback."""
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            raise UsageError(f"{args.command_prog}: unrecognized arguments: {' '.join(extra)}")
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `pv status | head`: the reader left, nothing went wrong
        return EXIT_OK
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


# ------------------------------------------------------------ the `pv` verbs' shared options


def add_common(p, many: bool = True, fmt: Sequence[str] = ("text", "json")) -> None:
    """Contract paths (default: the project's contract directories), --format, the mode
    switches."""
    if many:
        p.add_argument("paths", nargs="*", default=[],
                       help="contract files, directories or ids (default: the project's "
                            "contract directories; outside a project, the contract library)")
    p.add_argument("--format", choices=fmt, default=fmt[0])
    g = p.add_argument_group("mode")
    g.add_argument("--strict", action="store_true", help="force native mode")
    g.add_argument("--compat", action="store_true", help="force provable-contracts compat mode")


def contract_mode(args) -> str | None:
    """The loading mode --strict/--compat ask for; None lets each file say."""
    strict, compat = getattr(args, "strict", False), getattr(args, "compat", False)
    if strict and compat:
        raise UsageError("--strict and --compat are exclusive")
    return "native" if strict else ("compat" if compat else None)


def emit(args, payload: dict, text: str) -> None:
    """The verb's result: `payload` as JSON under --format json, else `text`."""
    if getattr(args, "format", "text") == "json":
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text)


def resolve_user_binding(option: str, ref: str, allow_any_import: bool):
    """Import the `module:function` a command-line option names (`--bind ...`): from the
    current project or the installed packages only, unless `--allow-any-import`
    (falsify/harness/trust.py); located first, so a refused module runs nothing."""
    from falsify.harness import trust
    from falsify.harness.project import find_project
    from falsify.harness.validate import resolve_binding

    if not allow_any_import:
        proj = find_project()
        where = trust.import_origin_error(ref.split(":")[0], proj.root if proj else None)
        if where:
            raise UsageError(f"{option}: {where}")
    fn, err = resolve_binding(ref, allow_import=True)
    if err:
        raise UsageError(f"{option}: {err[1]}")
    return fn
