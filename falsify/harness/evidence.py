"""Where the docs pages' results come from: committed evidence, or a labelled local ledger.

A project's `evidence` key names committed ledgers (paths or globs, e.g. the thorough profile's
run, later a conformance run or a GPU run). Each carries a top-level `provenance` object that
says what it is evidence of:

    "provenance": {"commit": "<hex>", "profile": "thorough", "date": "2026-11-28T02:01:21Z"}

`commit` is the commit whose code the results were recorded against, `profile` the hypothesis
profile every entry ran under, `date` the time of the latest entry. They are stored in the file,
not looked up in git when pages are generated, so the same checkout always renders the same
pages (a shallow clone or an uncommitted ledger would otherwise change them). A provenance that
no longer describes the entries (an entry newer than `date`, or under another profile) is an
error naming the file and the field: the ledger was extended and must be stamped again.

Several evidence ledgers are read into one: for a key held by more than one, a recorded result
beats a skip (a GPU run's pass over a CPU run's skip of the same check), then the later one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from falsify.errors import UsageError
from falsify.harness import ledger as ledger_mod
from falsify.harness.project import PROFILES, Project

_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")
_DATE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


class EvidenceError(UsageError):
    """An evidence ledger that is missing, unreadable or without a valid provenance."""


@dataclass(frozen=True)
class Source:
    """One ledger the pages' results come from, as the pages name it."""

    path: str  # as the project names it (relative to its root)
    profile: str
    date: str  # YYYY-MM-DD
    commit: str | None = None  # None: a local ledger, not committed evidence
    contracts: frozenset[str] = field(default_factory=frozenset)  # contracts it holds results of

    @property
    def local(self) -> bool:
        return self.commit is None

    def describe(self) -> str:
        """`path` (commit …, profile …, date), or the local ledger's label."""
        if self.local:
            return (f"the local ledger `{self.path}` (not committed evidence; profile "
                    f"{self.profile}, updated {self.date})")
        return f"`{self.path}` (commit `{self.commit[:12]}`, profile {self.profile}, {self.date})"


def _rel(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.name


def files(project: Project) -> list[Path]:
    """The evidence ledgers the project declares, in a stable order; a pattern matching no
    file is an error (a renamed ledger must not silently drop out of the site)."""
    out: list[Path] = []
    for pattern in project.evidence:
        found = sorted(project.root.glob(pattern))
        if not found:
            raise EvidenceError(f"{project.source}: evidence {pattern!r} matches no file under "
                                f"{project.root.name}/")
        out += [p for p in found if p not in out]
    return out


def provenance(data: dict, name: str) -> dict:
    """The ledger's provenance, checked against its entries."""
    prov = data.get("provenance")
    if not isinstance(prov, dict):
        raise EvidenceError(f"{name}: no `provenance` object (commit, profile, date): an "
                            "evidence ledger must say what it is evidence of; record it with "
                            f"pv ledger stamp {name} --commit <the commit it ran on>")
    for key in ("commit", "profile", "date"):
        if not isinstance(prov.get(key), str) or not prov[key]:
            raise EvidenceError(f"{name}: provenance.{key} is missing")
    if not _COMMIT.match(prov["commit"]):
        raise EvidenceError(f"{name}: provenance.commit {prov['commit']!r} is not a commit hash")
    if prov["profile"] not in PROFILES:
        raise EvidenceError(f"{name}: provenance.profile {prov['profile']!r} is not one of "
                            f"{', '.join(PROFILES)}")
    if not _DATE.match(prov["date"]):
        raise EvidenceError(f"{name}: provenance.date {prov['date']!r} is not a UTC time "
                            "(YYYY-MM-DDTHH:MM:SSZ)")
    for section in ("runs", "mutants"):
        for key, e in sorted(data[section].items()):
            if e.get("profile") not in (None, prov["profile"]):
                raise EvidenceError(f"{name}: provenance.profile is {prov['profile']!r} but "
                                    f"{key!r} ran under {e.get('profile')!r}")
            if str(e.get("time", "")) > prov["date"]:
                raise EvidenceError(f"{name}: provenance.date {prov['date']} is older than "
                                    f"{key!r} ({e['time']}): the ledger was extended since it "
                                    f"was stamped; stamp it again: pv ledger stamp {name} "
                                    "--commit <the commit it ran on>")
    return prov


def stamp(path: Path, commit: str) -> dict:
    """`pv ledger stamp`: give a ledger the provenance that makes it evidence: `commit` (the
    caller resolves it; it is stored, never looked up later), the one profile its entries ran
    under, and the time of its latest entry."""
    path = Path(path)
    if not path.is_file():
        raise EvidenceError(f"{path}: no such ledger")
    try:
        data = ledger_mod.load(path)
    except ledger_mod.LedgerError as e:
        raise EvidenceError(str(e)) from None
    entries = [e for s in ("runs", "mutants") for e in data[s].values()]
    if not entries:
        raise EvidenceError(f"{path}: holds no results; nothing to stamp")
    profiles = sorted({str(e.get("profile")) for e in entries})
    if len(profiles) != 1:
        raise EvidenceError(f"{path}: entries ran under several profiles ({', '.join(profiles)})"
                            "; evidence is one profile's run")
    prov = {"commit": commit.lower(), "profile": profiles[0],
            "date": max(str(e.get("time", "")) for e in entries)}
    provenance({**data, "provenance": prov}, str(path))  # the same rules generate applies
    return ledger_mod.set_provenance(path, prov)["provenance"]


def _contracts(data: dict) -> frozenset[str]:
    return frozenset(str(e.get("contract")) for s in ("runs", "mutants")
                     for e in data[s].values())


def _rank(e: dict) -> tuple[bool, str]:
    return e.get("outcome") != "skipped", str(e.get("time", ""))


def _better(new: dict, old: dict) -> bool:
    """A recorded result beats a skip of the same key; then the later one wins."""
    return _rank(new) > _rank(old)


def load_evidence(project: Project) -> tuple[dict, list[Source]]:
    """The project's evidence ledgers read into one ledger, and their sources."""
    paths = files(project)
    if not paths:
        raise EvidenceError(f"{project.source}: no `evidence` ledgers declared")
    out = {"version": ledger_mod.VERSION, "runs": {}, "mutants": {}}
    sources = []
    for path in paths:
        name = _rel(path, project.root)
        try:
            data = ledger_mod.load(path)
        except ledger_mod.LedgerError as e:
            raise EvidenceError(str(e)) from None
        prov = provenance(data, name)
        for section in ("runs", "mutants"):
            for key, e in data[section].items():
                old = out[section].get(key)
                if old is None or _better(e, old):
                    out[section][key] = e
        sources.append(Source(name, prov["profile"], prov["date"][:10], prov["commit"],
                              _contracts(data)))
    return out, sources


def load_local(project: Project) -> tuple[dict, list[Source]]:
    """The project's own ledger, labelled as such (no ledger: no results, no source)."""
    data = ledger_mod.load(project.ledger_path)
    if not (data["runs"] or data["mutants"]):
        return data, []
    profiles = sorted({str(e.get("profile") or "unrecorded") for s in ("runs", "mutants")
                       for e in data[s].values()})
    return data, [Source(_rel(project.ledger_path, project.root), ", ".join(profiles),
                         str(data.get("updated") or "unrecorded")[:10], None, _contracts(data))]
