"""The docs pages show committed evidence and name it; without results they say "not run".

Each test is a fresh project (falsify.toml, one contract) driven through `pv generate`, as a
user runs it: the pages are read back from the project's docs directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from falsify.cli.pv import main
from falsify.harness.ledger import mutant_key, run_key
from falsify.harness.model import load_contract
from falsify.harness.plan import runs
from falsify.harness.project import library_dir

# a measured-looking zero: "0/14 obligations", "0/8 killed", "0/2 passed", a "| 0/14 |" cell
ZERO = re.compile(r"\b0/\d+ (obligations|killed|passed)|\| 0/\d+ \|")
CID = "mysoftmax-kernel-v1"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _project(tmp_path: Path, evidence: list[str] | None = None) -> Path:
    (tmp_path / "contracts").mkdir()
    data = yaml.safe_load((library_dir() / "softmax-kernel-v1.yaml").read_text())
    (tmp_path / "contracts" / f"{CID}.yaml").write_text(
        yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    toml = "" if evidence is None else f"evidence = {json.dumps(evidence)}\n"
    (tmp_path / "falsify.toml").write_text(toml)
    return tmp_path


def _ledger(proj: Path, path: str, outcome="passed", killed=True, profile="thorough",
            time="2026-11-28T02:00:00Z", provenance: dict | None = None) -> Path:
    """A ledger with a result for every planned run and mutant of the project's contract."""
    c, _ = load_contract(proj / "contracts" / f"{CID}.yaml")
    data = {"version": 1, "runs": {}, "mutants": {}}
    for chk in c.checks:
        if not chk.spec:
            continue
        for r in runs(c, chk):
            e = dict(contract=c.id, check=chk.id, backend=r.backend, variant=r.variant,
                     obligation=chk.obligation, outcome=outcome, duration_s=0.1,
                     sha256=c.sha256, profile=profile, time=time)
            data["runs"][run_key(e)] = e
    for m in c.mutants:
        e = dict(contract=c.id, mutant=m.id, outcome="killed" if killed else "survived",
                 killed_by=[], sha256=c.sha256, profile=profile, time=time)
        data["mutants"][mutant_key(e)] = e
    if provenance is not None:
        data["provenance"] = provenance
    p = proj / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1, sort_keys=True))
    return p


def _generate(proj: Path, monkeypatch, capsys, *args) -> tuple[int, str, dict[str, str]]:
    monkeypatch.chdir(proj)
    rc = main(["generate", *args])
    out = "".join(capsys.readouterr())
    pages = {p.name: p.read_text() for p in (proj / "site" / "docs" / "contracts").glob("*.md")}
    return rc, out, pages


PROV = {"commit": COMMIT, "profile": "thorough", "date": "2026-11-28T02:01:21Z"}
LINE = f"`evidence/thorough-ledger.json` (commit `{COMMIT[:12]}`, profile thorough, 2026-11-28)"


def test_without_results_the_pages_say_not_run(tmp_path, monkeypatch, capsys):
    proj = _project(tmp_path)  # no evidence, no local ledger: nothing was ever run
    rc, out, pages = _generate(proj, monkeypatch, capsys)
    assert rc == 0, out
    index, page = pages["index.md"], pages[f"{CID}.md"]
    for text in (index, page):
        assert "0 %" not in text and not re.search(ZERO, text), text
    assert '!!! warning "No results"' in index
    assert "**Overall: not run**" in index
    row = next(ln for ln in index.splitlines() if ln.startswith(f"| [{CID}]"))
    assert row.count("not run") == 3  # obligations covered, mutants killed, covered
    assert "- **Coverage** **not run**" in page and "**mutants** not run" in page
    assert "**Results from**: no ledger (nothing has been run)" in page


def test_evidence_figures_name_their_source(tmp_path, monkeypatch, capsys):
    proj = _project(tmp_path, ["evidence/*-ledger.json"])
    _ledger(proj, "evidence/thorough-ledger.json", provenance=PROV)
    rc, out, pages = _generate(proj, monkeypatch, capsys)
    assert rc == 0, out
    index, page = pages["index.md"], pages[f"{CID}.md"]
    n = len(load_contract(proj / "contracts" / f"{CID}.yaml")[0].obligations)
    assert f"**Overall: {n}/{n} obligations covered (100 %).**" in index
    assert f"**Results from** {LINE}" in index
    assert f"- **Coverage** **100 %**: {n}/{n} obligations covered" in page
    assert f"- **Results from** {LINE}" in page
    assert "No results" not in index and "Local results" not in index


def test_a_local_ledger_does_not_reach_pages_built_from_evidence(tmp_path, monkeypatch, capsys):
    """Regenerating is deterministic: a ledger the checkout happens to hold changes nothing."""
    proj = _project(tmp_path, ["evidence/*-ledger.json"])
    _ledger(proj, "evidence/thorough-ledger.json", provenance=PROV)
    _, _, before = _generate(proj, monkeypatch, capsys)
    _ledger(proj, ".falsify/ledger.json", outcome="failed", killed=False, profile="fast")
    rc, out, after = _generate(proj, monkeypatch, capsys)
    assert rc == 0, out
    assert after == before
    # asked for, the local ledger is shown, and labelled as what it is
    rc, out, local = _generate(proj, monkeypatch, capsys, "--results", "ledger")
    assert rc == 0, out
    assert ("**Results from** the local ledger `.falsify/ledger.json` (not committed evidence; "
            "profile fast, updated ") in local["index.md"]
    assert '!!! note "Local results"' in local["index.md"]
    assert "**Overall: 0/" in local["index.md"]  # it ran, and failed: a real 0 %


def test_several_evidence_ledgers_each_named(tmp_path, monkeypatch, capsys):
    """A GPU run's pass replaces the CPU run's skip of the same check; both files are named."""
    proj = _project(tmp_path, ["evidence/*-ledger.json"])
    _ledger(proj, "evidence/thorough-ledger.json", outcome="skipped", provenance=PROV)
    gpu = {"commit": "89abcdef" * 5, "profile": "ci", "date": "2026-11-29T10:00:00Z"}
    _ledger(proj, "evidence/gpu-ledger.json", profile="ci", time="2026-11-29T09:00:00Z",
            provenance=gpu)
    rc, out, pages = _generate(proj, monkeypatch, capsys)
    assert rc == 0, out
    index = pages["index.md"]
    assert ("**Results from** `evidence/gpu-ledger.json` (commit `89abcdef89ab`, profile ci, "
            f"2026-11-29); {LINE}") in index
    assert "(100 %)" in index


@pytest.mark.parametrize("prov, says", [
    (None, "no `provenance` object (commit, profile, date)"),
    ({"profile": "thorough", "date": "2026-11-28T02:01:21Z"}, "provenance.commit is missing"),
    ({**PROV, "commit": "HEAD"}, "provenance.commit 'HEAD' is not a commit hash"),
    ({**PROV, "profile": "fast"}, "provenance.profile is 'fast' but"),
    ({**PROV, "date": "2026-11-28T01:00:00Z"}, "the ledger was extended since it was stamped"),
    ({**PROV, "date": "2026-11-28"}, "provenance.date '2026-11-28' is not a UTC time"),
])
def test_evidence_without_a_valid_provenance_is_refused(tmp_path, monkeypatch, capsys, prov,
                                                        says):
    proj = _project(tmp_path, ["evidence/*-ledger.json"])
    _ledger(proj, "evidence/thorough-ledger.json", provenance=prov)
    rc, out, pages = _generate(proj, monkeypatch, capsys)
    assert rc == 2, out
    assert "evidence/thorough-ledger.json" in out and says in out, out
    assert not pages  # nothing published from unlabelled results


def test_an_evidence_pattern_matching_nothing_is_refused(tmp_path, monkeypatch, capsys):
    proj = _project(tmp_path, ["evidence/*-ledger.json"])
    rc, out, _ = _generate(proj, monkeypatch, capsys)
    assert rc == 2 and "evidence 'evidence/*-ledger.json' matches no file" in out, out


def test_this_repository_publishes_its_committed_evidence():
    """The committed ledgers carry a valid provenance (tests/test_workflows.py: the Pages
    workflow generates from them)."""
    from falsify.harness.evidence import load_evidence
    from falsify.harness.project import find_project

    root = Path(__file__).resolve().parents[1]
    _, sources = load_evidence(find_project(root))
    assert "evidence/thorough-ledger.json" in [s.path for s in sources]
    assert all(not s.local and s.commit for s in sources)


def test_stamp_records_the_provenance_generate_then_accepts(tmp_path, monkeypatch, capsys):
    import subprocess

    proj = _project(tmp_path, ["evidence/*-ledger.json"])
    led = _ledger(proj, "evidence/thorough-ledger.json")  # as a merged run writes it: no stamp
    rc, out, _ = _generate(proj, monkeypatch, capsys)
    assert rc == 2 and "no `provenance` object" in out, out
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(proj)]
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "results"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert main(["ledger", "stamp", str(led)]) == 0
    prov = json.loads(led.read_text())["provenance"]
    assert prov == {"commit": head, "profile": "thorough", "date": "2026-11-28T02:00:00Z"}
    rc, out, pages = _generate(proj, monkeypatch, capsys)
    assert rc == 0, out
    assert (f"`evidence/thorough-ledger.json` (commit `{head[:12]}`, profile thorough, "
            "2026-11-28)") in pages["index.md"]
    # a profile mix is not one run's evidence
    _ledger(proj, "evidence/thorough-ledger.json")
    data = json.loads(led.read_text())
    next(iter(data["runs"].values()))["profile"] = "fast"
    led.write_text(json.dumps(data))
    assert main(["ledger", "stamp", str(led)]) == 2
    assert "several profiles (fast, thorough)" in "".join(capsys.readouterr())
