"""`pv audit`: the traceability chain of one contract, with every broken link listed.

reference → equation → obligation → checks → bindings → last results → mutants.
A gap is anything that breaks the chain: no reference, an equation no obligation applies to or
with no optimized binding, an obligation with no executable check, a required run with no
passing current result, a contract with no mutants, a mutant not killed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from falsify.harness.coverage import obligation_status
from falsify.harness.model import Contract
from falsify.harness.plan import equation_of


@dataclass
class Audit:
    contract: str
    chain: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)

    def as_text(self) -> str:
        head = f"{self.contract}: {'OK' if not self.gaps else f'{len(self.gaps)} gap(s)'}"
        body = [f"  {line}" for line in self.chain]
        gaps = [f"  GAP {g}" for g in self.gaps]
        return "\n".join([head, *body, *gaps])

    def as_dict(self) -> dict:
        return {"contract": self.contract, "chain": self.chain, "gaps": self.gaps}


def audit(c: Contract, ledger: dict) -> Audit:
    a = Audit(c.id)
    if c.references:
        for r in c.references:
            a.chain.append(f"reference: {r}")
    else:
        a.gaps.append("no metadata.references: the equations cite no source")
    applied = {e for o in c.obligations for e in o.applies_to}
    applied |= {equation_of(c, t) for t in c.checks if t.spec}
    for name, eq in c.equations.items():
        binds = ", ".join(f"{b}={ref}" for b, ref in eq.bindings.items()) or "none"
        a.chain.append(f"equation {name}: bindings {binds}")
        if name not in applied and "all" not in applied:
            a.gaps.append(f"equation {name}: no obligation applies to it")
        if not eq.bindings:
            a.gaps.append(f"equation {name}: no bindings, nothing executes it")
        elif "reference" not in eq.bindings:
            a.gaps.append(f"equation {name}: no reference binding")
    for o in c.obligations:
        st = obligation_status(c, o.id, ledger)
        checks = c.checks_for(o.id)
        a.chain.append(f"obligation {o.id} ({o.type}): {st.status}; checks "
                       f"{', '.join(t.id for t in checks) or 'none'}")
        for r in st.runs:
            a.chain.append(f"    {r['check']} {r['backend']}/{r['variant']}: {r['state']}"
                           + (f" — {r['message']}" if r.get("message") else ""))
        for m in st.mutants:
            a.chain.append(f"    mutant {m['id']}: {m['state']}"
                           + (f" (killed by {m['killed_by']})" if m.get("killed_by") else ""))
        if not checks:
            a.gaps.append(f"{o.id}: no executable check")
        a.gaps += [f"{o.id}: {r}" for r in st.reasons if r != "no executable check"]
    if c.mode == "native" and not c.mutants:
        a.gaps.append("no mutants: nothing shows the checks can fail")
    return a
