"""`pv` verbs that read contracts: status, list, graph, equations, diff.

Exit codes as in falsify/cli/pv.py: 0 fine, 1 violations (an unreadable contract, a dependency
cycle or a missing dependency, a version that does not carry the bump its changes need), 2 usage
or I/O error (a path that does not exist or cannot be read).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from falsify.cli.common import EXIT_FAILED as EXIT_VIOLATIONS
from falsify.cli.common import EXIT_OK, add_common, contract_mode, emit
from falsify.errors import UsageError
from falsify.harness.audit import INVARIANCE_KINDS, MATRIX_KINDS, declared


def register(sub) -> None:
    """Add this module's subcommands to the `pv` parser."""
    p = sub.add_parser("status", help="per contract: equations, obligations, checks, "
                                      "mutants, bindings")
    add_common(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("list", help="the contract library shipped with falsify")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("graph", help="dependency DAG (metadata.depends_on), dependencies first")
    add_common(p, fmt=("text", "dot", "mermaid", "json"))
    p.set_defaults(func=cmd_graph)

    p = sub.add_parser("equations", help="equations as text or LaTeX")
    add_common(p, fmt=("text", "latex", "json"))
    p.set_defaults(func=cmd_equations)

    p = sub.add_parser("diff", help="what changed between two contract versions; the bump "
                                    "it needs",
                       description="what changed between two versions of a contract, and "
                                   "whether the version bump is big enough")
    p.add_argument("old", help="the previous version of the contract")
    p.add_argument("new", help="the new version of the contract")
    add_common(p, many=False)
    p.set_defaults(func=cmd_diff)


# ------------------------------------------------------------------------------ loading


def _check_paths(paths) -> None:
    """A path that is missing or unreadable is an I/O error (exit 2), not a bad contract."""
    from falsify.harness.model import resolve_arg

    for p in map(resolve_arg, paths):
        if not p.exists():
            raise UsageError(f"no such file or directory: {p}")
        if not (p.is_file() or p.is_dir()):
            raise UsageError(f"not a file or directory: {p}")
        if not os.access(p, os.R_OK):
            raise UsageError(f"permission denied: {p}")


def _load(args, paths, whole_space=False):
    """Contracts under `paths` (default: see project.default_paths), and the findings of
    files that could not be read at all."""
    from falsify.harness.project import default_paths
    from falsify.harness.validate import load_all

    paths = default_paths(paths, whole_space)
    _check_paths(paths)
    rep = load_all(paths, mode=contract_mode(args))
    if not rep.contracts and not rep.findings:
        raise UsageError(f"no contracts found under {' '.join(map(str, paths))}")
    unreadable = [f for f in rep.findings if f.rule == "V001"]
    for f in unreadable:
        print(f"error: {f}", file=sys.stderr)
    return rep.contracts, unreadable


def _table(title: str | None, columns: list[tuple[str, str]], rows: list[list]) -> str:
    """A plain-text table: a header, a rule, left- or right-justified columns."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(name)] + [len(r[i]) for r in cells]) for i, (name, _) in
              enumerate(columns)]

    def line(values):
        return "  ".join(v.rjust(w) if just == "right" else v.ljust(w)
                         for v, w, (_, just) in zip(values, widths, columns)).rstrip()

    out = [title] if title else []
    out += [line([name for name, _ in columns]), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


# ------------------------------------------------------------------------------ status


def _origin(c, space) -> str:
    """library | project | overrides library, or `file` for a file outside the id space."""
    e = space.get(c.id)
    return e.origin if e is not None and e.path == c.path.resolve() else "file"


def _declared_text(d: dict | None) -> str:
    if d is None:
        return "—"
    if "inapplicable" in d:
        return "n/a"
    if not d["bounded"]:
        return "bitwise"
    if not d["bitwise"]:
        return "bounded"
    return f"bitwise: {','.join(d['bitwise'])}; bounded: {','.join(d['bounded'])}"


def _other_kinds(kinds: dict) -> str:
    """The matrix kinds beyond the invariance ones: those checked, `-kind` for inapplicable."""
    out = []
    for kind, d in kinds.items():
        if kind in INVARIANCE_KINDS or d is None:
            continue
        out.append(f"-{kind}" if "inapplicable" in d else kind)
    return ",".join(out) or "—"


def _status_row(c, space) -> dict:
    executable = [t for t in c.checks if t.kind]
    return {
        "id": c.id, "path": str(c.path), "version": c.version, "mode": c.mode,
        "origin": _origin(c, space),
        "equations": len(c.equations), "obligations": len(c.obligations),
        "checks": {"total": len(c.checks), "executable": len(executable)},
        "mutants": len(c.mutants), "symbolic_checks": len(c.symbolic_checks),
        "kani_harnesses": sum(1 for h in c.kani_harnesses if h),
        "determinism": declared(c, "determinism"),
        "batch_invariance": declared(c, "batch_invariance"),
        "kinds": {kind: declared(c, kind) for kind in MATRIX_KINDS},
        "bindings": {name: dict(eq.bindings) for name, eq in c.equations.items()},
    }


def cmd_status(args) -> int:
    from falsify.harness.project import find_project, id_space

    contracts, unreadable = _load(args, args.paths, whole_space=True)
    space = id_space(find_project())
    rows = [_status_row(c, space) for c in contracts]
    cols = [("contract", "left"), ("origin", "left"), ("version", "left"), ("mode", "left"),
            ("equations", "right"), ("obligations", "right"), ("checks", "right"),
            ("executable", "right"), ("mutants", "right"), ("symbolic", "right"),
            ("run-to-run", "left"), ("batch-invariant", "left"), ("other kinds", "left")]
    text = [_table(f"{len(rows)} contract(s)", cols, [
        [r["id"], r["origin"], r["version"] or "?", r["mode"], r["equations"], r["obligations"],
         r["checks"]["total"], r["checks"]["executable"], r["mutants"], r["symbolic_checks"],
         _declared_text(r["determinism"]), _declared_text(r["batch_invariance"]),
         _other_kinds(r["kinds"])]
        for r in rows])]
    brows = [[r["id"], eq, be, ref] for r in rows for eq, bs in r["bindings"].items()
             for be, ref in bs.items()]
    if brows:
        text.append(_table("bindings", [("contract", "left"), ("equation", "left"),
                                        ("backend", "left"), ("binding", "left")], brows))
    unbound = [r["id"] for r in rows if not any(r["bindings"].values())]
    if unbound:
        text.append("no bindings: " + ", ".join(unbound))
    emit(args, {"contracts": rows, "errors": [f.as_dict() for f in unreadable]},
               "\n\n".join(text))
    return EXIT_VIOLATIONS if unreadable else EXIT_OK


# ------------------------------------------------------------------------------ graph


def cmd_list(args) -> int:
    """What the shipped library offers (one row per contract)."""
    from falsify.harness.project import library_dir, library_files
    from falsify.harness.validate import load_all

    rep = load_all(list(library_files().values()))
    rows = [{"id": c.id, "version": c.version, "status": c.status,
             "description": " ".join(c.description.split()), "path": str(c.path)}
            for c in sorted(rep.contracts, key=lambda c: c.id)]

    def short(d: str, n: int = 72) -> str:
        return d if len(d) <= n else d[:n - 1] + "…"

    text = _table(f"{len(rows)} contract(s) in the falsify library ({library_dir()})",
                  [("contract", "left"), ("version", "left"), ("status", "left"),
                   ("description", "left")],
                  [[r["id"], r["version"] or "?", r["status"], short(r["description"])]
                   for r in rows])
    unreadable = [f for f in rep.findings if f.rule == "V001"]
    emit(args, {"library": str(library_dir()), "contracts": rows,
                "errors": [f.as_dict() for f in unreadable]}, text)
    return EXIT_VIOLATIONS if unreadable else EXIT_OK


def cmd_graph(args) -> int:
    from falsify.harness import graph
    from falsify.harness.validate import Report, known_contracts

    contracts, unreadable = _load(args, args.paths, whole_space=True)
    # Dependencies next to a named contract count as present: `pv graph one.yaml` should not
    # call its siblings missing. Only what the named contracts reach is drawn.
    known = known_contracts(Report(contracts=list(contracts)))
    nodes, todo = {}, [c.id for c in contracts]
    while todo:
        n = todo.pop()
        if n in nodes or n not in known:
            continue
        nodes[n] = known[n]
        todo += known[n].depends_on
    g = graph.build(nodes)
    problems = []
    for n, i, d in g.missing:
        c = nodes[n]
        problems.append(f"{c.path}:{c.line('metadata', 'depends_on', i)}: {n} depends on "
                        f"{d!r}, which is not a contract here")
    for cyc in g.cycles:
        problems.append("dependency cycle: " + " -> ".join(cyc))
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if args.format == "json":
        payload = graph.as_dict(g)
        payload["errors"] = problems + [str(f) for f in unreadable]
        emit(args, payload, "")
    else:
        render = {"text": graph.text, "dot": graph.dot, "mermaid": graph.mermaid}[args.format]
        emit(args, {}, render(g).rstrip("\n"))
    return EXIT_VIOLATIONS if (problems or unreadable) else EXIT_OK


# ------------------------------------------------------------------------------ equations


def _eq_dict(eq) -> dict:
    from falsify.harness.latex import equation_latex, to_latex

    return {
        "name": eq.name, "formula": eq.formula, "latex": equation_latex(eq),
        "latex_source": "latex field" if eq.latex else "derived from formula",
        "domain": eq.domain, "codomain": eq.codomain, "invariants": eq.invariants,
        "domain_latex": to_latex(eq.domain) if eq.domain else None,
        "codomain_latex": to_latex(eq.codomain) if eq.codomain else None,
        "invariants_latex": [to_latex(i) for i in eq.invariants],
        "bindings": dict(eq.bindings),
    }


def _equations_text(c, eqs: list[dict]) -> str:
    lines = [f"{c.id} ({c.version or '?'}): {len(eqs)} equation(s)"]
    for e in eqs:
        lines += ["", e["name"]]
        formula = e["formula"].strip().splitlines() or [""]
        lines.append(f"  formula:    {formula[0]}")
        lines += [f"              {ln}" for ln in formula[1:]]
        for k in ("domain", "codomain"):
            if e[k]:
                lines.append(f"  {k + ':':<11} {' '.join(e[k].split())}")
        if e["invariants"]:
            lines.append("  invariants:")
            lines += [f"    - {' '.join(i.split())}" for i in e["invariants"]]
        for be, ref in e["bindings"].items():
            lines.append(f"  {be + ':':<11} {ref}")
    return "\n".join(lines)


def _equations_latex(c, eqs: list[dict]) -> str:
    from falsify.harness.latex import text_escape

    lines = [f"% Equations of {c.id} ({c.version or '?'}), written by `pv equations`",
             f"\\section*{{{text_escape(c.id)}}}"]
    for e in eqs:
        lines += ["", f"\\subsection*{{{text_escape(e['name'])}}}",
                  f"\\label{{eq:{c.id}:{e['name']}}}", "\\[", e["latex"], "\\]"]
        for k in ("domain", "codomain"):
            if e[f"{k}_latex"]:
                lines.append(f"\\noindent\\textbf{{{k.capitalize()}:}} \\( {e[k + '_latex']} \\)"
                             "\\par")
        if e["invariants_latex"]:
            lines.append("\\begin{itemize}")
            lines += [f"  \\item \\( {i} \\)" for i in e["invariants_latex"]]
            lines.append("\\end{itemize}")
    return "\n".join(lines)


def cmd_equations(args) -> int:
    contracts, unreadable = _load(args, args.paths)
    per = [(c, [_eq_dict(eq) for eq in c.equations.values()]) for c in contracts]
    if args.format == "json":
        payload = {"contracts": [{"id": c.id, "version": c.version, "equations": eqs}
                                 for c, eqs in per],
                   "errors": [f.as_dict() for f in unreadable]}
        emit(args, payload, "")
    else:
        render = _equations_latex if args.format == "latex" else _equations_text
        emit(args, {}, "\n\n".join(render(c, eqs) for c, eqs in per))
    return EXIT_VIOLATIONS if unreadable else EXIT_OK


# ------------------------------------------------------------------------------ diff


def _one(args, path):
    _check_paths([path])
    if Path(path).is_dir():
        raise UsageError(f"{path} is a directory; `pv diff` compares two contract files")
    contracts, unreadable = _load(args, [path])
    return (contracts[0] if contracts else None), unreadable


def cmd_diff(args) -> int:
    from falsify.harness.diff import diff, render_text

    old, bad_old = _one(args, args.old)
    new, bad_new = _one(args, args.new)
    if old is None or new is None:
        if args.format == "json":
            emit(args, {"errors": [f.as_dict() for f in bad_old + bad_new]}, "")
        return EXIT_VIOLATIONS
    res = diff(old, new)
    text = render_text(res)
    if res.problems:
        text += "\n" + "\n".join(f"error: {p}" for p in res.problems)
    emit(args, res.as_dict(), text)
    return EXIT_OK if res.ok else EXIT_VIOLATIONS
