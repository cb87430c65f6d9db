"""Projects: discovery of [tool.falsify] / falsify.toml, the one id space of library and project
contracts, a contract outside the library run end to end, and the mixed-checkout guard.

Every workspace is a temporary project (a falsify.toml in tmp_path); the commands run in
subprocesses from it, as a user would type them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import falsify
from falsify.cli.common import UsageError
from falsify.harness import ledger
from falsify.harness.project import (
    ProjectError,
    find_project,
    id_space,
    library_dir,
    load,
    require_project,
)

PACKAGE = Path(falsify.__file__).resolve().parent


def _snapshot(d: Path) -> dict:
    return {p: p.stat().st_mtime_ns for p in d.rglob("*") if "__pycache__" not in p.parts}


def sh(cwd, *args, timeout=600):
    env = dict(os.environ, FALSIFY_QUIET="1", CI="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ discovery


def test_walks_up_to_the_nearest_declaration_and_resolves_paths_from_it(tmp_path):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""\
        [project]
        name = "user"
        [tool.falsify]
        contracts = ["spec", "more/spec"]
        ledger = "out/ledger.json"
        profile = "thorough"
        """))
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    p = find_project(deep)
    assert p.root == tmp_path.resolve()
    assert p.source == (tmp_path / "pyproject.toml").resolve()
    assert p.contract_dirs == (tmp_path.resolve() / "spec", tmp_path.resolve() / "more" / "spec")
    assert p.ledger_path == tmp_path.resolve() / "out" / "ledger.json"
    assert p.generated_dir == tmp_path.resolve() / "tests" / "generated"  # the default
    assert p.docs_dir == tmp_path.resolve() / "site" / "docs" / "contracts"
    assert p.profile == "thorough" and p.backends == ("reference", "torch", "triton")

    # a nearer falsify.toml wins; keys at top level
    (tmp_path / "a" / "falsify.toml").write_text('generated = "gen"\n')
    p = find_project(deep)
    assert p.root == (tmp_path / "a").resolve()
    assert p.generated_dir == (tmp_path / "a" / "gen").resolve()


def test_an_edited_project_file_is_read_again_in_the_same_process(tmp_path):
    """find_project is asked for the project once per check fingerprint, so a process keeps
    what it read; an edit (or a fix of a bad key) must still be seen, as the text decides."""
    (tmp_path / "falsify.toml").write_text('profile = "fast"\n')
    assert find_project(tmp_path).profile == "fast"
    (tmp_path / "falsify.toml").write_text('profile = "thorough"\n')
    assert find_project(tmp_path).profile == "thorough"
    (tmp_path / "falsify.toml").write_text('profle = "fast"\n')
    with pytest.raises(ProjectError, match="profle"):
        find_project(tmp_path)
    with pytest.raises(ProjectError, match="profle"):  # an error is not kept as a project
        find_project(tmp_path)
    (tmp_path / "falsify.toml").write_text('profile = "fast"\n')
    assert find_project(tmp_path).profile == "fast"


def test_a_pyproject_without_the_table_is_not_a_project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load(tmp_path / "pyproject.toml") is None
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "falsify.toml").unlink(missing_ok=True)
    # nothing above tmp_path declares one either (tmp dirs live outside any project)
    assert find_project(inner) is None or find_project(inner).root not in (
        tmp_path.resolve(), inner.resolve())


@pytest.mark.parametrize("body, names", [
    ('contract = ["x"]\n', ["falsify.toml", "unknown key 'contract'"]),
    ('profile = "slow"\n', ["falsify.toml", "profile", "'slow'"]),
    ('backends = "torch"\n', ["falsify.toml", "backends", "not of type 'array'"]),
    ('overrides = [1]\n', ["falsify.toml", "overrides.0"]),
    ('ledger = \n', ["falsify.toml", "not valid TOML"]),
])
def test_bad_keys_are_errors_naming_the_file_and_the_key(tmp_path, body, names):
    (tmp_path / "falsify.toml").write_text(body)
    with pytest.raises(ProjectError) as e:
        find_project(tmp_path)
    for n in names:
        assert n in str(e.value)


def test_bad_key_in_pyproject_names_the_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.falsify]\ngenerate = 'x'\n")
    with pytest.raises(ProjectError, match=r"pyproject.toml: unknown key 'tool.falsify.generate'"):
        find_project(tmp_path)
    r = sh(tmp_path, "falsify.cli.pv", "status")
    assert r.returncode == 2 and "unknown key" in r.stderr and "Traceback" not in r.stderr


def test_no_project_names_falsify_init_and_read_only_verbs_still_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if find_project() is not None:
        pytest.skip("a project is declared above the temporary directory")
    with pytest.raises(UsageError, match=r"no falsify.toml.*falsify init") as e:
        require_project("falsify run")
    assert str(tmp_path) in str(e.value)
    r = sh(tmp_path, "falsify.cli", "run", "softmax-kernel-v1")
    assert r.returncode == 2 and "falsify init" in r.stderr, r.stderr
    assert sh(tmp_path, "falsify.cli.pv", "generate").returncode == 2
    # read-only verbs work on the files given (and on the library by default)
    c = tmp_path / "x-kernel-v1.yaml"
    c.write_text((library_dir() / "gelu-kernel-v1.yaml").read_text())
    r = sh(tmp_path, "falsify.cli.pv", "validate", str(c))
    assert r.returncode == 0, r.stdout + r.stderr
    r = sh(tmp_path, "falsify.cli.pv", "status", str(c))
    assert r.returncode == 0 and "x-kernel-v1" in r.stdout
    assert sh(tmp_path, "falsify.cli.pv", "list").returncode == 0
    assert list(tmp_path.iterdir()) == [c]  # nothing written


def test_this_repository_is_a_project_like_any_other():
    repo = Path(__file__).resolve().parents[1]
    p = find_project(repo)
    assert p.source == repo / "pyproject.toml"
    assert p.contract_dirs == (library_dir(),)
    assert p.generated_dir == repo / "tests" / "generated"
    assert p.ledger_path == repo / ".falsify" / "ledger.json"
    assert p.docs_dir == repo / "site" / "docs" / "contracts"
    assert all(e.origin == "library" for e in id_space(p).values())  # same files: no clash


# ------------------------------------------------------------------------------ id space


def _project(tmp_path, toml: str = "") -> Path:
    (tmp_path / "contracts").mkdir()
    (tmp_path / "falsify.toml").write_text(toml)
    return tmp_path


def _copy(src_id: str, dest: Path, new_id: str, edit=None) -> Path:
    data = yaml.safe_load((library_dir() / f"{src_id}.yaml").read_text())
    if edit:
        edit(data)
    p = dest / f"{new_id}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return p


def test_library_and_project_share_one_id_space(tmp_path):
    proj = _project(tmp_path)
    # a project contract depending on a library contract
    _copy("gelu-kernel-v1", proj / "contracts", "mygelu-kernel-v1",
          lambda d: d["metadata"].update(depends_on=["softmax-kernel-v1"]))
    space = id_space(find_project(proj))
    assert space["mygelu-kernel-v1"].origin == "project"
    assert space["softmax-kernel-v1"].origin == "library"
    r = sh(proj, "falsify.cli.pv", "validate")
    assert r.returncode == 0, r.stdout + r.stderr
    r = sh(proj, "falsify.cli.pv", "graph")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mygelu-kernel-v1  <- softmax-kernel-v1" in r.stdout
    r = sh(proj, "falsify.cli.pv", "status", "--format", "json")
    rows = {c["id"]: c["origin"] for c in json.loads(r.stdout)["contracts"]}
    assert rows["mygelu-kernel-v1"] == "project" and rows["softmax-kernel-v1"] == "library"
    # a bare library id resolves from the project
    r = sh(proj, "falsify.cli.pv", "status", "softmax-kernel-v1", "--format", "json")
    assert '"origin": "library"' in r.stdout


def test_a_project_contract_with_a_library_id_is_an_error_unless_it_overrides(tmp_path):
    proj = _project(tmp_path)
    mine = _copy("gelu-kernel-v1", proj / "contracts", "gelu-kernel-v1")
    r = sh(proj, "falsify.cli.pv", "status")
    assert r.returncode == 2
    assert str(mine) in r.stderr and str(library_dir() / "gelu-kernel-v1.yaml") in r.stderr
    assert "overrides" in r.stderr
    (proj / "falsify.toml").write_text('overrides = ["gelu-kernel-v1"]\n')
    r = sh(proj, "falsify.cli.pv", "status")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("gelu-kernel-v1 "))
    assert "overrides library" in line
    assert id_space(find_project(proj))["gelu-kernel-v1"].path == mine.resolve()
    # a file elsewhere with a taken id would be filed under the other file's results
    stray = _copy("softmax-kernel-v1", tmp_path, "softmax-kernel-v1")
    r = sh(proj, "falsify.cli", "run", str(stray))
    assert r.returncode == 2
    assert str(stray) in r.stderr and str(library_dir() / "softmax-kernel-v1.yaml") in r.stderr


def test_the_same_id_in_two_named_directories_is_an_error_naming_both(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    pa = _copy("gelu-kernel-v1", a, "x-kernel-v1")
    pb = _copy("gelu-kernel-v1", b, "x-kernel-v1")
    r = sh(tmp_path, "falsify.cli.pv", "validate", str(a), str(b))
    assert r.returncode == 2
    assert "x-kernel-v1" in r.stderr and str(pa) in r.stderr and str(pb) in r.stderr


def test_pv_list_shows_the_library(tmp_path):
    r = sh(tmp_path, "falsify.cli.pv", "list")
    assert r.returncode == 0, r.stderr
    for p in library_dir().glob("*.yaml"):
        assert p.stem in r.stdout
    assert "complete" in r.stdout


# ------------------------------------------------------------------------------ end to end


def _without_triton(data: dict) -> None:
    for eq in data["equations"].values():
        eq.get("bindings", {}).pop("triton", None)
    data["mutants"] = [m for m in data["mutants"] if not m["replaces"].endswith(".triton")]
    n = len(data["mutants"])
    data["qa_gate"]["pass_criteria"] = (f"All {len(data['falsification_tests'])} falsification "
                                        f"tests pass and all {n} mutants are killed")


@pytest.mark.heavy
def test_a_contract_outside_the_library_runs_end_to_end(tmp_path):
    """softmax-kernel-v1 under a new id in a project of its own (Triton bindings dropped: the
    interpreter is slow): run → ledger → coverage → audit, nothing written in the package."""
    before = _snapshot(PACKAGE) | _snapshot(library_dir())
    proj = _project(tmp_path, 'generated = "checks"\nledger = "results/ledger.json"\n')
    path = _copy("softmax-kernel-v1", proj / "contracts", "mysoftmax-kernel-v1",
                 _without_triton)
    r = sh(proj, "falsify.cli", "run", "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    # SM-DEV-001 (device consistency) needs a GPU: listed apart, not counted, never covered
    n = len(yaml.safe_load(path.read_text())["proof_obligations"]) - 1
    summary = " ".join(r.stdout.split())
    assert f"coverage: {n}/{n} obligations covered" in summary, summary
    assert "1 obligation(s) need a GPU" in summary
    gen = proj / "checks" / "test_mysoftmax_kernel_v1.py"
    assert 'rt.contract_file(__file__, "../contracts/mysoftmax-kernel-v1.yaml"' in gen.read_text()
    data = ledger.load(proj / "results" / "ledger.json")
    assert {e["contract"] for e in data["runs"].values()} == {"mysoftmax-kernel-v1"}
    assert len(data["runs"]) == gen.read_text().count("@pytest.mark.falsify(")
    assert {e["outcome"] for e in data["mutants"].values() if e["mutant"] != "MUT-SM-005"} \
        == {"killed"}
    assert data["mutants"]["mysoftmax-kernel-v1|MUT-SM-005"]["outcome"] == "skipped"
    r = sh(proj, "falsify.cli.pv", "coverage", "--min", "100")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"mysoftmax-kernel-v1  {n}/{n} obligations covered" in r.stdout
    r = sh(proj, "falsify.cli.pv", "audit", "mysoftmax-kernel-v1")
    assert "obligation SM-INV-001 (invariant): covered" in r.stdout, r.stdout
    assert "not-run" not in r.stdout and "stale" not in r.stdout
    # the same contract run from another directory of the project, by path
    sub = proj / "sub"
    sub.mkdir()
    r = sh(sub, "falsify.cli", "run", str(path), "--no-mutants", "--backend", "reference",
           "-k", "SM_001")
    assert r.returncode == 0, r.stdout + r.stderr
    after = _snapshot(PACKAGE) | _snapshot(library_dir())
    assert after == before, "something was written inside the installed package"


BROKEN_MUTANTS = textwrap.dedent("""
    import torch


    def needs_a_dim(x, dim):  # written for f(x, dim); the kernel is called as f(x)
        return torch.softmax(x, dim)


    def calls_the_kernel_wrongly(x):  # a bug inside: the kernel takes one argument
        from falsify.kernels.torch.softmax import softmax

        return softmax(x, -1)
""")


def test_a_mutant_that_dies_of_its_own_signature_is_broken_not_killed(tmp_path):
    """A mutant whose own function cannot be called as the implementation is called fails every
    check with a TypeError before its bug runs: that "kill" proves nothing about the checks, so
    the run says the mutant is broken and fails. A TypeError raised inside the implementation
    the mutant calls is a bug the checks caught, and stays a kill."""
    proj = _project(tmp_path, 'ledger = "ledger.json"\n')
    (proj / "brokenmut.py").write_text(BROKEN_MUTANTS)

    def edit(data):
        _without_triton(data)
        data["mutants"][0]["with"] = "brokenmut:needs_a_dim"
        data["mutants"][1]["with"] = "brokenmut:calls_the_kernel_wrongly"
    _copy("softmax-kernel-v1", proj / "contracts", "mysoftmax-kernel-v1", edit)
    first, second = (m["id"] for m in yaml.safe_load(
        (proj / "contracts" / "mysoftmax-kernel-v1.yaml").read_text())["mutants"][:2])
    k = " or ".join(f"mut_{m.split('-', 1)[1].lower().replace('-', '_')}" for m in (first, second))
    r = sh(proj, "falsify.cli", "run", "-k", k)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 1, out
    assert f"MUTANT ERROR mysoftmax-kernel-v1 {first}" in out
    assert f"{first} is broken, not killed: brokenmut:needs_a_dim was called with arguments " \
        "its signature does not take" in out
    muts = ledger.load(proj / "ledger.json")["mutants"]
    assert muts[f"mysoftmax-kernel-v1|{first}"]["outcome"] == "error"
    assert muts[f"mysoftmax-kernel-v1|{second}"]["outcome"] == "killed"
    assert "softmax() takes 1 positional argument" in \
        muts[f"mysoftmax-kernel-v1|{second}"]["kill_message"]


def test_a_generated_module_refuses_a_contract_changed_since(tmp_path):
    proj = _project(tmp_path)
    path = _copy("gelu-kernel-v1", proj / "contracts", "mygelu-kernel-v1")
    r = sh(proj, "falsify.cli.pv", "generate", "--no-docs")
    assert r.returncode == 0, r.stdout + r.stderr
    r = sh(proj, "pytest", "tests/generated", "-p", "no:cacheprovider", "--collect-only", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    path.write_text(path.read_text() + "\n# edited\n")
    r = sh(proj, "pytest", "tests/generated", "-p", "no:cacheprovider", "--collect-only", "-q")
    assert r.returncode != 0
    assert "changed since its test module was generated" in r.stdout + r.stderr


def test_docs_pages_name_a_project_contract_by_its_project_path(tmp_path, monkeypatch):
    from falsify.harness import docs
    from falsify.harness.runtime import load

    proj = _project(tmp_path)
    path = _copy("gelu-kernel-v1", proj / "contracts", "mygelu-kernel-v1")
    monkeypatch.chdir(proj)
    pages = docs.render_site([load(path)])
    page = next(text for name, text in pages.items() if "mygelu" in name)
    assert "`contracts/mygelu-kernel-v1.yaml`" in page
    assert str(tmp_path) not in "".join(pages.values())  # no path of the building machine
