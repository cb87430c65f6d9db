"""What `falsify mutate` prints: per module, how many mutants each outcome had and the
mutation score; then each survivor as a diff of its function, with the obligations whose
checks ran it and missed it. `--format json` prints the same as one JSON document."""

from __future__ import annotations

import difflib
import json
import sys
from collections import Counter

from falsify.harness.equivalents import entry
from falsify.harness.ledger import mutation_score

COLUMNS = ("killed", "survived", "timed out", "equivalent", "not reached", "error", "not run")


def score(counts: Counter) -> float | None:
    """The mutation score of these counts (falsify.harness.ledger.mutation_score)."""
    return mutation_score(counts.elements())


def summary(results: list[dict]) -> dict[str, dict]:
    per: dict[str, Counter] = {}
    for e in results:
        per.setdefault(e["module"], Counter())[e["status"]] += 1
    return {m: {"generated": sum(c.values()), **{k: c[k] for k in COLUMNS},
                "score": score(c)} for m, c in sorted(per.items())}


def diff(e: dict) -> str:
    return "".join(difflib.unified_diff(
        (e["original"] + "\n").splitlines(keepends=True),
        (e["mutated"] + "\n").splitlines(keepends=True),
        fromfile=f"{e['module']}:{e['function']}", tofile=f"mutant {e['id']}"))


def _grouped(obligations: list[str]) -> str:
    """["c1 A", "c1 B", "c2 C"] -> "c1 A, B; c2 C": a contract named once."""
    by: dict[str, list[str]] = {}
    for o in obligations:
        contract, _, oid = o.partition(" ")
        by.setdefault(contract, []).append(oid)
    return "; ".join(f"{c} {', '.join(ids)}" for c, ids in by.items())


def report(results: list[dict], fmt: str) -> None:
    rows = summary(results)
    if fmt == "json":
        print(json.dumps({"modules": rows, "mutants": results}, indent=1, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    # a log (CI) is not an 80-column terminal: module names and nine columns need more
    console = Console(width=None if sys.stdout.isatty() else 140)
    t = Table(title="falsify mutate")
    for col in ("module", "generated", *COLUMNS, "score"):
        t.add_column(col)
    for m, r in rows.items():
        s = "-" if r["score"] is None else f"{r['score']:.0%}"
        t.add_row(m, str(r["generated"]), *(str(r[k]) for k in COLUMNS), s)
    console.print(t)
    for e in results:
        if e["status"] in ("survived", "timed out", "error"):
            console.print(f"[bold red]{e['status']}[/]: {e['id']} ({e['description']}); "
                          f"checks of {_grouped(e['obligations'])} ran it")
            if e.get("lapsed"):
                console.print(e["lapsed"], markup=False, highlight=False)
            if e.get("detail"):
                console.print(e["detail"], markup=False, highlight=False)
            console.print(diff(e), markup=False, highlight=False)
            if e["status"] == "survived":
                console.print("if no input can tell it from the code, declare it equivalent "
                              "(the project's equivalent_mutants file):\n"
                              + entry(e["id"], e["function_sha256"]),
                              markup=False, highlight=False)
    for e in results:
        if e["status"] == "equivalent":
            console.print(f"equivalent: {e['id']} ({e['description']}): {e['reason']}",
                          markup=False, highlight=False)
    left = sum(e["status"] == "not run" for e in results)
    if left:
        console.print(f"budget spent: {left} mutant(s) not run")
    blind = sorted({f"{e['module']}:{e['function']}" for e in results
                    if e["status"] == "not reached"})
    if blind:
        console.print(f"not reached by any check ({len(blind)} function(s)): "
                      + ", ".join(blind), markup=False, highlight=False)
