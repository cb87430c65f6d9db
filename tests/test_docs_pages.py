"""Unit tests of the contract page generator (falsify/harness/docs.py): deterministic output, live
statuses from a coverage object, math for every equation, bindings and mutants listed, contract
text that cannot break the markdown."""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import markdown
import pytest

from falsify.harness import docs, files
from falsify.harness.docs import (
    GENERATED_MARKER,
    check_site,
    render_site,
    write_site,
)
from falsify.harness.model import load_contract
from falsify.harness.plan import runs
from falsify.harness.validate import load_all

# a measured-looking zero: "0/14 obligations", "0/8 killed", "0/2 passed", a "| 0/14 |" cell
ZERO = re.compile(r"\b0/\d+ (obligations|killed|passed)|\| 0/\d+ \|")
ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "falsify" / "contracts" / "softmax-kernel-v1.yaml"
COMPAT = ROOT / "tests" / "fixtures" / "compat"


# --------------------------------------------------------------------------------------------
# a coverage object with the interface falsify/harness/coverage.py provides


@dataclass
class FakeObligation:
    status: str
    runs: list[dict] = field(default_factory=list)
    mutants: list[dict] = field(default_factory=list)


class FakeCoverage:
    """`obligation(cid, oid)`, `totals(cid)`, `overall()` over a dict of FakeObligations."""

    def __init__(self, data: dict[tuple[str, str], FakeObligation]):
        self.data = data

    def obligation(self, cid, oid):
        return self.data.get((cid, oid))

    def totals(self, cid):
        mine = [v for (c, _), v in self.data.items() if c == cid]
        return sum(v.status == "covered" for v in mine), len(mine)

    def overall(self):
        return (sum(v.status == "covered" for v in self.data.values()), len(self.data))

    @classmethod
    def mixed(cls, contracts):
        """Per contract, obligations in order: covered, failing, mutant-survived, stale,
        skipped, then not-run; runs and mutants consistent with each status."""
        data = {}
        for c in contracts:
            for i, o in enumerate(c.obligations):
                status = ["covered", "failing", "mutant-survived", "stale", "skipped"][i] \
                    if i < 5 else "not-run"
                outcome = {"covered": "passed", "failing": "failed", "mutant-survived": "passed",
                           "stale": "passed", "skipped": "skipped"}.get(status)
                rs = []
                if outcome:
                    for chk in c.checks_for(o.id):
                        for j, r in enumerate(runs(c, chk)):
                            out = "failed" if status == "failing" and j == 0 else (
                                "passed" if status == "failing" else outcome)
                            rs.append(dict(check=chk.id, backend=r.backend, variant=r.variant,
                                           outcome=out, duration_s=0.25,
                                           example="x=array([[1e4, -1e4]])"
                                           if out == "failed" else None))
                ms = [dict(id=m.id, killed=status != "mutant-survived",
                           killed_by=[x.id for x in c.checks_for(o.id)][:1]
                           if status != "mutant-survived" else None)
                      for m in c.mutants if m.obligation == o.id and outcome]
                data[(c.id, o.id)] = FakeObligation(status, rs, ms)
        return cls(data)


@pytest.fixture(scope="module")
def softmax():
    c, findings = load_contract(SOFTMAX)
    assert not [f for f in findings if f.severity == "error"]
    return c


def _page(contracts, coverage, cid):
    return render_site(contracts, coverage)[f"docs/contracts/{cid}.md"]


def _row(page: str, ident: str) -> str:
    """The markdown table row that anchors `ident`."""
    for line in page.splitlines():
        if line.startswith("|") and f'<a id="{ident.lower()}"></a>' in line:
            return line
    raise AssertionError(f"no table row for {ident}")


def _backend_row(page: str, oid: str) -> dict[str, str]:
    """The 'Results per backend' row of an obligation, as {backend: cell}."""
    lines = page.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"| [{oid}](#{oid.lower()})"))
    h = i
    while not lines[h].startswith("| obligation |"):
        h -= 1

    def split(ln: str) -> list[str]:
        return [x.strip() for x in ln.strip().strip("|").split(" | ")]

    return dict(zip(split(lines[h])[1:], split(lines[i])[1:]))


def _section(page: str, heading_id: str) -> str:
    m = re.search(r"^### .*\{#" + re.escape(heading_id.lower()) + r"\}$(.*?)(?=^##)", page,
                  re.M | re.S)
    assert m, f"no section {heading_id}"
    return m.group(1)


# --------------------------------------------------------------------------------------------


def test_output_is_deterministic(softmax, tmp_path):
    contracts = load_all([ROOT / "falsify" / "contracts", COMPAT]).contracts
    cov = FakeCoverage.mixed(contracts)
    a = render_site(contracts, cov)
    b = render_site(list(reversed(contracts)), FakeCoverage.mixed(list(reversed(contracts))))
    assert a == b
    assert list(a) == sorted(a)
    joined = "\n".join(a.values())
    assert not re.search(r"\b20\d\d-\d\d-\d\d[T ]\d\d:\d\d", joined), \
        "a timestamp leaked into the pages"
    assert str(ROOT) not in joined, "an absolute path leaked into the pages"

    site = tmp_path / "site"
    paths = write_site(contracts, cov, site)
    assert paths == sorted(paths)
    assert {p.relative_to(site).as_posix() for p in paths} == set(a)
    mtimes = {p: p.stat().st_mtime_ns for p in paths}
    assert write_site(contracts, cov, site) == paths
    assert {p: p.stat().st_mtime_ns for p in paths} == mtimes, "unchanged pages were rewritten"
    assert check_site(contracts, cov, site) == []
    assert not list(site.rglob("*.tmp")), "temporary files left behind"


def test_writes_are_atomic_and_stale_pages_removed(softmax, tmp_path, monkeypatch):
    site = tmp_path / "site"
    pages = site / "docs" / "contracts"
    pages.mkdir(parents=True)
    (pages / "gone-kernel-v1.md").write_text(f"---\ntitle: x\n---\n\n{GENERATED_MARKER}\n")
    (pages / "hand-written.md").write_text("# notes kept by a human\n")
    replaced = []
    real = os.replace
    monkeypatch.setattr(files.os, "replace", lambda a, b: (replaced.append(Path(b)), real(a, b)))
    assert check_site([softmax], None, site)  # would create and delete pages
    paths = write_site([softmax], None, site)
    assert sorted(replaced) == paths  # every page went through temp file + os.replace
    assert not (pages / "gone-kernel-v1.md").exists()
    assert (pages / "hand-written.md").exists()
    assert check_site([softmax], None, site) == []


def test_without_coverage_everything_is_not_run(softmax):
    site = render_site([softmax], None)
    page = site["docs/contracts/softmax-kernel-v1.md"]
    for o in softmax.obligations:
        assert 'fs-not-run">not-run' in _row(page, o.id)
    for m in softmax.mutants:
        assert 'fs-not-run">not-run' in _row(page, m.id)
    assert "fs-covered" not in page and "fs-passed" not in page and "fs-killed" not in page
    # nothing ran: "not run", never a 0 % that reads like a measured result
    assert f"**not run**: no results for its {len(softmax.obligations)} obligations" in page
    index = site["docs/contracts/index.md"]
    n = len(load_all([SOFTMAX]).contracts[0].obligations)
    assert f"**Overall: not run** (no results for any of the {n} obligations)" in index
    for text_ in (page, index):
        assert "0 %" not in text_ and f"0/{n}" not in text_


def test_an_empty_ledger_reads_not_run_and_warns(softmax):
    """A missing ledger loads as an empty one: the pages must not turn it into 0 % covered."""
    from falsify.harness.coverage import compute

    site = render_site([softmax], compute([softmax], {"runs": {}, "mutants": {}}))
    index, page = site["docs/contracts/index.md"], site["docs/contracts/softmax-kernel-v1.md"]
    assert '!!! warning "No results"' in index and "**Overall: not run**" in index
    for text_ in (page, index):
        assert "0 %" not in text_ and not re.search(ZERO, text_)


def test_statuses_from_coverage_object(softmax):
    cov = FakeCoverage.mixed([softmax])
    page = _page([softmax], cov, softmax.id)
    obs = softmax.obligations
    expect = ["covered", "failing", "mutant-survived", "stale", "skipped"]
    expect += ["not-run"] * (len(obs) - len(expect))  # FakeCoverage.mixed: the rest not run
    for o, status in zip(obs, expect):
        assert f'fs-{status}">{status}</span>' in _row(page, o.id), (o.id, status)
    # per backend: the failing obligation's row says failed on the backend of its first run
    failing = obs[1]
    first = runs(softmax, softmax.checks_for(failing.id)[0])[0]
    cells = _backend_row(page, failing.id)
    assert cells[first.backend].startswith('<span class="fs-status fs-failed">failed</span> 1/')
    skipped = _backend_row(page, obs[4].id)
    assert all("fs-skipped" in v for v in skipped.values() if v != "–")
    covered = _backend_row(page, obs[0].id)
    assert all("fs-passed" in v for v in covered.values() if v != "–")
    # check sections list every expected run with its outcome and the failing example
    sec = _section(page, softmax.checks_for(failing.id)[0].id)
    assert "`x=array([[1e4, -1e4]])`" in sec
    assert sec.count("`float32`") >= 1 and "0.250 s" in sec
    # mutants: killed with killed_by, survived
    for m in softmax.mutants:
        row = _row(page, m.id)
        i = [o.id for o in obs].index(m.obligation)
        ob_status = expect[i] if i < len(expect) else "not-run"  # mixed(): not-run past 5
        if ob_status == "mutant-survived":
            assert 'fs-survived">survived' in row
        elif ob_status == "not-run":
            assert 'fs-not-run">not-run' in row
        else:
            assert 'fs-killed">killed' in row and "FALSIFY-SM-" in row
    # dashboard: covered/total from coverage.totals, per backend pass/fail/not-run, mutants
    index = render_site([softmax], cov)["docs/contracts/index.md"]
    line = next(ln for ln in index.splitlines() if ln.startswith("| [softmax-kernel-v1]"))
    n = len(softmax.obligations)
    assert f"| 1/{n} |" in line and f"{100 / n:.0f} %" in line
    header = next(ln for ln in index.splitlines() if ln.startswith("| contract"))
    for b in ("reference", "torch", "triton", "z3"):
        assert f" {b} |" in header
    cells = [x.strip() for x in line.strip("|").split("|")]
    counts = [c for c in cells if re.fullmatch(r"\d+ / \d+ / \d+", c)]
    assert len(counts) == 4
    assert sum(int(c.split(" / ")[1]) for c in counts) == 1  # exactly the one failed run
    assert f"Overall: 1/{len(softmax.obligations)} obligations covered" in index


def test_unknown_obligation_in_coverage_reads_not_run(softmax):
    class Partial(FakeCoverage):
        def obligation(self, cid, oid):
            return None

    page = _page([softmax], Partial({}), softmax.id)
    for o in softmax.obligations:
        assert "fs-not-run" in _row(page, o.id)


def test_math_for_every_equation(softmax, monkeypatch):
    c = copy.deepcopy(softmax)
    eq = next(iter(c.equations.values()))
    page = _page([c], None, c.id)
    assert f"$$\n{eq.latex.strip()}\n$$" in page
    # an equation without `latex:` is converted from its formula by to_latex
    eq.latex = None
    monkeypatch.setattr(docs, "to_latex", lambda f: "LATEX(" + f + ")")
    page = _page([c], None, c.id)
    assert f"$$\nLATEX({eq.formula})\n$$" in page
    for cc in load_all([COMPAT]).contracts:
        page = _page([cc], None, cc.id)
        # one display block per equation: an opening and a closing $$ line each
        assert page.count("\n$$\n") == 2 * len(cc.equations), cc.id


def test_bindings_mutants_checks_and_strategies_listed(softmax):
    page = _page([softmax], None, softmax.id)
    for eq in softmax.equations.values():
        for ref in eq.bindings.values():
            assert f"`{ref}`" in page
        assert "falsify/reference/softmax.py:" in page
        assert "falsify/kernels/torch/softmax.py:" in page
        # the source is embedded
        assert '??? note "reference: falsify/reference/softmax.py:' in page
        assert "def softmax" in page
        for dtype in eq.gpu_only:
            assert f"`{dtype}`" in page
    for m in softmax.mutants:
        row = _row(page, m.id)
        assert m.replaces in row and m.with_ in row and m.obligation in row
    for chk in softmax.checks:
        sec = _section(page, chk.id)
        assert f"`{chk.kind}`" in sec
        assert "If it fails" in sec
        tol = (chk.spec or {}).get("tolerance")
        if tol:
            assert "**Why**" in sec
            for dt in tol:
                if dt != "why":
                    assert f"`{dt}`" in sec
    for name in softmax.inputs:
        assert f"{{#input-{name}}}" in page
    assert "`m ∈ [1, 8]`" in page
    assert "```mermaid\ngraph" in page
    assert page.count('<a id="sm-inv-001"></a>') == 1


def test_missing_binding_source_is_reported_not_invented(softmax):
    c = copy.deepcopy(softmax)
    eq = next(iter(c.equations.values()))
    eq.bindings["triton"] = "falsify.kernels.triton.nonexistent_kernel:softmax"
    page = _page([c], None, c.id)
    row = next(ln for ln in page.splitlines() if "nonexistent_kernel" in ln)
    assert "not found" in row


# the same extensions mkdocs.yml enables, so the test sees what the site will render
MD_EXTENSIONS = ["toc", "tables", "admonition", "attr_list", "pymdownx.details",
                 "pymdownx.superfences", "pymdownx.arithmatex"]


def test_contract_text_cannot_break_the_markup(softmax):
    c = copy.deepcopy(softmax)
    nasty = "a | b *not em* _x_ [link](http://e.com) <script>alert(1)</script> $x$ {: .cls} # h"
    c.description = nasty
    c.obligations[0].property = nasty
    c.checks[0].if_fails = nasty
    c.obligations[1].formal = r"a*b*c $z$ \alpha ``q`` | r"
    page = _page([c], None, c.id)
    html = markdown.markdown(page, extensions=MD_EXTENSIONS,
                             extension_configs={"pymdownx.arithmatex": {"generic": True}})
    assert "<script>" not in html
    assert "<em>not em</em>" not in html and "<em>x</em>" not in html
    assert 'href="http://e.com"' not in html
    assert 'class="cls"' not in html
    # only the equation blocks are math; "$x$" in prose stays text
    assert html.count('class="arithmatex"') == len(c.equations)
    # the obligation row still has all its cells (the | in the text did not split it)
    row_html = re.search(r"<tr>\s*<td><a id=\"sm-inv-001\"></a>.*?</tr>", html, re.S).group(0)
    n_cols = len(re.findall(r"<th[ >]", re.search(r"<thead>.*?</thead>", html[:html.index(
        row_html)].rsplit("<table>", 1)[1], re.S).group(0)))
    assert row_html.count("<td") == n_cols
    assert r"<code>a*b*c $z$ \alpha ``q`` | r</code>" in html  # code stays verbatim
    # formal text with | signs stays in one code span
    assert "<code>|Σ_i σ(x)_i − 1| ≤ tol</code>" in html


def test_compat_contracts_render(tmp_path):
    rep = load_all([COMPAT])
    assert rep.contracts
    site = render_site(rep.contracts, None)
    for c in rep.contracts:
        page = site[f"docs/contracts/{c.id}.md"]
        for chk in c.checks:
            if chk.spec is None:
                assert "no executable" in _section(page, chk.id)
        for d in c.depends_on:
            assert d in page


def test_real_coverage_object_from_a_small_ledger(softmax):
    """The adapter against falsify/harness/coverage.py itself: a pass, a failure, a stale pass and a
    killed mutant from a hand-made ledger show up as such."""
    from falsify.harness.coverage import compute
    from falsify.harness.ledger import mutant_key, run_key

    c = softmax
    chk1, chk2 = c.checks_for("SM-INV-001")[0], c.checks_for("SM-BND-001")[0]
    ledger = {"runs": {}, "mutants": {}}

    def rec(chk, r, outcome, sha=c.sha256, **extra):
        e = dict(contract=c.id, check=chk.id, backend=r.backend, variant=r.variant,
                 outcome=outcome, duration_s=0.5, sha256=sha, **extra)
        ledger["runs"][run_key(e)] = e

    for r in runs(c, chk1):
        rec(chk1, r, "passed")
    r_bad, *rest = runs(c, chk2)
    rec(chk2, r_bad, "failed", example="x=array([[3.0]])")
    for r in rest:
        rec(chk2, r, "passed", sha="0" * 64)  # recorded against an older contract text
    mut = next(m for m in c.mutants if m.obligation == "SM-INV-001")
    e = dict(contract=c.id, mutant=mut.id, outcome="killed", killed_by=chk1.id,
             sha256=c.sha256)
    ledger["mutants"][mutant_key(e)] = e

    cov = compute([c], ledger)
    page = _page([c], cov, c.id)
    assert 'fs-covered">covered' in _row(page, "SM-INV-001")
    assert 'fs-failing">failing' in _row(page, "SM-BND-001")
    assert 'fs-killed">killed' in _row(page, mut.id) and chk1.id in _row(page, mut.id)
    sec = _section(page, chk2.id)
    assert "`x=array([[3.0]])`" in sec
    assert 'fs-stale">stale' in sec and 'fs-failed">failed' in sec
    assert "fs-passed" not in sec  # a stale pass is not shown as passed
    index = render_site([c], cov)["docs/contracts/index.md"]
    assert f"Overall: 1/{len(c.obligations)} obligations covered" in index


def test_index_diagram_leaves_isolated_contracts_to_a_list():
    """The index draws the dependency edges left to right, layer by layer; a contract with no
    edge is linked in a sentence below it instead of widening the diagram."""
    contracts = load_all([ROOT / "falsify" / "contracts"]).contracts
    views = {c.id: docs.adapt_coverage(None, c) for c in contracts}
    index = docs.index_page(sorted(contracts, key=lambda c: c.id), views, None)
    diagram = index.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert diagram.startswith("graph LR\n  subgraph kernels")
    assert '["softmax-kernel-v1"]' not in diagram and '["train-loop-v1"]' in diagram
    assert "[softmax-kernel-v1](softmax-kernel-v1.md)" in index.split("```mermaid", 1)[1]
