"""`falsify mutate`: the operators make the bugs they name, a mutant runs only the checks that
reach its function, the user's file is served mutated without being edited, and a fresh
`falsify init` project gets an honest report: a kill, a survivor with its diff, a function no
check reaches, and exit 1 for the survivor.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import falsify
from falsify.cli import main
from falsify.cli.mutate import _changed_functions, _mutants, _target_modules
from falsify.cli.mutate_report import summary
from falsify.errors import UsageError
from falsify.harness import fingerprint
from falsify.harness.model import load_contract
from falsify.harness.mutation_apply import MutantFinder, install
from falsify.harness.mutation_ops import mutants_of_source, splice
from falsify.harness.mutation_select import reach
from falsify.harness.project import library_dir

STEP = '''import torch


class Trainer:
    def step(self, x, n=3):
        """One step."""
        self.model.eval()
        with torch.no_grad():
            y = self.model(x.detach())
        if n < 2:
            return torch.cat(x, y)
        return y * n
'''


def _by(source: str, description: str) -> str:
    found = [m for m in mutants_of_source("m", source) if m.description == description]
    assert len(found) == 1, [m.description for m in mutants_of_source("m", source)]
    return found[0].source


def _src(text: str) -> str:
    return ast.unparse(ast.parse(textwrap.dedent(text)))


def test_dropped_no_grad_detach_eval_and_off_by_one():
    assert _by(STEP, "`with torch.no_grad():` replaced by its body") == _src('''
        def step(self, x, n=3):
            """One step."""
            self.model.eval()
            y = self.model(x.detach())
            if n < 2:
                return torch.cat(x, y)
            return y * n''')
    assert "self.model(x)" in _by(STEP, ".detach() removed")
    assert "x.detach()" not in _by(STEP, ".detach() removed")
    assert "eval" not in _by(STEP, "call `self.model.eval()` removed")
    assert "def step(self, x, n=4):" in _by(STEP, "3 -> 4")
    assert "def step(self, x, n=2):" in _by(STEP, "3 -> 2")
    assert "if n < 3:" in _by(STEP, "2 -> 3")
    assert "if n < 1:" in _by(STEP, "2 -> 1")


def test_operator_comparison_condition_argument_and_decorator_mutants():
    assert "return y / n" in _by(STEP, "* -> /")
    assert "if n <= 2:" in _by(STEP, "< -> <=")
    assert "if not n < 2:" in _by(STEP, "if condition negated")
    assert "torch.cat(y, x)" in _by(STEP, "arguments 1 and 2 of torch.cat() swapped")
    deco = "import torch\n\n\n@torch.no_grad()\ndef f(a, b):\n    return a ** b >= 0.5\n"
    assert _by(deco, "decorator @torch.no_grad() removed") == \
        "def f(a, b):\n    return a ** b >= 0.5"
    assert "a * b" in _by(deco, "** -> *")
    assert "a ** b > 0.5" in _by(deco, ">= -> >")
    assert "a ** b >= 0.505" in _by(deco, "0.5 -> 0.505")
    assert "return x if not flag else 0" in _by("def g(x, flag):\n    return x if flag else 0\n",
                                                "ternary condition negated")


def test_ids_are_stable_unique_and_the_docstring_is_left_alone():
    first = [m.id for m in mutants_of_source("pkg.mod", STEP)]
    assert first == [m.id for m in mutants_of_source("pkg.mod", STEP)]
    assert len(set(first)) == len(first)
    assert all(i.startswith("pkg.mod:Trainer.step:") for i in first)
    assert all('"""One step."""' in m.source for m in mutants_of_source("m", STEP))
    twice = "def f():\n    return 1\n\n\ndef f():\n    return 5\n"
    assert [m.description for m in mutants_of_source("m", twice)] == ["5 -> 6", "5 -> 4"]
    assert "1.5 -> 1.515" in {m.description for m in mutants_of_source("m", STEP.replace(
        "y * n", "y * 1.5"))}


def test_splice_replaces_only_the_method_at_its_indentation():
    m = next(m for m in mutants_of_source("m", STEP) if m.description == "* -> /")
    out = splice(STEP, m)
    assert out.startswith("import torch\n\n\nclass Trainer:\n    def step(self, x, n=3):\n")
    assert "        return y / n\n" in out
    assert ast.dump(ast.parse(out)) != ast.dump(ast.parse(STEP))
    assert ast.unparse(ast.parse(out)) == ast.unparse(ast.parse(STEP)).replace("y * n", "y / n")


def test_the_finder_serves_the_mutant_and_leaves_the_file(tmp_path, monkeypatch):
    f = tmp_path / "mut_served.py"
    f.write_text("def f():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = install({"module": "mut_served", "path": str(f), "source": "def f():\n    return 2\n"})
    try:
        import mut_served

        assert mut_served.f() == 2 and mut_served.__file__ == str(f)
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("mut_served", None)
    assert f.read_text() == "def f():\n    return 1\n"
    assert isinstance(finder, MutantFinder)
    with pytest.raises(RuntimeError, match="imported before the mutant"):
        install({"module": "json", "path": str(f), "source": ""})


KERN = '''from sel_helper import h


def f(x):
    return h(x) * 2.0


def g(x):
    return x + 1
'''


@pytest.fixture
def selection_project(tmp_path, monkeypatch):
    (tmp_path / "contracts").mkdir()
    (tmp_path / "falsify.toml").write_text('backends = ["reference", "torch"]\n')
    data = yaml.safe_load((library_dir() / "softmax-kernel-v1.yaml").read_text())
    eq = data["equations"]["softmax"]
    eq["bindings"].pop("triton")
    eq["bindings"]["torch"] = "sel_kern:f"
    (tmp_path / "contracts" / "sel-v1.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "sel_kern.py").write_text(KERN)
    (tmp_path / "sel_helper.py").write_text("def h(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)
    fingerprint.reset_cache()
    yield tmp_path
    fingerprint.reset_cache()


def test_selection_picks_only_the_checks_that_reach_the_function(selection_project):
    c, _ = load_contract(selection_project / "contracts" / "sel-v1.yaml")
    r = reach([c], ("reference", "torch"))
    executed = {t.id for t in c.checks if t.kind not in ("symbolic", "static")}
    torch_checks = {(c.id, t, "torch") for t in executed}
    assert r.checks("sel_kern", "f") == torch_checks  # the reference backend never calls f
    assert r.checks("sel_helper", "h") == torch_checks  # reached through f
    assert r.checks("sel_kern", "g") == set()  # a blind spot
    assert r.module_of(selection_project / "sel_kern.py") == "sel_kern"


def test_changed_keeps_only_functions_edited_since_the_ref(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    f = tmp_path / "kern.py"
    f.write_text(KERN)
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    f.write_text(KERN.replace("x + 1", "x + 2") + "\n\ndef k():\n    return 0\n")
    assert _changed_functions(f, "HEAD") == {"g", "k"}
    (tmp_path / "new.py").write_text("def n():\n    return 1\n")
    assert _changed_functions(tmp_path / "new.py", "HEAD") is None  # new: every function
    with pytest.raises(UsageError, match="--changed nosuchref"):
        _changed_functions(f, "nosuchref")
    targets = {"kern": f}
    kept = [m.id for m in _mutants(targets, "HEAD", None)]
    assert kept and all(i.split(":")[1] in ("g", "k") for i in kept)


def test_by_default_the_judge_is_not_mutated_but_a_named_module_is():
    """On falsify's own checkout every check reaches the harness and the probes on its way to
    the code it judges: they are not targets unless named; kernels, the loop and the
    references are."""
    root = Path(falsify.__file__).resolve().parent.parent

    class Proj:
        pass

    class Reach:
        files = {m: root / (m.replace(".", "/") + ".py") for m in (
            "falsify.harness.runtime", "falsify.probes.train_loop", "falsify.mutants.softmax",
            "falsify.proofs.rope", "falsify.cli.run", "falsify.bench.train",
            "falsify.kernels.torch.softmax", "falsify.llm.trainer", "falsify.reference.softmax",
            "falsify.harnessed")}

        @staticmethod
        def module_of(f):
            return next((m for m, p in Reach.files.items() if p == f), None)

    proj = Proj()
    proj.root = root
    assert set(_target_modules([], Reach, proj)) == {
        "falsify.kernels.torch.softmax", "falsify.llm.trainer", "falsify.reference.softmax",
        "falsify.harnessed"}
    named = _target_modules([str(Reach.files["falsify.harness.runtime"])], Reach, proj)
    assert list(named) == ["falsify.harness.runtime"]


def test_shards_partition_the_mutants(tmp_path):
    f = tmp_path / "kern.py"
    f.write_text(KERN)
    every = [m.id for m in _mutants({"kern": f}, None, None)]
    shards = [[m.id for m in _mutants({"kern": f}, None, (k, 3))] for k in (1, 2, 3)]
    assert sorted(sum(shards, [])) == sorted(every) and all(shards)
    assert not set(shards[0]) & set(shards[1])


def test_score_counts_only_mutants_the_checks_ran():
    rows = summary([{"module": "m", "status": s} for s in
                    ("killed", "killed", "killed", "survived", "not reached", "not run")])
    assert rows["m"]["generated"] == 6 and rows["m"]["not reached"] == 1
    assert rows["m"]["score"] == 0.75


REFERENCE = "import numpy as np\n\n\ndef mykernel(x):\n    return np.tanh(x)\n"
# `* 1.0 -> / 1.0` computes the same numbers (a survivor no check can kill), `1.0 -> 1.01` is
# a 1 % error (killed by parity), and `unused` is called by no check (not reached)
TORCH = ("import torch\n\n\ndef mykernel(x):\n    return torch.tanh(x) * 1.0\n\n\n"
         "def unused(a, b):\n    return a + b\n")


def _falsify(root: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FALSIFY_QUIET="1", PYTHONPATH=str(Path(falsify.__file__).parents[1]))
    return subprocess.run([sys.executable, "-m", "falsify", *argv], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


def _init_project(tmp_path: Path, monkeypatch, reference: str | None = REFERENCE) -> Path:
    """A fresh `falsify init --kernel mykernel` project with TORCH as its kernel, and the
    reference written unless `reference` is None (then it stays the stub)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "userpkg"\nversion = "0.1"\n')
    monkeypatch.chdir(root)
    assert main(["init", "--kernel", "mykernel"]) == 0
    if reference is not None:
        (root / "userpkg/mykernel_reference.py").write_text(reference)
    (root / "userpkg/mykernel.py").write_text(TORCH)
    return root


@pytest.mark.heavy
def test_mutate_kills_reports_survivors_and_blind_spots(tmp_path, monkeypatch):
    root = _init_project(tmp_path, monkeypatch)
    kernel = root / "userpkg/mykernel.py"
    before = kernel.read_bytes()
    proc = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--budget", "5",
                    "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a survivor fails the gate
    assert kernel.read_bytes() == before
    out = json.loads(proc.stdout)
    assert out["modules"]["userpkg.mykernel"] | {"score": None} == {
        "generated": 3, "killed": 1, "survived": 1, "timed out": 0, "equivalent": 0,
        "not reached": 1, "error": 0, "not run": 0, "score": None}
    assert out["modules"]["userpkg.mykernel"]["score"] == 0.5
    by = {e["id"]: e for e in out["mutants"]}
    killed = by["userpkg.mykernel:mykernel:constant:0"]
    assert killed["status"] == "killed"
    assert killed["killed_by"].startswith("mykernel-kernel-v1 FALSIFY-MYKERNEL-001 torch")
    survivor = by["userpkg.mykernel:mykernel:arith:0"]
    assert survivor["status"] == "survived"
    assert survivor["obligations"] == ["mykernel-kernel-v1 MYKERNEL-EQV-001"]
    assert by["userpkg.mykernel:unused:arith:0"]["status"] == "not reached"
    ledger = json.loads((root / ".falsify/ledger.json").read_text())
    assert set(ledger["mutations"]) == set(by) and ledger["runs"] == {}
    assert ledger["mutations"][survivor["id"]]["mutated"] == \
        "def mykernel(x):\n    return torch.tanh(x) / 1.0"

    # shard 1/3 is the `* -> /` mutant alone; under a one-second limit its run is cut off
    cut = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--shard", "1/3",
                   "--timeout", "1", "--format", "json")
    assert cut.returncode == 1, cut.stdout + cut.stderr
    assert [e["status"] for e in json.loads(cut.stdout)["mutants"]] == ["timed out"]

    # judged equivalent by a person, declared with the function's digest: reported as such,
    # not run, not scored, and no longer a failure
    (root / "equivalent-mutants.yaml").write_text(
        f"- mutant: {survivor['id']}\n  function_sha256: {survivor['function_sha256']}\n"
        "  reason: \"x / 1.0 and x * 1.0 are both x, exactly, in IEEE arithmetic\"\n")
    eq = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--shard", "1/3",
                  "--format", "json")
    assert eq.returncode == 0, eq.stdout + eq.stderr
    [e] = json.loads(eq.stdout)["mutants"]
    assert e["status"] == "equivalent" and e["reason"].startswith("x / 1.0 and x * 1.0")
    assert json.loads(eq.stdout)["modules"]["userpkg.mykernel"]["score"] is None
    # the function changes (here only its docstring): the judgement was about the old text,
    # so the mutant runs again, survives, and the report says whose declaration lapsed
    kernel.write_text(TORCH.replace("def mykernel(x):\n", 'def mykernel(x):\n    """tanh."""\n'))
    again = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--shard", "1/3")
    assert again.returncode == 1, again.stdout + again.stderr
    assert "survived: userpkg.mykernel:mykernel:arith:0" in again.stdout
    assert "declared equivalent at equivalent-mutants.yaml:1 for another version" in again.stdout
    assert "function_sha256: " in again.stdout  # the entry to paste, with the new digest


def test_equivalent_declarations_are_checked_field_by_field(tmp_path):
    from falsify.harness import equivalents

    f = tmp_path / "eq.yaml"
    assert equivalents.load(f, required=False) == {}
    with pytest.raises(UsageError, match="no such file"):
        equivalents.load(f, required=True)
    sha = "ab" * 32
    good = f"- mutant: m:f:arith:0\n  function_sha256: {sha}\n  reason: same\n"
    f.write_text(good)
    assert equivalents.load(f, required=True)["m:f:arith:0"].reason == "same"
    for text, why in [
            ("{a: 1}\n", r"eq.yaml:1: a list of declarations"),
            ("- 3\n", r"eq.yaml:1: entry 0: a mapping"),
            (good.replace("reason: same", "why: same"), r"eq.yaml:1: entry 0: unknown field 'why'"),
            (good.replace("  reason: same\n", ""), r"entry 0: no 'reason'"),
            (good.replace("reason: same", "reason: 3"), r"eq.yaml:3: entry 0: reason must be"),
            (good.replace(sha, "abc"), r"eq.yaml:2: entry 0: function_sha256 must be 64"),
            (good + good, r"eq.yaml:4: entry 1: m:f:arith:0 is declared twice \(first at line 1"),
            ("- [\n", r"eq.yaml:\d+: ")]:
        f.write_text(text)
        with pytest.raises(UsageError, match=why):
            equivalents.load(f, required=False)


def test_a_kill_counts_only_where_the_checks_pass_without_the_mutant(tmp_path, monkeypatch):
    """With the reference still the stub, every check fails on the real code too: the mutant
    is not 'killed' but an error that says so."""
    root = _init_project(tmp_path, monkeypatch, reference=None)
    proc = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--shard", "2/3",
                    "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [e] = json.loads(proc.stdout)["mutants"]
    assert e["status"] == "error" and "the checks fail without any mutant" in e["detail"]


def test_bad_flags_are_usage_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--kernel", "mykernel"]) == 0
    (tmp_path / "notes.txt").write_text("")
    for argv, needle in ((["--module", "notes.txt"], "--module notes.txt: not a Python file"),
                         (["--shard", "4/3"], "--shard '4/3'"),
                         (["--budget", "0"], "--budget 0"),
                         (["--format", "xml"], "invalid choice"),
                         (["nosuch-kernel-v1"], "no contract 'nosuch-kernel-v1'")):
        capsys.readouterr()
        assert main(["mutate", *argv]) == 2, argv
        assert needle in capsys.readouterr().err, argv


def test_mutations_merge_beside_runs_and_shards_combine(tmp_path):
    from falsify.harness import ledger

    run = {"contract": "c", "check": "k", "backend": "torch", "variant": "float32",
           "outcome": "passed"}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    ledger.merge([run], [], a)
    ledger.merge_mutations({"m:f:arith:0": {"status": "killed", "time": "1"}}, a)
    ledger.merge_mutations({"m:f:arith:1": {"status": "survived", "time": "1"}}, b)
    assert ledger.load(a)["runs"] == {ledger.run_key(run): run}
    both = ledger.combine([a, b])
    assert set(both["mutations"]) == {"m:f:arith:0", "m:f:arith:1"}
    ledger.merge_mutations({"m:f:arith:1": {"status": "killed", "time": "2"}}, a)
    with pytest.raises(ledger.LedgerConflict, match="m:f:arith:1"):
        ledger.combine([a, b])


def test_the_table_shows_counts_each_survivor_as_a_diff_and_the_blind_spots(capsys,
                                                                           monkeypatch):
    from falsify.cli.mutate_report import report

    monkeypatch.setenv("COLUMNS", "160")
    base = {"module": "pkg.k", "operator": "arith",
            "obligations": ["k-v1 K-EQV-001", "k-v1 K-INV-001", "loop-v1 L-001"],
            "original": "def f(x):\n    return x * 2", "mutated": "def f(x):\n    return x / 2",
            "function_sha256": "cd" * 32}
    report([{**base, "id": "pkg.k:f:arith:0", "function": "f", "status": "survived",
             "description": "* -> /"},
            {**base, "id": "pkg.k:f:constant:0", "function": "f", "status": "killed",
             "description": "2 -> 3"},
            {**base, "id": "pkg.k:g:arith:0", "function": "g", "status": "not reached",
             "description": "+ -> -"}], "table")
    out = capsys.readouterr().out
    assert ("│ pkg.k  │ 3         │ 1      │ 1        │ 0         │ 0          │ 1           │"
            in out)
    assert "50%" in out
    assert ("survived: pkg.k:f:arith:0 (* -> /); checks of k-v1 K-EQV-001, K-INV-001; "
            "loop-v1 L-001 ran it") in " ".join(out.split())
    assert "-    return x * 2\n+    return x / 2" in out
    assert f"- mutant: pkg.k:f:arith:0\n  function_sha256: {'cd' * 32}\n  reason: " in out
    assert "not reached by any check (1 function(s)): pkg.k:g" in out


def test_a_spent_budget_leaves_mutants_not_run_and_says_so(tmp_path, monkeypatch):
    """Without --module, the modules are the project's that a check reaches: the kernel (the
    reference has nothing to mutate), not falsify's own code nor the generated tests."""
    root = _init_project(tmp_path, monkeypatch)
    proc = _falsify(root, "mutate", "mykernel-kernel-v1", "--budget", "0.001")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text  # nothing survived: nothing ran
    assert "budget spent: 2 mutant(s) not run" in text
    assert "not reached by any check (1 function(s)): userpkg.mykernel:unused" in text
    entries = json.loads((root / ".falsify/ledger.json").read_text())["mutations"]
    assert sorted(e["status"] for e in entries.values()) == ["not reached", "not run", "not run"]
    assert {e["module"] for e in entries.values()} == {"userpkg.mykernel"}


def test_pv_audit_shows_the_mutation_score_beside_coverage_and_each_survivor():
    from falsify.harness import audit

    c, _ = load_contract(library_dir() / "softmax-kernel-v1.yaml")

    def rec(i, status, contract="softmax-kernel-v1"):
        return {"id": f"falsify.kernels.torch.softmax:softmax:arith:{i}", "status": status,
                "description": "- -> +",
                "checks": [f"{contract} FALSIFY-SM-001 torch float32"],
                "obligations": [f"{contract} SM-EQV-001"]}

    ledger = {"runs": {}, "mutants": {}, "mutations": {
        str(i): rec(i, s) for i, s in enumerate(
            ("killed", "killed", "killed", "survived", "equivalent", "not run"))}}
    ledger["mutations"]["other"] = rec(9, "survived", contract="rmsnorm-kernel-v1")
    lines, warnings = audit.mutation_lines(c, ledger)
    assert lines == ["mutation (falsify mutate): 6 mutant(s) its checks ran: 1 equivalent, "
                     "3 killed, 1 not run, 1 survived; score 75%"]
    assert warnings == ["mutant falsify.kernels.torch.softmax:softmax:arith:3 survived "
                        "(- -> +): SM-EQV-001 ran it and missed it"]
    full = audit.audit(c, ledger)
    assert lines[0] in full.chain and warnings[0] in full.warnings
    assert audit.mutation_lines(c, {"runs": {}})[0] == [
        "mutation (falsify mutate): no results for this contract's checks"]


def test_nothing_changed_since_the_ref_says_so_instead_of_an_empty_table(tmp_path):
    """CI's `falsify mutate --changed HEAD~1` after a commit that touched no judged function."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    (tmp_path / "falsify.toml").write_text('backends = ["reference"]\n')
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    r = subprocess.run([sys.executable, "-m", "falsify.cli", "mutate", "softmax-kernel-v1",
                        "--changed", "HEAD"], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, FALSIFY_QUIET="1"), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "falsify mutate: nothing to mutate:" in r.stdout and "since HEAD" in r.stdout, r.stdout
    assert "┏" not in r.stdout  # no empty table


def test_a_mutant_runs_its_likeliest_killers_first():
    """-x stops a mutant at its first failing check, so the order decides how long a kill
    takes: the checks that killed this function's earlier mutants, then the ones that call it
    by name, then the rest; within each, fastest first."""
    from falsify.cli.mutate import kill_order

    own = [("softmax-kernel-v1", f"FALSIFY-SM-00{i}", "torch") for i in (1, 2, 3)]
    other = [("attention-kernel-v1", f"FALSIFY-ATT-00{i}", "torch") for i in (1, 2)]
    seconds = {own[0]: 3.0, own[1]: 0.5, own[2]: 9.0, other[0]: 0.1, other[1]: 0.2}
    keep = set(own + other)
    assert kill_order(keep, [], set(own), seconds) == [own[1], own[0], own[2], *other]
    assert kill_order(keep, [own[2]], set(own), seconds) == [own[2], own[1], own[0], *other]
    assert kill_order(keep, [], set(), {}) == sorted(keep)  # nothing known: a stable order


@pytest.mark.heavy
def test_after_a_run_the_unmutated_checks_are_taken_from_the_ledger(tmp_path, monkeypatch):
    """`falsify run` just wrote current passes of every check the mutants need (as in CI, where
    the main job runs first): the unmutated run is not repeated, and the verdicts are those of
    a mutate run without that evidence (the heavy test above: one kill, one survivor)."""
    root = _init_project(tmp_path, monkeypatch)
    run = _falsify(root, "run", "mykernel-kernel-v1", "--no-mutants")
    assert run.returncode == 0, run.stdout + run.stderr
    proc = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    ran = [e for e in json.loads(proc.stdout)["mutants"] if e["status"] != "not reached"]
    assert sorted(e["status"] for e in ran) == ["killed", "survived"]
    assert {e["baseline"] for e in ran} == {"ledger"}
    # an edit to the kernel's code makes that evidence stale: the unmutated run happens again
    (root / "userpkg/mykernel.py").write_text(TORCH.replace("torch.tanh(x)", "torch.tanh(+x)"))
    again = _falsify(root, "mutate", "--module", "userpkg/mykernel.py", "--format", "json")
    ran = [e for e in json.loads(again.stdout)["mutants"] if "baseline" in e]
    assert ran and {e["baseline"] for e in ran} == {"run"}, again.stdout + again.stderr


@pytest.mark.parametrize("name", ["qlora-finetune-v1", "softmax-kernel-v1",
                                  "attention-kernel-v1"])
def test_the_selection_names_exactly_the_tests_the_generator_writes(name):
    """A check key is a generated test group: none for a backend its kind does not run on (a
    parity check on the reference, a training probe on triton), or no unmutated result in the
    ledger could ever stand for it."""
    from falsify.harness.plan import runs

    c, _ = load_contract(library_dir() / f"{name}.yaml")
    r = reach([c], ("reference", "torch", "triton", "z3", "crosshair"))
    keys = set().union(*r.names.values(), *r.whole.values())
    assert keys == {(c.id, t.id, x.backend) for t in c.checks if t.spec for x in runs(c, t)}
