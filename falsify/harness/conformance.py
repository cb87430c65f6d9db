"""The conformance ledger, its cells, and the matrix a person reads (`falsify conformance`
writes it; the docs' conformance page reads it: plain data, so it lives below both).

The ledger (JSON, written atomically) holds, per binding, the library's version, the contract's
hash, the binds and declared policy, and every result: check, obligation, dtype, math/policy,
outcome, and for a failure its message, minimal example, arbiter verdict and the finding that
classifies it. A cell is one binding × (math in one dtype | policy): `pass`, `fail` (every
failure classified: `deviates`, `variant <name>`), `UNCLASSIFIED`, `n/a`, `needs GPU` or
`not run`.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from falsify.harness.files import atomic_write

FORMAT = 1
FAILED = ("failed", "error", "unproven")
DTYPE_ORDER = ("float32", "float16", "bfloat16", "float64")


class ConformanceLedgerError(Exception):
    pass


def binding_id(lib, b) -> str:
    return f"{lib.name}/{b.name}"


def finding_for(b, check: str, variant: str):
    return b.findings.get(f"{check}/{variant}") or b.findings.get(check)


def record(lib, b, contract, planned: list, entries: list[dict], seconds: float,
           profile: str) -> dict:
    """One binding's ledger record from its session entries (`lib`, `b`: a
    falsify.conformance.registry Library and Binding; `planned`: its plan.planned runs)."""
    by_key = {f"{e['contract']}|{e['check']}|{e['backend']}|{e['variant']}": e for e in entries}
    results = []
    for p in planned:
        e = by_key.get(p.key)
        r = dict(check=p.check.id, obligation=p.check.obligation, variant=p.variant,
                 judges=p.judges, kind=p.check.kind,
                 outcome=e["outcome"] if e else "not-run")
        if e and e["outcome"] in FAILED:
            r.update(message=e.get("message"), example=e.get("example"),
                     arbiter=(e.get("evidence") or {}).get("arbiter"))
            f = finding_for(b, p.check.id, p.variant)
            r["finding"] = (dict(kind=f.kind, variant=f.variant, evidence=f.evidence,
                                 repro=f.repro) if f else None)
        results.append(r)
    return _header(lib, b, contract, profile, seconds, results)


def gpu_record(lib, b, contract, profile: str) -> dict:
    return _header(lib, b, contract, profile, 0.0, [])


def _header(lib, b, contract, profile: str, seconds: float, results: list) -> dict:
    return dict(library=lib.name, distribution=lib.distribution, version=lib.version(),
                binding=b.name, contract=contract.id, contract_version=contract.version,
                contract_sha=contract.sha256, binds=dict(b.binds), policy=b.policy,
                variant=b.variant, not_claimed=dict(b.not_claimed), needs_gpu=b.needs_gpu,
                profile=profile, seconds=round(seconds, 1),
                time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), results=results)


# ---------------------------------------------------------------- cells
def cell(results: list[dict], needs_gpu: str | None = None) -> str:
    """The verdict of a group of results (one binding's math in one dtype, or its policy)."""
    if needs_gpu:
        return "needs GPU"
    if not results:
        return "n/a"
    if any(r["outcome"] == "not-run" for r in results):
        return "not run"
    bad = [r for r in results if r["outcome"] in FAILED]
    if not bad:
        return "pass"
    if any(r.get("finding") is None for r in bad):
        return "UNCLASSIFIED"
    kinds = {r["finding"]["kind"] for r in bad}
    if kinds == {"variant"}:
        return "variant " + ", ".join(sorted({r["finding"]["variant"] for r in bad}))
    return "ours" if "ours" in kinds else "deviates"


def counts(results: list[dict]) -> str:
    ok = sum(r["outcome"] == "passed" for r in results)
    return f"{ok}/{len(results)}"


def math_dtypes(records: list[dict]) -> list[str]:
    seen = {r["variant"] for rec in records for r in rec["results"] if r["judges"] == "math"}
    return sorted(seen, key=lambda d: (DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 99, d))


def cells(rec: dict, dtypes: list[str]) -> dict[str, str]:
    """Column -> `verdict (passed/total)` for one binding's record."""
    out = {}
    for d in dtypes:
        rs = [r for r in rec["results"] if r["judges"] == "math" and r["variant"] == d]
        text = _cell_text(rs, rec.get("needs_gpu"))
        if rec.get("variant") and text.startswith("pass "):  # clean at the variant's pins
            text = f"variant {rec['variant']} " + text[len("pass "):]
        out[f"math {d}"] = text
    rs = [r for r in rec["results"] if r["judges"] == "policy"]
    out["policy"] = _cell_text(rs, rec.get("needs_gpu"))
    return out


def _cell_text(rs: list[dict], needs_gpu) -> str:
    v = cell(rs, needs_gpu)
    if v in ("n/a", "needs GPU"):
        return v
    skipped = [r for r in rs if r["outcome"] == "skipped"]
    gpu = sum(r.get("kind") == "device" for r in skipped)  # a device check needs CUDA
    rest = len(skipped) - gpu
    return f"{v} {counts(rs)}" + (f" ({gpu} need GPU)" if gpu else "") + (
        f" ({rest} skipped)" if rest else "")


def failures(rec: dict) -> list[dict]:
    return [r for r in rec["results"] if r["outcome"] in FAILED]


def unclassified(records: list[dict]) -> list[tuple[str, dict]]:
    return [(f"{rec['library']}/{rec['binding']}", r) for rec in records for r in failures(rec)
            if r.get("finding") is None]


# ---------------------------------------------------------------- the ledger file
def load(path: Path) -> dict:
    if not path.exists():
        return {"format": FORMAT, "bindings": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConformanceLedgerError(f"conformance ledger {path}: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(
            data.get("bindings"), dict):
        raise ConformanceLedgerError(f"conformance ledger {path}: not a format-{FORMAT} "
                                     "conformance ledger (keys `format`, `bindings`)")
    return data


def save(path: Path, records: list[dict]) -> dict:
    """Merge `records` into the ledger at `path` (a binding's new record replaces its old)."""
    data = load(path)
    for rec in records:
        data["bindings"][f"{rec['library']}/{rec['binding']}"] = rec
    data["bindings"] = dict(sorted(data["bindings"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    return data


def changed_cells(old: dict, new_records: list[dict]) -> list[str]:
    """Lines saying which cells of `new_records` differ from the same bindings in `old` (a
    committed ledger): the weekly rerun's diff."""
    out = []
    for rec in new_records:
        key = f"{rec['library']}/{rec['binding']}"
        prev = old["bindings"].get(key)
        if prev is None:
            out.append(f"{key}: new binding")
            continue
        dtypes = math_dtypes([prev, rec])
        a, b = cells(prev, dtypes), cells(rec, dtypes)
        for col in b:
            if a.get(col) != b[col]:
                out.append(f"{key} [{col}]: {a.get(col)} -> {b[col]}"
                           + (f" ({prev.get('version')} -> {rec.get('version')})"
                              if prev.get("version") != rec.get("version") else ""))
    return out


# ---------------------------------------------------------------- printing
def table(records: list[dict]):
    from rich.table import Table

    dtypes = math_dtypes(records)
    t = Table(title="falsify conformance")
    for col in ("library", "binding", "contract", *[f"math {d}" for d in dtypes], "policy"):
        t.add_column(col)
    for rec in records:
        c = cells(rec, dtypes)
        t.add_row(f"{rec['library']} {rec.get('version') or '?'}", rec["binding"],
                  rec["contract"], *[_styled(c[k]) for k in c])
    return t


def _styled(text: str) -> str:
    style = ("green" if text.startswith("pass") else "red" if text.startswith(
        ("deviates", "UNCLASSIFIED", "ours", "not run")) else "yellow" if text.startswith(
        "variant") else "dim")
    return f"[{style}]{text}[/]"


def failure_lines(rec: dict) -> list[str]:
    """For each failed check of a binding: obligation, dtype, message, minimal example,
    arbiter and classification, one block each, first failure first."""
    out = []
    for r in failures(rec):
        f = r.get("finding")
        head = (f"{rec['library']}/{rec['binding']} {r['check']} {r['variant']} "
                f"({r['judges']}, {r['obligation']}): ")
        head += (f"{f['kind']}{' ' + f['variant'] if f.get('variant') else ''}" if f
                 else "UNCLASSIFIED")
        out.append(head)
        out.append(f"  {(r.get('message') or '').splitlines()[0][:400]}" if r.get("message")
                   else "  (no message)")
        if r.get("arbiter"):
            a = r["arbiter"]
            out.append(f"  arbiter ({a.get('method')}): library off by {a['impl_ulps']:.3g} "
                       f"ulps of {a.get('dtype')}, reference by {a['ref_ulps']:.3g}"
                       if a.get("impl_ulps") is not None and a.get("ref_ulps") is not None
                       else f"  arbiter: {a.get('method')}")
        if r.get("example"):
            ex = [ln.strip() for ln in r["example"].splitlines() if "case=" in ln or "Case(" in ln]
            if ex:
                out.append(f"  minimal example: {ex[0][:300]}")
        if f:
            out.append(f"  evidence: {f['evidence']}")
    return out


# ---------------------------------------------------------------- the docs page
def reproduce(rec: dict) -> str:
    return f"falsify conformance {rec['library']} --binding '{rec['library']}/{rec['binding']}'"


def _anchor(rec: dict) -> str:
    import re

    return re.sub(r"[^a-z0-9]+", "-", f"{rec['library']}-{rec['binding']}".lower()).strip("-")


def _md(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def page(data: dict, source: str, contract_ids: set[str]) -> list[str]:
    """The conformance page's lines: the matrix (each cell a link to its binding's section,
    each contract a link to its page), then per binding its reproduction command, its declared
    policy and each failure with its classification and evidence."""
    records = list(data["bindings"].values())
    dtypes = math_dtypes(records)
    libs = sorted({(r["library"], r.get("version") or "?") for r in records})
    lines = ["# Conformance", "",
             f"Every binding below runs a contract's torch-backend checks on a third-party "
             f"function (`falsify conformance`), from `{source}`: {len(libs)} "
             f"librar{'y' if len(libs) == 1 else 'ies'}, {len(records)} binding"
             f"{'' if len(records) == 1 else 's'}, on a CPU without a GPU. *Math* is the "
             "equation's values and derivatives, per dtype; *policy* the API's promises "
             "(dtypes accepted, size-0 rules, refusals, determinism, compilation), judged "
             "against what the binding "
             "declares. A failed cell is classified: *deviates* (the library departs from the "
             "math), *variant* (a documented other convention), never left open.", "",
             "| library | binding | contract | " + " | ".join(f"math {d}" for d in dtypes)
             + " | policy |",
             "|" + "---|" * (4 + len(dtypes))]
    for rec in records:
        c = cells(rec, dtypes)
        link = (f"[{rec['contract']}]({rec['contract']}.md)" if rec["contract"] in contract_ids
                else rec["contract"])
        a = _anchor(rec)
        lines.append(f"| {_md(rec['library'])} {_md(rec.get('version') or '?')} | "
                     f"{_md(rec['binding'])} | {link} | "
                     + " | ".join(_page_cell(v, a) for v in c.values()) + " |")
    lines.append("")
    for rec in records:
        lines += _binding_section(rec)
    return lines


def _page_cell(text: str, anchor: str) -> str:
    """A matrix cell on the page: a link to the binding's section. A variant cell names its
    conventions in the link's title (and in the section), so that the matrix keeps to the
    width of a page."""
    m = re.match(r"^variant (.+?) (\d+/\d+.*)$", text)
    if m:
        title = _md(m.group(1)).replace('"', "'")
        return f'[variant {_md(m.group(2))}](#{anchor} "{title}")'
    return f"[{_md(text)}](#{anchor})"


def _binding_section(rec: dict) -> list[str]:
    out = [f"## {rec['library']} {rec['binding']} {{#{_anchor(rec)}}}", "",
           f"Contract [{rec['contract']}]({rec['contract']}.md) {rec.get('contract_version')}; "
           f"{rec['library']} {rec.get('version')}; profile {rec['profile']}; "
           f"{rec['seconds']:.0f} s.", "", "```bash", reproduce(rec), "```", ""]
    if rec.get("needs_gpu"):
        out += [f"Needs a GPU: {rec['needs_gpu']}", ""]
    pol = rec.get("policy") or {}
    declared = ([f"accepts {', '.join(pol['dtypes'])}"] if pol.get("dtypes") else []) + [
        f"size-0 `{d}`: {r}" for d, r in (pol.get("zero_size") or {}).items()]
    if declared:
        out += ["Declared policy: " + "; ".join(declared) + ".", ""]
    if rec.get("variant"):
        out += [f"Follows the contract's variant `{rec['variant']}` (see the equation's "
                f"variants on [its page]({rec['contract']}.md)): judged by the same checks and "
                "bounds at the variant's pins.", ""]
    for check, why in (rec.get("not_claimed") or {}).items():
        out.append(f"- `{check}` not claimed: {why}")
    for r in failures(rec):
        f = r.get("finding") or {}
        kind = f.get("kind", "UNCLASSIFIED") + (f" ({f['variant']})" if f.get("variant") else "")
        first = (r.get("message") or "").split("; arbiter")[0].splitlines()[:1]
        out.append(f"- **{r['check']}** {r['variant']} ({r['judges']}, {r['obligation']}): "
                   f"**{kind}**. {_md(first[0][:300]) if first else ''}"
                   + (f" {_arbiter_text(r['arbiter'])}" if r.get("arbiter") else "")
                   + (f" Evidence: {_md(f['evidence'])}" if f.get("evidence") else "")
                   + (f" Reproduce: `python evidence/conformance/{f['repro']}`"
                      if f.get("repro") else ""))
    out.append("")
    return out


def _arbiter_text(a: dict) -> str:
    """Which side the high-precision re-run of the reference puts the error on, in ulps."""
    if a.get("impl_ulps") is None or a.get("ref_ulps") is None:
        return f"Arbiter: {_md(str(a.get('method')))}."
    return (f"Arbiter ({_md(str(a.get('method')))}): the library is {a['impl_ulps']:.3g} ulps "
            f"of {a.get('dtype')} from the truth, the float64 reference {a['ref_ulps']:.3g}.")
