"""`pv`: validate, inspect and generate from contracts.

Exit codes (every verb): 0 fine, 1 violations found, 2 usage or I/O error.
Every verb loads contracts through `harness.validate.load_all`, the one loading path.
"""

from __future__ import annotations

import argparse
import json
import sys

from falsify.cli.common import Parser, UsageError

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2


def _emit(args, payload: dict, text: str):
    if getattr(args, "format", "text") == "json":
        print(json.dumps(payload, indent=2, default=str))
    else:
        print(text)


def _mode(args) -> str | None:
    if getattr(args, "strict", False) and getattr(args, "compat", False):
        raise UsageError("--strict and --compat are exclusive")
    return "native" if getattr(args, "strict", False) else (
        "compat" if getattr(args, "compat", False) else None)


def cmd_validate(args) -> int:
    from falsify.harness.model import resolve_arg
    from falsify.harness.project import default_paths
    from falsify.harness.validate import validate

    paths = default_paths(args.paths)
    for p in map(resolve_arg, paths):  # a path that is not there is an I/O error (2)
        if not p.exists():
            raise UsageError(f"no such file or directory: {p}")
    rep = validate(paths, mode=_mode(args), allow_import=args.allow_import)
    if not rep.contracts and not rep.findings:
        raise UsageError(f"no contracts found under {' '.join(map(str, paths))}")
    summary = f"{len(rep.errors)} error(s), {len(rep.warnings)} warning(s)"
    lines = [str(f) for f in rep.findings]
    lines.append(f"{summary} in {len(rep.contracts)} contract(s)")
    _emit(args, {"contracts": [c.id for c in rep.contracts],
                 "findings": [f.as_dict() for f in rep.findings],
                 "errors": len(rep.errors), "warnings": len(rep.warnings)}, "\n".join(lines))
    return EXIT_VIOLATIONS if rep.errors else EXIT_OK


def _add_common(p, many=True, fmt=("text", "json")):
    if many:
        p.add_argument("paths", nargs="*", default=[],
                       help="contract files, directories or ids (default: the project's "
                            "contract directories; outside a project, the contract library)")
    p.add_argument("--format", choices=fmt, default=fmt[0])
    g = p.add_argument_group("mode")
    g.add_argument("--strict", action="store_true", help="force native mode")
    g.add_argument("--compat", action="store_true", help="force provable-contracts compat mode")


VERBS = {}


def verb(name, help_):
    def deco(fn):
        VERBS[name] = (fn, help_)
        return fn
    return deco


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="pv", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", parser_class=Parser)
    v = sub.add_parser("validate", help="schema + semantic rules (V001..)")
    _add_common(v)
    v.add_argument("--allow-import", action="store_true",
                   help="let bindings import modules outside the project's packages")
    v.set_defaults(func=cmd_validate)
    # Further verbs live in two modules so this file stays the entry point only:
    # pv_inspect (status, graph, equations, diff) reads contracts; pv_harness (generate,
    # coverage, audit) also reads the results ledger.
    from falsify.cli import pv_harness, pv_inspect

    pv_inspect.register(sub, _add_common, _emit, UsageError)
    pv_harness.register(sub, _add_common, _emit, UsageError)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return EXIT_USAGE
        return args.func(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
