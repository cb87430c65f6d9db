"""Every command that `falsify --help`, `pv --help` or the README offers runs, end to end, at its
smallest built-in settings, and does what it says (exit code, key line of output, files
written). `SMOKE` names the test that runs each command; a command without one fails
`test_every_command_has_a_smoke_test`, so a new verb cannot ship untried.

Commands run as a user runs them (`python -m falsify ...`, `python -m falsify.cli.pv ...`) from
a directory that is not this checkout, except the `pv` verbs, which run in-process through the
same parser (`falsify.cli.pv.main`) because they are quick and many.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from falsify.cli import build_parser as falsify_parser
from falsify.cli.pv import build_parser as pv_parser
from falsify.cli.pv import main as pv

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ROOT / "falsify" / "contracts"
HERE = "tests/test_cli_smoke.py"

SMOKE = {
    "falsify run": f"{HERE}::test_run_mutants_coverage_audit",
    "falsify mutants": f"{HERE}::test_run_mutants_coverage_audit",
    "falsify mutate": "tests/test_mutate.py::test_mutate_kills_reports_survivors_and_blind_spots",
    "falsify conformance":
        "tests/test_conformance.py::test_math_apart_from_policy_judged_as_declared",
    "falsify bench kernels": f"{HERE}::test_bench_kernels_quick_with_memory_children",
    "falsify bench train": "tests/test_train_bench.py::test_bench_train_runs_all_sides",
    "falsify bench finetune":
        "tests/test_finetune_bench.py::test_bench_finetune_table_with_memory_children",
    "falsify bench grpo": "tests/test_grpo.py::test_bench_grpo_times_both_sides",
    "falsify bench distributed":
        "tests/test_distributed.py::test_bench_distributed_counts_the_whole_gradient_once",
    "falsify bench self": "tests/test_bench_self.py::test_every_job_is_timed_beside_its_goal",
    "falsify train": f"{HERE}::test_train_config_file_then_resume_auto",
    "falsify distill": "tests/test_distill.py::test_distill_from_our_checkpoint",
    "falsify pipeline":
        "tests/test_pipeline.py::test_pipeline_runs_resumes_and_reruns_what_changed",
    "falsify finetune":
        "tests/test_defaults.py::test_the_verbs_on_the_built_in_base",
    "falsify merge": "tests/test_finetune_peft.py::"
                     "test_merge_cli_writes_both_layouts_that_match_base_plus_adapter",
    "falsify generate": "tests/test_finetune_peft.py::test_generate_cli_adapter_and_merged_agree",
    "falsify eval": "tests/test_eval.py::test_eval_cli_end_to_end",
    "falsify prune": "tests/test_prune.py::test_prune_cli_prunes_exactly_and_reports_perplexity",
    "falsify quantize": "tests/test_quantize_model.py::test_quantize_cli_and_perplexity_bound",
    "falsify export": "tests/test_finetune_peft.py::"
                      "test_export_cli_model_loads_in_transformers_with_its_tokenizer",
    "pv validate": f"{HERE}::test_pv_verbs",
    "pv status": f"{HERE}::test_pv_verbs",
    "pv graph": f"{HERE}::test_pv_verbs",
    "pv equations": f"{HERE}::test_pv_verbs",
    "pv diff": f"{HERE}::test_pv_verbs",
    "pv generate": f"{HERE}::test_pv_verbs",
    "pv coverage": f"{HERE}::test_run_mutants_coverage_audit",
    "pv audit": f"{HERE}::test_run_mutants_coverage_audit",
    "pv list": f"{HERE}::test_pv_verbs",
    "pv ledger merge": "tests/test_shard.py::test_merge_refuses_conflicts_and_names_both_files",
    "pv ledger stamp":
        "tests/test_docs_evidence.py::test_stamp_records_the_provenance_generate_then_accepts",
    "falsify init": "tests/test_init.py::test_scaffold_fails_on_the_stubs_then_goes_green",
    "falsify parity": "tests/test_parity.py::test_cli_json_plot_and_pass",
    "falsify soak":
        "tests/test_soak.py::test_soak_reports_a_failure_with_a_command_that_reproduces_it",
}


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> dict[str, str]:
    """Every leaf command of `parser` ("falsify bench kernels"), with its one-line help."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                deeper = _subcommands(sub, f"{prefix} {name}")
                out.update(deeper or {f"{prefix} {name}": helps[name]})
    return out


def _readme_commands() -> set[str]:
    text = (ROOT / "README.md").read_text()
    found = set()
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for m in re.finditer(r"(?:^|&&\s*)(falsify|pv)\s+([a-z]+)(?:\s+([a-z|]+))?", block,
                             re.M):
            prog, verb, sub = m.groups()
            if verb in ("bench", "ledger"):  # verbs with subcommands of their own
                found |= {f"{prog} {verb} {s}" for s in (sub or "").split("|")}
            else:
                found.add(f"{prog} {verb}")
    return found


def _run(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=cwd, env=dict(os.environ))
    return r


def test_every_command_has_a_smoke_test():
    commands = set(_subcommands(falsify_parser(), "falsify")) | set(
        _subcommands(pv_parser(), "pv"))
    assert "falsify bench kernels" in commands and "pv validate" in commands
    readme = _readme_commands()
    assert {"falsify run", "falsify bench train", "pv audit"} <= readme
    assert readme <= commands, f"the README shows commands that do not exist: {readme - commands}"
    missing = commands - set(SMOKE)
    assert not missing, f"commands without a smoke test (add one to SMOKE): {sorted(missing)}"
    for command, node in SMOKE.items():
        path, func = node.split("::")
        mod = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert callable(getattr(mod, func, None)), f"{command}: no test {node}"


def _verb_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The verbs directly under `parser`, with their one-line help."""
    return {a.dest: a.help for action in parser._actions
            if isinstance(action, argparse._SubParsersAction) for a in action._choices_actions}


def test_the_verb_index_says_what_the_modules_register():
    """`falsify` builds only the verb a command line runs and shows the others from INDEX; the
    index must list every verb, in order, with its module's own help."""
    from falsify.cli import INDEX, VERBS

    full = _verb_helps(falsify_parser())
    assert list(full.items()) == [(name, help_) for name, (_, help_) in INDEX.items()]
    for module in VERBS:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert sorted(sub.choices) == sorted(n for n, (m, _) in INDEX.items() if m == module)


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["init", "--help"],
                                  ["soak", "--help"]])
def test_a_light_verb_does_not_import_torch(argv):
    """Only the verb a command line runs is built: `falsify --help` and the verbs that need no
    model start without importing torch (seconds), which `falsify run --changed` pays when
    nothing changed."""
    code = (f"import sys\nfrom falsify.cli import main\ntry:\n    main({argv!r})\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, cwd=ROOT.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False", r.stdout[-500:]
    assert "usage: falsify" in r.stdout


def _help(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_verb_on_one_line(tmp_path, capsys, monkeypatch):
    """`falsify --help` (as a user runs it), `falsify bench --help` and `pv --help` name every
    verb with its help on the verb's own line, in an 80-column terminal."""
    from falsify.cli import main as falsify

    monkeypatch.setenv("COLUMNS", "80")
    r = _run("falsify", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    bench = next(a.choices["bench"] for a in falsify_parser()._actions
                 if isinstance(a, argparse._SubParsersAction))
    for text, parser in ((r.stdout, falsify_parser()),
                         (_help(falsify, ["bench", "--help"], capsys), bench),
                         (_help(pv, ["--help"], capsys), pv_parser())):
        verbs = _verb_helps(parser)
        assert len(verbs) >= 3
        for verb, help_ in verbs.items():
            assert re.search(rf"^\s+{verb}\s+{re.escape(help_)}$", text, re.M), \
                f"no one-line entry for {verb!r}:\n{text}"
    assert {"run", "mutants", "bench", "train", "finetune", "merge", "generate"} <= set(
        _verb_helps(falsify_parser()))


def _parsers(parser, prog=""):
    """(prog, parser) for `parser` and every subcommand under it."""
    yield prog, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _parsers(sub, f"{prog} {name}".strip())


def test_descriptions_taken_from_docstrings_end_where_their_paragraph_ends():
    """A `--help` description cut from a module docstring is its first paragraph, whole: not
    its first line, which stops mid-sentence wherever the docstring wraps."""
    import pkgutil

    import falsify.bench
    import falsify.cli

    one = lambda t: " ".join(t.split())  # noqa: E731
    paragraphs = []
    for pkg in (falsify.cli, falsify.bench):
        for m in pkgutil.iter_modules(pkg.__path__):
            if m.name == "__main__":
                continue
            doc = importlib.import_module(f"{pkg.__name__}.{m.name}").__doc__ or ""
            paragraphs += [one(p) for p in doc.split("\n\n") if p.strip()]
    cut = []
    for top, parser in (("falsify", falsify_parser()), ("pv", pv_parser())):
        for prog, p in _parsers(parser, top):
            d = one(p.description or "")
            cut += [f"{prog}: {d!r}" for para in paragraphs
                    if d and para.startswith(d) and para != d]
    assert not cut, "descriptions cut mid-paragraph:\n" + "\n".join(cut)


def test_usage_errors_are_one_line_exit_2(capsys):
    from falsify.cli import main as falsify

    for main, args, says in ((falsify, ["bogus"], "invalid choice: 'bogus'"),
                             (falsify, ["bench"], "usage: falsify bench"),
                             (falsify, ["bench", "kernels", "--bogus"],
                              "falsify bench kernels: unrecognized arguments: --bogus"),
                             (falsify, ["generate", "--prompt-file", "/nonexistent/p.txt",
                                        "--model", "x"], "No such file or directory"),
                             (pv, ["status", "--strict", "--compat"], "exclusive")):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, (args, err)


def test_pv_verbs(tmp_path, capsys):
    """The README's tour of `pv`, on this repository's contracts."""
    def run(*args):
        rc = pv(list(args))
        return rc, capsys.readouterr().out

    rc, out = run("validate", str(CONTRACTS))
    assert rc == 0 and re.search(r"^0 error\(s\), \d+ warning\(s\) in \d+ contract\(s\)$", out,
                                 re.M)
    rc, out = run("status", str(CONTRACTS))
    assert rc == 0 and re.search(r"^softmax-kernel-v1\s+library\s+\d+\.\d+\.\d+\s+native", out,
                                 re.M)
    rc, out = run("graph", str(CONTRACTS), "--format", "mermaid")
    assert rc == 0 and out.startswith("graph TD") and '["softmax-kernel-v1"]' in out
    rc, out = run("equations", str(CONTRACTS / "softmax-kernel-v1.yaml"), "--format", "latex")
    assert rc == 0 and "\\section*{softmax-kernel-v1}" in out
    # a new contract version that drops a mutant without a major bump is refused (exit 1)
    old = CONTRACTS / "softmax-kernel-v1.yaml"
    new = tmp_path / "softmax-kernel-v1.yaml"
    new.write_text(old.read_text().replace("MUT-SM-004", "MUT-SM-004x"))
    rc, out = run("diff", str(old), str(new))
    assert rc == 1 and "mutant removed" in out and "required bump: major" in out
    rc, out = run("diff", str(old), str(old))
    assert rc == 0 and "no changes" in out
    rc, out = run("list")
    assert rc == 0 and re.search(r"^softmax-kernel-v1\s", out, re.M)
    rc, out = run("generate", str(CONTRACTS), "--check")
    assert rc == 0 and "generated files are up to date" in out
    gen = tmp_path / "gen"
    rc, out = run("generate", str(old), "--out", str(gen), "--no-docs")
    assert rc == 0 and (gen / "test_softmax_kernel_v1.py").is_file()
    assert re.search(r"^\d+ test module\(s\) changed, \d+ in all; 0 docs page", out, re.M)


@pytest.mark.heavy
def test_run_mutants_coverage_audit(tmp_path, capsys):
    """`falsify run` (plain and with --bind), `falsify mutants`, then `pv coverage` and `pv audit`
    on the ledger they wrote (never the project's own ledger)."""
    ledger = tmp_path / "ledger.json"
    # a project of its own: library contracts only, its generated tests and ledger in tmp_path
    (tmp_path / "contracts").mkdir()
    (tmp_path / "falsify.toml").write_text('generated = "gen"\nledger = "ledger.json"\n')
    r = _run("falsify", "run", "softmax-kernel-v1", "--backend", "reference", "-n", "1",
             "--no-mutants", "--ledger", str(ledger), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mutants not run" in r.stdout + r.stderr
    assert ledger.is_file()
    bound = tmp_path / "ledger-bind.json"
    r = _run("falsify", "run", "softmax-kernel-v1", "--backend", "torch", "-n", "1",
             "--bind", "softmax.torch=falsify.kernels.torch.softmax:softmax",
             "--ledger", str(bound), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    entries = json.loads(bound.read_text())["runs"].values()
    assert any(e["backend"] == "torch" and e["outcome"] == "passed" for e in entries)
    r = _run("falsify", "mutants", "softmax-kernel-v1", "-n", "1", "--ledger", str(ledger),
             cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"mutants: (\d+) of \1 killed", r.stdout)

    contract = str(CONTRACTS / "softmax-kernel-v1.yaml")
    assert pv(["coverage", contract, "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"^coverage: (\d+)/(\d+) obligations covered", out, re.M)
    assert m and 0 < int(m[1]) <= int(m[2])
    if int(m[1]) < int(m[2]):  # reference only: the torch/triton obligations are not run
        assert pv(["coverage", contract, "--ledger", str(ledger), "--min", "100"]) == 1
        assert "is below --min 100%" in capsys.readouterr().out
    rc = pv(["audit", contract, "--ledger", str(ledger)])
    out = capsys.readouterr().out
    gaps = out.count("GAP ")
    assert rc == (1 if gaps else 0) and "softmax-kernel-v1" in out


@pytest.mark.heavy
def test_bench_kernels_quick_with_memory_children(tmp_path):
    """`falsify bench kernels --quick` on a few kernels (every case with its memory children
    would take many minutes: each child imports torch), its peak memory measured in the child
    process (`python -m falsify bench kernels --measure ...`), which must find every case the
    parent timed. The S = 2048 attention row is the memory claim of the tiled kernel: the naive
    side materialises [H, S, S] fp32 scores (64 MiB), the tiled side one [128, 128] tile."""
    only = "softmax,attention,fused_linear_cross_entropy"
    r = _run("falsify", "bench", "kernels", "--quick", "--only", only, "--repeats", "1",
             "--format", "json", cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    from falsify.bench.kernels import cases

    subs = only.split(",")
    assert [(x["kernel"], x["shape"], x["pass"]) for x in rows] == [
        c.key for c in cases(quick=True) if any(s in c.kernel for s in subs)]
    assert {"fused_linear_cross_entropy", "attention", "softmax"} == {x["kernel"] for x in rows}
    for x in rows:
        assert x["ours_ms"] > 0 and x["base_ms"] > 0
        assert x["time_ratio"] == pytest.approx(x["ours_ms"] / x["base_ms"])
        assert x["ours_peak_mb"] >= 0 and x["base_peak_mb"] > 0
    (s2048,) = [x for x in rows if x["kernel"] == "attention" and x["size"] == "S=2048"]
    assert s2048["base_peak_mb"] >= 64 and s2048["ours_peak_mb"] < s2048["base_peak_mb"] / 4


def test_train_config_file_then_resume_auto(tmp_path):
    """`falsify train --config FILE --max-steps 2`, then `falsify train --resume auto` of the
    same run given the old key=value form: the second finds the finished run and does no more
    steps, and says once which flags replace key=value."""
    import yaml

    out = tmp_path / "run"
    # the smallest run that trains, evaluates and checkpoints: a 2-layer model of width 64 on
    # synthetic tokens
    cfg = {"model": "tiny", "vocab_size": 512, "hidden_size": 64, "num_layers": 2,
           "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192, "seq_len": 32,
           "corpus": "synthetic", "synthetic_tokens": 60_000, "batch_size": 4, "grad_accum": 2,
           "lr": 3e-3, "lr_min": 3e-4, "eval_interval": 2, "eval_batches": 2,
           "save_interval": 2, "progress": False, "sample_tokens": 0, "threads": 1,
           "out_dir": str(out)}
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(cfg))
    r = _run("falsify", "train", "--config", "my.yaml", "--max-steps", "2", "--warmup-steps", "0",
             cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "note:" not in r.stderr
    assert re.search(r"trained 2 steps, [\d,]+ tokens", r.stdout)
    assert re.search(r"validation loss \d+\.\d+, perplexity \d+\.\d+", r.stdout)
    from falsify.llm.checkpoint import latest_checkpoint

    assert latest_checkpoint(out).name == "step-00000002"
    r = _run("falsify", "train", "--config", "my.yaml", "max_steps=2", "warmup_steps=0",
             "--resume", "auto", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout and "trained 2 steps" in r.stdout
    assert r.stderr.count("note: key=value is the old form, kept for this release: use "
                          "--max-steps 2 --warmup-steps 0") == 1
    # the run exports to the HF layout; a synthetic-corpus run has no tokenizer, and says so
    r = _run("falsify", "export", "run", "--out", "hf", cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "trained on the synthetic corpus" in r.stdout and "bit-identical" in r.stdout
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 512
    assert not (tmp_path / "hf" / "tokenizer.json").exists()



def test_finetune_overrides_may_come_between_flags():
    """`falsify finetune lr=1e-3 --rank 8 seed=1`: key=value overrides before, between and
    after the flags all reach the command (the verb's parser is intermixed)."""
    args = falsify_parser().parse_args(["finetune", "lr=1e-3", "--rank", "8", "seed=1",
                                        "--data", "a.jsonl", "batch_size=2"])
    assert args.overrides == ["lr=1e-3", "seed=1", "batch_size=2"]
    assert (args.lora_r, args.data, args.func.__name__) == ("8", ["a.jsonl"], "cmd_finetune")


def test_finetune_help_names_the_methods_and_how_to_run_dpo(capsys, monkeypatch):
    """`falsify finetune --help` lists --method's choices and says how DPO runs (preference
    pairs as --data, no method of its own); a method outside them is the config's one-line
    error naming the field, exit 2, as `method=dpo` is."""
    from falsify.cli import main as falsify

    monkeypatch.setenv("COLUMNS", "100")
    text = " ".join(_help(falsify, ["finetune", "--help"], capsys).split())
    assert "{lora,qlora,grpo}" in text
    assert re.search(r"DPO[^.]*\"chosen\"[^.]*\"rejected\"", text), text
    assert "--method {lora,qlora,grpo} config field" not in text  # more than the field name
    assert falsify(["finetune", "--method", "dpo"]) == 2
    said = capsys.readouterr()
    assert "config field method='dpo': must be lora, qlora or grpo" in said.out + said.err
