"""Obligation coverage, computed from the results ledger only — never from the YAML alone.

An obligation is `covered` when every check bound to it ran on every (backend, variant) the
plan requires and passed against the current contract text, and every mutant declared for it
was killed. Otherwise, by precedence: `failing` (a required run failed, errored or is unproven),
`mutant-survived`, `stale` (a result is from an older contract text, or from an implementation
whose source has changed since: falsify.harness.fingerprint), `skipped`, `not-run`
(a required run or mutant has no result, or the obligation has no executable check).

An obligation whose every check is a `device` check (GPU against CPU) cannot run without a GPU:
while every one of its runs and mutants is recorded as skipped for that reason, it is
`needs-gpu`, listed apart and left out of the percentage (neither covered nor counted), never
passed. Once a run on a GPU records results, the usual rules apply.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from falsify.harness.fingerprint import impl_hash
from falsify.harness.ledger import mutant_key, run_key
from falsify.harness.model import Check, Contract, Mutant
from falsify.harness.plan import runs

PRECEDENCE = ("failing", "mutant-survived", "stale", "skipped", "not-run", "covered")
NEEDS_GPU = "needs-gpu"
# the prefix of a device check's skip message (falsify/harness/kinds/device.py writes it)
NO_GPU = "needs a GPU"


def skipped_for_gpu(e: dict | None) -> bool:
    return bool(e) and e.get("outcome") == "skipped" and NO_GPU in (e.get("message") or "")


@dataclass
class ObligationStatus:
    contract: str
    obligation: str
    status: str
    runs: list[dict] = field(default_factory=list)
    mutants: list[dict] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def current(c: Contract, e: dict, check: Check | None = None,
            mutant: Mutant | None = None) -> bool:
    """The entry was computed from this contract text and, when it records one, from the
    implementation as it is now (entries written before hashes were recorded carry none)."""
    if e.get("sha256") != c.sha256:
        return False
    return not e.get("impl_sha") or e["impl_sha"] == impl_hash(c, e["backend"], check, mutant)


def run_state(c: Contract, e: dict | None, t: Check | None = None) -> str:
    if e is None:
        return "not-run"
    if not current(c, e, t):
        return "stale"
    return {"passed": "covered", "skipped": "skipped"}.get(e["outcome"], "failing")


def _mutant_state(c: Contract, e: dict | None, m: Mutant | None = None) -> str:
    if e is None:
        return "not-run"
    if not current(c, e, mutant=m):
        return "stale"
    return {"killed": "covered", "survived": "mutant-survived",
            "skipped": "skipped"}.get(e["outcome"], "failing")


def obligation_status(c: Contract, oid: str, ledger: dict) -> ObligationStatus:
    st = ObligationStatus(c.id, oid, "not-run")
    states = []
    entries = []
    checks = c.checks_for(oid)
    if not checks:
        st.reasons.append("no executable check")
        states.append("not-run")
    for t in checks:
        for r in runs(c, t):
            key = run_key(dict(contract=c.id, check=t.id, backend=r.backend, variant=r.variant))
            e = ledger["runs"].get(key)
            entries.append(e)
            s = run_state(c, e, t)
            states.append(s)
            st.runs.append(dict(check=t.id, backend=r.backend, variant=r.variant,
                                outcome=(e or {}).get("outcome", "not-run"), state=s,
                                duration_s=(e or {}).get("duration_s"),
                                example=(e or {}).get("example"),
                                message=(e or {}).get("message")))
            if s != "covered":
                st.reasons.append(f"{t.id} on {r.backend}/{r.variant}: {s}")
    for m in c.mutants:
        if m.obligation != oid:
            continue
        e = ledger["mutants"].get(mutant_key(dict(contract=c.id, mutant=m.id)))
        entries.append(e)
        s = _mutant_state(c, e, m)
        states.append(s)
        st.mutants.append(dict(id=m.id, killed=None if e is None else e["outcome"] == "killed",
                               killed_by=(e or {}).get("killed_by"), state=s))
        if s != "covered":
            st.reasons.append(f"{m.id}: {s}")
    if not checks:  # nothing could ever run: not-run, whatever older results say
        st.status = "not-run"
        return st
    st.status = next(p for p in PRECEDENCE if p in states or p == "covered")
    if (all(t.kind == "device" for t in checks) and set(states) == {"skipped"}
            and all(skipped_for_gpu(e) for e in entries)):
        st.status = NEEDS_GPU
        st.reasons = ["needs a GPU: its device checks were skipped here (no GPU), not passed"]
    return st


class Coverage:
    def __init__(self, contracts: list[Contract], ledger: dict):
        self.contracts = contracts
        self.table = {(c.id, o.id): obligation_status(c, o.id, ledger)
                      for c in contracts for o in c.obligations}

    def obligation(self, contract_id: str, obligation_id: str) -> ObligationStatus:
        return self.table[(contract_id, obligation_id)]

    def totals(self, contract_id: str) -> tuple[int, int]:
        """(covered, counted) for one contract; `needs-gpu` obligations are not counted."""
        rows = [s for (cid, _), s in self.table.items()
                if cid == contract_id and s.status != NEEDS_GPU]
        return sum(s.status == "covered" for s in rows), len(rows)

    def overall(self) -> tuple[int, int]:
        """(covered, counted) over every contract; `needs-gpu` obligations are not counted."""
        rows = [s for s in self.table.values() if s.status != NEEDS_GPU]
        return sum(s.status == "covered" for s in rows), len(rows)

    def needs_gpu(self) -> list[str]:
        """`contract:obligation` of every obligation that only a GPU run can cover."""
        return [f"{cid}:{oid}" for (cid, oid), s in self.table.items() if s.status == NEEDS_GPU]

    def needs_gpu_note(self) -> str:
        """'; N obligation(s) need a GPU: not run here, not counted' or ''."""
        n = len(self.needs_gpu())
        return (f"; {n} obligation(s) need a GPU (device consistency): not run here, not "
                "counted") if n else ""

    def backend_counts(self, contract_id: str) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        seen = set()
        for (cid, _), s in self.table.items():
            if cid != contract_id:
                continue
            for r in s.runs:
                k = (r["check"], r["backend"], r["variant"])
                if k in seen:
                    continue
                seen.add(k)
                d = out.setdefault(r["backend"], {"passed": 0, "failed": 0, "not-run": 0,
                                                  "stale": 0, "skipped": 0})
                key = {"covered": "passed", "failing": "failed"}.get(r["state"], r["state"])
                d[key] = d.get(key, 0) + 1
        return out

    def as_json(self) -> dict:
        covered, total = self.overall()
        return {
            "overall": {"covered": covered, "total": total,
                        "percent": round(100.0 * covered / total, 2) if total else 100.0,
                        "needs_gpu": self.needs_gpu()},
            "contracts": [
                {"id": c.id, "covered": self.totals(c.id)[0], "total": self.totals(c.id)[1],
                 "obligations": [vars(self.table[(c.id, o.id)]) for o in c.obligations]}
                for c in self.contracts],
        }

    def as_text(self) -> str:
        lines = []
        for c in self.contracts:
            cov, tot = self.totals(c.id)
            lines.append(f"{c.id}  {cov}/{tot} obligations covered")
            for o in c.obligations:
                s = self.table[(c.id, o.id)]
                why = f"  ({'; '.join(s.reasons[:3])}{' …' if len(s.reasons) > 3 else ''})" \
                    if s.reasons else ""
                lines.append(f"  {o.id:<16} {s.status:<16}{why}")
        covered, total = self.overall()
        pct = 100.0 * covered / total if total else 100.0
        lines.append(f"coverage: {covered}/{total} obligations covered ({pct:.1f}%)"
                     + self.needs_gpu_note())
        return "\n".join(lines)


def compute(contracts: list[Contract], ledger: dict) -> Coverage:
    return Coverage(contracts, ledger)
