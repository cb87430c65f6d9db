"""`falsify mutate`: find the bugs the contracts' checks would miss, by making them.

    falsify mutate [CONTRACT...] [--module PATH ...] [--budget MINUTES] [--changed REF]
                   [--shard K/N] [--backend LIST] [--timeout SECONDS] [--format table|json]

Every function of the selected modules (default: every module of the project that a contract's
check reaches, but falsify's own harness, probes and mutants) is mutated one small bug at a
time (falsify.harness.mutation_ops). Each mutant
runs only the checks whose fingerprint reaches its function, stopping at the first failure
(killed); one no check reaches is a blind spot (not reached) and is not run. Naming contracts
limits the checks to theirs (a kernel's own contract, say, rather than every training loop
that also calls the kernel). The checks run
once without any mutant first: a kill only counts where they pass on the real code. The user's
files are never edited (falsify.harness.mutation_apply). Results go to the ledger's
`mutations` section, by mutant id.

Exit codes: 0 no mutant survived, 1 a mutant survived, timed out or could not be judged, 2
usage error.
"""

from __future__ import annotations

import ast
import hashlib
import subprocess
import time
from pathlib import Path

from falsify.errors import UsageError

STATUSES = ("killed", "survived", "timed out", "equivalent", "not reached", "error", "not run")


# falsify's own judging code: the harness that runs checks, the probes that drive the loops
# for them, the planted mutants, the proof targets, the benches and the command line. A check
# reaches these modules on its way to the code it judges, so when falsify checks itself they
# are "reached" by every check; a bug planted in the judge is not a blind spot of a contract.
# Mutated only when named with --module. (In a user's project falsify is installed, not local,
# and none of it is a target anyway.)
JUDGE = ("falsify.harness", "falsify.probes", "falsify.mutants", "falsify.proofs",
         "falsify.bench", "falsify.cli")


def judged(module: str) -> bool:
    return not any(module == j or module.startswith(j + ".") for j in JUDGE)


def _target_modules(paths: list[str], reach, proj) -> dict[str, Path]:
    """Module name -> file: `--module` files, or every reached module under the project that
    is not falsify's own judging code (JUDGE)."""
    from falsify.harness.fingerprint import _local

    root = proj.root.resolve()
    if not paths:
        return {m: f for m, f in sorted(reach.files.items())
                if _local(f, (root,)) and judged(m)}
    out = {}
    for p in paths:
        f = Path(p).resolve()
        if f.suffix != ".py" or not f.is_file():
            raise UsageError(f"--module {p}: not a Python file")
        if not f.is_relative_to(root):
            raise UsageError(f"--module {p}: outside the project ({root})")
        name = reach.module_of(f) or ".".join(f.relative_to(root).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _changed_functions(path: Path, ref: str) -> set[str] | None:
    """Qualified names of the functions in `path` whose AST differs from (or is absent in)
    the file at git `ref`; None when the file did not exist there (everything is new)."""
    from falsify.harness.mutation_ops import functions

    proc = subprocess.run(["git", "show", f"{ref}:./{path.name}"], cwd=path.parent,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        check = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
                               cwd=path.parent, capture_output=True, text=True)
        if check.returncode != 0:
            raise UsageError(f"--changed {ref}: not a git commit here ({check.stderr.strip()})")
        return None
    old = {q: ast.dump(n) for q, n in functions(ast.parse(proc.stdout))}
    new = {q: ast.dump(n) for q, n in functions(ast.parse(path.read_text(encoding="utf-8")))}
    return {q for q, d in new.items() if old.get(q) != d}


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: expected K/N, such as 1/4") from None
    if not 1 <= k <= n:
        raise UsageError(f"--shard {text!r}: K must be between 1 and N")
    return k, n


def _mutants(targets: dict[str, Path], changed: str | None, shard) -> list:
    from falsify.harness.mutation_ops import mutants_of_source

    out = []
    for name, path in targets.items():
        ms = list(mutants_of_source(name, path.read_text(encoding="utf-8")))
        if changed is not None:
            keep = _changed_functions(path, changed)
            ms = [m for m in ms if keep is None or m.function in keep]
        out += ms
    out.sort(key=lambda m: (m.module, m.function, m.operator, m.index))
    if shard:  # round-robin over the sorted ids: the same split on every machine
        k, n = shard
        out = [m for i, m in enumerate(out) if i % n == k - 1]
    return out


def _record(m, status: str, checks, obligations, **extra) -> dict:
    return {"id": m.id, "module": m.module, "function": m.function, "operator": m.operator,
            "description": m.description, "status": status,
            "function_sha256": hashlib.sha256(m.original.encode()).hexdigest(),
            "checks": sorted(" ".join(k) for k in checks), "obligations": sorted(obligations),
            "original": m.original, "mutated": m.source,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def ledger_baseline(contracts, data: dict, profile: str, backends: list[str]):
    """The unmutated run of a set of checks, as the ledger already knows it: a function of
    `keep` giving a passed Outcome with the recorded seconds when every run of every check in
    it (each dtype) has a current passing result there (this code, this contract text, a
    profile as strong: `falsify run --changed`'s own test), else None. After `falsify run`
    (CI runs it just before) the unmutated runs need not be repeated; each took most of a
    small budget (softmax's kernel: ~130 s of 180)."""
    from falsify.cli.run import reusable
    from falsify.harness.ledger import run_key
    from falsify.harness.mutation_run import Outcome
    from falsify.harness.plan import runs

    passed = set(reusable(contracts, data, backends, "checks", profile))
    by_id = {c.id: c for c in contracts}

    def baseline(keep):
        seconds = {}
        for cid, check, backend in keep:
            c = by_id[cid]
            keys = [run_key(dict(contract=cid, check=check, backend=r.backend,
                                 variant=r.variant))
                    for r in runs(c, c.check(check)) if r.backend == backend]
            if any("run:" + k not in passed for k in keys):
                return None
            seconds[(cid, check, backend)] = sum(
                float(data["runs"][k].get("duration_s") or 0.0) for k in keys)
        return Outcome("passed", sum(seconds.values()), durations=seconds, source="ledger")

    return baseline


def _run_all(mutants, targets: dict[str, Path], reach, manifest,
             modules: dict[str, Path], proj, args, declared_equivalent: dict,
             known=lambda keep: None) -> list[dict]:
    from falsify.harness.mutation_run import run_checks

    deadline = time.monotonic() + args.budget * 60 if args.budget is not None else None
    baselines: dict[frozenset, object] = {}
    killers: dict[tuple[str, str], list] = {}  # function -> checks that killed its mutants
    out = []
    lapsed: dict[str, str] = {}
    for m in mutants:
        keep = reach.checks(m.module, m.top_level)
        obligations = {f"{k[0]} {reach.obligations[k]}" for k in keep}
        left = None if deadline is None else deadline - time.monotonic()
        declared = declared_equivalent.get(m.id)
        sha = hashlib.sha256(m.original.encode()).hexdigest()
        if declared is not None and declared.function_sha256 == sha:
            # judged by a person for this very function text: not run, not scored
            out.append(_record(m, "equivalent", keep, obligations, reason=declared.reason))
            continue
        if declared is not None:  # declared for another version: judged again, and said
            lapsed[m.id] = (f"declared equivalent at {proj.equivalents_path.name}:"
                            f"{declared.line} for another version of the function")
        if not keep:
            out.append(_record(m, "not reached", keep, obligations))
            continue
        if left is not None and left <= 0:
            out.append(_record(m, "not run", keep, obligations))
            continue
        # only the modules of the contracts concerned: collecting every generated module
        # imports and parses every contract, seconds per run that no selected check needs
        files = [modules[c] for c in sorted({k[0] for k in keep})]
        base = baselines.get(frozenset(keep))
        if base is None:
            base = known(keep)
        if base is None:  # the budget bounds the unmutated run too: it may be the long one
            base = run_checks(manifest, files, keep, None, left, proj.root)
        baselines[frozenset(keep)] = base
        if base.status == "timed out":
            out.append(_record(m, "not run", keep, obligations, detail="the budget ran out "
                               "during the unmutated run of its checks"))
            continue
        if base.status != "passed":
            out.append(_record(m, "error", keep, obligations, detail="the checks fail without "
                               f"any mutant ({base.status}): {base.failed_check or base.detail}"))
            continue
        timeout = args.timeout if args.timeout is not None else base.seconds * 3 + 30
        fn = (m.module, m.top_level)
        order = kill_order(keep, killers.get(fn, []), reach.direct.get(fn, set()),
                           base.durations)
        r = run_checks(manifest, files, keep, _mutation(m, targets[m.module]), timeout,
                       proj.root, order)
        if r.status == "failed" and r.failed_check:
            killer = tuple(r.failed_check.split(" (")[0].split(" "))
            if killer in keep and killer not in killers.setdefault(fn, []):
                killers[fn].insert(0, killer)
        status = {"failed": "killed", "passed": "survived"}.get(r.status, r.status)
        out.append(_record(m, status, keep, obligations, seconds=round(r.seconds, 2),
                           killed_by=r.failed_check, detail=r.detail, baseline=base.source))
    for e in out:
        if e["id"] in lapsed:
            e["lapsed"] = lapsed[e["id"]]
    return out


def kill_order(keep, killers: list, direct: set, seconds: dict) -> list:
    """The order a mutant's checks run in, to reach the first failure soonest (-x stops there):
    the checks that killed earlier mutants of the same function, newest first; then those that
    call the function by name; then the rest; each group fastest first by the unmutated run.
    The checks that reach a function only through another contract's code (an attention check
    for softmax's kernel) are many and rarely the ones that fail, so file order, which sorts
    them by contract name, made every softmax mutant wait ~80 s for its own contract's checks."""
    first = [k for k in killers if k in keep]
    rest = sorted(set(keep) - set(first),
                  key=lambda k: (k not in direct, seconds.get(k, float("inf")), k))
    return first + rest


def _mutation(m, path: Path) -> dict:
    """What the subprocess's import system serves: the module's current text, with the
    mutant's function in place of the original."""
    from falsify.harness.mutation_ops import splice

    source = splice(path.read_text(encoding="utf-8"), m)
    return {"module": m.module, "path": str(path), "source": source}


def cmd_mutate(args) -> int:
    from falsify.cli.mutate_report import report
    from falsify.cli.session import ensure_generated, run_manifest, select_contracts
    from falsify.harness import equivalents, ledger
    from falsify.harness.mutation_select import SYMBOLIC, reach
    from falsify.harness.project import require_project

    proj = require_project("falsify mutate")
    if args.budget is not None and args.budget <= 0:
        raise UsageError(f"--budget {args.budget}: minutes must be positive")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout}: seconds must be positive")
    shard = _shard(args.shard)
    backends = ([b.strip() for b in args.backend.split(",")] if args.backend
                else list(proj.backends) + list(SYMBOLIC))
    contracts = select_contracts(args.contracts, proj)
    modules = dict(zip((c.id for c in contracts), ensure_generated(contracts, proj)))
    r = reach(contracts, tuple(backends))
    targets = _target_modules(args.module, r, proj)
    mutants = _mutants(targets, args.changed, shard)
    manifest = run_manifest(proj, contracts, "checks", proj.profile, backends, {},
                            proj.ledger_path)
    declared = equivalents.load(proj.equivalents_path,
                                required=proj.equivalent_mutants is not None)
    known = ledger_baseline(contracts, ledger.load(proj.ledger_path), proj.profile, backends)
    results = _run_all(mutants, targets, r, manifest, modules, proj, args, declared, known)
    ledger.merge_mutations({e["id"]: e for e in results}, proj.ledger_path)
    if not mutants and args.format == "table":  # say why, rather than print an empty table
        why = (f"no function of them changed since {args.changed}" if args.changed
               else "none has a function to mutate")
        print(f"falsify mutate: nothing to mutate: {len(targets)} module(s) judged, {why}")
        return 0
    report(results, args.format)
    bad = {"survived", "timed out", "error"}
    return 1 if any(e["status"] in bad for e in results) else 0


def register(sub) -> None:
    p = sub.add_parser("mutate", help="make bugs in the code; one the checks miss fails")
    p.add_argument("contracts", nargs="*",
                   help="contract ids or files whose checks judge the mutants (default: the "
                        "project's contracts)")
    p.add_argument("--module", action="append", default=[], metavar="PATH",
                   help="mutate the functions of this file (repeatable; default: every module "
                        "of the project a contract's check reaches, but falsify's own judging "
                        "code: harness, probes, mutants, proofs, benches, command line)")
    p.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                   help="start no mutant after this many minutes; the rest are 'not run'")
    p.add_argument("--changed", default=None, metavar="REF",
                   help="only functions whose code differs from git REF")
    p.add_argument("--shard", default=None, metavar="K/N",
                   help="mutants K, K+N, K+2N, ... of the sorted list (one of N CI jobs)")
    p.add_argument("--backend", default=None,
                   help="comma-separated backends whose checks run (default: the project's "
                        "`backends` and the proofs)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="per mutant (default: 3 x the checks' unmutated run + 30 s)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_mutate)
