"""`pv generate`, `pv coverage`, `pv audit`: the verbs that connect contracts to results."""

from __future__ import annotations

from pathlib import Path

from falsify.cli.common import add_common, emit
from falsify.errors import UsageError


def _load(paths, mode=None):
    from falsify.harness.project import default_paths
    from falsify.harness.validate import validate

    paths = default_paths(paths)
    rep = validate(paths, mode=mode, import_bindings=False)
    if not rep.contracts:
        # nothing loaded: an unreadable path, a bad file or an empty directory is a usage
        # error (exit 2) with the reason, never an empty, successful report
        why = "; ".join(str(f) for f in rep.findings) or "no contracts found"
        raise UsageError(f"{why} (under {' '.join(map(str, paths))})")
    return rep


def _ledger_path(args) -> Path:
    from falsify.harness.project import find_project

    if args.ledger:
        return Path(args.ledger)
    proj = find_project()
    if proj is None:
        raise UsageError("no ledger: pass --ledger, or run inside a project (falsify.toml or "
                          "[tool.falsify] in pyproject.toml; `falsify init` writes one)")
    return proj.ledger_path


def cmd_generate(args) -> int:
    from falsify.harness import generate
    from falsify.harness.project import find_project, require_project

    # test modules go to --out or the project's `generated`; docs pages to the project's `docs`
    needs_project = not args.out or not (args.no_docs or args.check)
    proj = require_project("pv generate") if needs_project else find_project()
    rep = _load(args.paths)
    if rep.errors:
        for f in rep.errors:
            print(f)
        print(f"{len(rep.errors)} error(s): fix the contracts before generating")
        return 1
    out_dir = Path(args.out) if args.out else proj.generated_dir
    expected = generate.plan_tests(rep.contracts, out_dir)
    # prune modules of deleted contracts only when the project's whole set was generated
    whole = not args.paths
    if args.check:
        stale = generate.stale_files(expected, out_dir, prune=whole)
        for p, why in stale:
            print(f"{p}: {why}")
        print(f"{len(stale)} generated file(s) out of date" if stale
              else f"generated files are up to date ({len(expected)} file(s))")
        return 1 if stale else 0
    changed = generate.write_tests(expected, out_dir, prune=whole)
    for p in changed:
        print(f"wrote {p}")
    pages = []
    if not args.no_docs:
        pages = _write_docs(rep.contracts, proj, args.results)
    print(f"{len(changed)} test module(s) changed, {len(expected)} in all; "
          f"{len(pages)} docs page(s) written")
    return 0


def _write_docs(contracts, proj, results=None):
    """The docs pages from the project's committed evidence (the default where it declares
    some: what is published is what anyone can check out), or from its local ledger, which
    the pages then label as such."""
    from falsify.harness import coverage, docs, evidence, ledger

    results = results or ("evidence" if proj.evidence else "ledger")
    if results == "evidence":
        data, sources = evidence.load_evidence(proj)  # a bad evidence ledger is an error
    else:
        try:
            data, sources = evidence.load_local(proj)
        except ledger.LedgerError as e:
            print(f"warning: {e}; docs show every obligation as not-run")
            data, sources = None, []
    cov = coverage.compute(contracts, data) if data is not None else None
    return docs.write_site(contracts, cov, pages_dir=proj.docs_dir, sources=sources,
                           conformance=_conformance(proj))


def _conformance(proj):
    """(path as the project names it, data) of the project's committed conformance ledger;
    None when it names none. A named ledger that is missing or unreadable is an error."""
    from falsify.harness import conformance

    if proj.conformance is None:
        return None
    rel = proj.conformance.relative_to(proj.root).as_posix() if proj.conformance.is_relative_to(
        proj.root) else str(proj.conformance)
    if not proj.conformance.is_file():
        raise UsageError(f"{proj.source}: conformance = {rel!r}: no such file (write it with "
                         f"`falsify conformance --ledger {rel}`, or remove the key)")
    try:
        return rel, conformance.load(proj.conformance)
    except conformance.ConformanceLedgerError as e:
        raise UsageError(str(e)) from None


def cmd_coverage(args) -> int:
    from falsify.harness import coverage, ledger

    rep = _load(args.paths)
    contracts = [c for c in rep.contracts if c.mode == "native"]
    if args.status:
        contracts = [c for c in contracts if c.status == args.status]
    if not contracts:
        raise UsageError("no native contracts selected")
    try:
        data = ledger.load(_ledger_path(args))
    except ledger.LedgerError as e:
        raise UsageError(str(e)) from None
    cov = coverage.compute(contracts, data)
    covered, total = cov.overall()
    pct = 100.0 * covered / total if total else 100.0
    emit(args, cov.as_json(), cov.as_text())
    if args.min is not None and pct + 1e-9 < args.min:
        print(f"coverage {pct:.1f}% is below --min {args.min:g}%")
        return 1
    return 0


def cmd_audit(args) -> int:
    from falsify.harness import audit, ledger

    rep = _load(args.paths)
    if args.checks_only:
        # what the contracts declare, no results: exit 1 on an equation × backend without a
        # check of a kind it needs (unbound public functions are warnings)
        results = [audit.audit_checks(c) for c in rep.contracts]
    else:
        try:
            data = ledger.load(_ledger_path(args))
        except ledger.LedgerError as e:
            raise UsageError(str(e)) from None
        results = [audit.audit(c, data) for c in rep.contracts]
    gaps = sum(len(r.gaps) for r in results)
    warnings = sum(len(r.warnings) for r in results)
    text = "\n\n".join(r.as_text() for r in results)
    emit(args, {"contracts": [r.as_dict() for r in results], "gaps": gaps,
                "warnings": warnings},
         f"{text}\n\n{gaps} gap(s), {warnings} warning(s) in {len(results)} contract(s)")
    return 1 if gaps else 0


def register(sub) -> None:
    g = sub.add_parser("generate", help="write the project's generated tests and docs pages")
    add_common(g)
    g.add_argument("--check", action="store_true",
                   help="exit 1 if regenerating would change any file")
    g.add_argument("--out", default=None, help="output directory for test modules")
    g.add_argument("--no-docs", action="store_true", help="only the test modules")
    g.add_argument("--results", choices=("evidence", "ledger"), default=None,
                   help="what the docs pages show: the committed `evidence` ledgers (default "
                        "when the project declares any; what the published site uses) or the "
                        "local `ledger`, labelled as local")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("coverage", help="obligation coverage from the results ledger")
    add_common(c)
    c.add_argument("--min", type=float, default=None, help="exit 1 below this percentage")
    c.add_argument("--ledger", default=None)
    c.add_argument("--status", choices=["complete", "draft"], default=None,
                   help="only contracts with this metadata.status")
    c.set_defaults(func=cmd_coverage)

    a = sub.add_parser("audit", help="reference → equation → obligation → check → result chain")
    add_common(a)
    a.add_argument("--ledger", default=None)
    a.add_argument("--checks-only", action="store_true",
                   help="no ledger: only equation × backend pairs lacking a check of a kind "
                        "they need (e.g. a backward with no gradient check); exit 1 on any")
    a.set_defaults(func=cmd_audit)
