"""`pv validate`: the schema and the semantic rules (V001..), file:line messages."""

from __future__ import annotations

from falsify.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    add_common,
    contract_mode,
    emit,
)


def cmd_validate(args) -> int:
    from falsify.harness.model import resolve_arg
    from falsify.harness.project import default_paths
    from falsify.harness.validate import validate

    paths = default_paths(args.paths)
    for p in map(resolve_arg, paths):  # a path that is not there is an I/O error (2)
        if not p.exists():
            raise UsageError(f"no such file or directory: {p}")
    rep = validate(paths, mode=contract_mode(args), allow_import=args.allow_import)
    if not rep.contracts and not rep.findings:
        raise UsageError(f"no contracts found under {' '.join(map(str, paths))}")
    summary = f"{len(rep.errors)} error(s), {len(rep.warnings)} warning(s)"
    lines = [str(f) for f in rep.findings]
    lines.append(f"{summary} in {len(rep.contracts)} contract(s)")
    emit(args, {"contracts": [c.id for c in rep.contracts],
                "findings": [f.as_dict() for f in rep.findings],
                "errors": len(rep.errors), "warnings": len(rep.warnings)}, "\n".join(lines))
    return EXIT_FAILED if rep.errors else EXIT_OK


def register(sub) -> None:
    v = sub.add_parser("validate", help="schema + semantic rules (V001..)")
    add_common(v)
    v.add_argument("--allow-import", action="store_true",
                   help="let bindings import modules outside the project's packages")
    v.set_defaults(func=cmd_validate)
