"""GRPO fine-tuning (falsify/llm/grpo.py, falsify/llm/rewards.py): config errors name their field,
a user's `module:function` reward is loaded and called, reward failures are counted and never
scored silently, the top-p filter keeps exactly the nucleus, the unit-test reward counts
asserts, and `falsify finetune --method grpo` runs end to end at its smallest settings. The
loop's obligations (frozen reference, old log-probs once per batch, seeded runs, reward
failures in the loop) are falsify/contracts/grpo-finetune-v1.yaml's."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch

from falsify.llm import finetune as FT
from falsify.llm import finetune_stage as FS
from falsify.llm import rewards as RW
from falsify.llm.evaluate import Problem, load_problems
from falsify.llm.finetune_stage import finetune
from falsify.llm.grpo import (
    GRPO_FIELDS,
    GrpoConfig,
    GrpoRun,
    sample_group,
    shipped_toy_problems,
    top_p_filter,
)

PROBLEM = Problem("t/0", "def f(x):\n    return", "f", " x\n",
                  "def check(candidate):\n    assert candidate(1) == 1\n"
                  "    assert candidate(2) == 2\n    assert candidate(0) == 1\n")


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize("override, field", [
    ("group_size=1", "group_size"), ("rollout_top_p=0", "rollout_top_p"),
    ("rollout_top_p=1.5", "rollout_top_p"), ("rollout_temperature=0", "rollout_temperature"),
    ("clip_eps=1", "clip_eps"), ("kl_beta=-0.1", "kl_beta"), ("max_new_tokens=0",
                                                              "max_new_tokens"),
    ("reward_error=zero", "reward_error"), ("reward_error=score:nan", "reward_error"),
    ("reward=nocolon", "reward"), ("policy=full", "policy"), ("method=ppo", "method")])
def test_bad_grpo_fields_are_errors_naming_the_field(override, field):
    with pytest.raises(FT.FinetuneConfigError, match=f"config field '?{field}"):
        FS.load_config(None, ["method=grpo", override])


# a valid value other than the default, for every field GRPO adds
NOT_DEFAULT = {"policy": "lora", "group_size": "4", "prompts_per_step": "2",
               "rollout_temperature": "0.5", "rollout_top_p": "0.9", "max_new_tokens": "8",
               "stop_at_newline": "true", "clip_eps": "0.1", "kl_beta": "0.5",
               "grpo_iterations": "2", "reward": "my_mod:score", "reward_error": "score:0"}


def test_grpo_fields_are_grpo_configs_only():
    finetune_fields = {f.name for f in fields(FT.FinetuneConfig)}
    assert issubclass(GrpoConfig, FT.FinetuneConfig)
    assert set(GRPO_FIELDS) == set(NOT_DEFAULT)
    assert not set(GRPO_FIELDS) & finetune_fields
    assert set(GRPO_FIELDS) == {f.name for f in fields(GrpoConfig)} - finetune_fields
    assert type(FS.load_config(None, ["method=grpo"])) is GrpoConfig
    assert type(FS.load_config(None, ["method=lora"])) is FT.FinetuneConfig


@pytest.mark.parametrize("name", sorted(NOT_DEFAULT))
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_grpo_fields_on_another_method_are_errors(name, method):
    with pytest.raises(FT.FinetuneConfigError,
                       match=f"^config field {name}=.*only method=grpo reads it "
                             f"\\(method='{method}'\\)"):
        FS.load_config(None, [f"method={method}", f"{name}={NOT_DEFAULT[name]}"])
    cfg = FS.load_config(None, ["method=grpo", f"{name}={NOT_DEFAULT[name]}"])
    assert str(getattr(cfg, name)).lower() == NOT_DEFAULT[name]


def test_a_grpo_field_in_a_config_file_with_another_method_names_its_line(tmp_path):
    f = tmp_path / "ft.yaml"
    f.write_text("method: lora\nlora_r: 4\ngrpo_iterations: 2\n")
    with pytest.raises(FT.FinetuneConfigError,
                       match=f"^{re.escape(str(f))}:3: config field grpo_iterations=2: only "
                             "method=grpo reads it \\(method='lora'\\)"):
        FS.load_config(f, [])
    with pytest.raises(FT.FinetuneConfigError, match="grpo_iterations=2: only method=grpo"):
        FS.load_config(f, ["method=qlora"])
    # the command line's method replaces the file's, as any field it sets
    cfg = FS.load_config(f, ["method=grpo"])
    assert (type(cfg), cfg.method, cfg.lora_r, cfg.grpo_iterations) == (GrpoConfig, "grpo", 4, 2)
    f.write_text("method: ppo\ngrpo_iterations: 2\n")  # a bad value is an error all the same
    with pytest.raises(FT.FinetuneConfigError,
                       match=f"^{re.escape(str(f))}:1: config field method='ppo': must be"):
        FS.load_config(f, ["method=grpo"])


def test_cli_refuses_a_grpo_field_with_method_lora(tmp_path, capsys):
    from falsify.cli import main

    assert main(["finetune", "--method", "lora", "prompts_per_step=2",
                 f"cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'o'}"]) == 2
    assert "config field prompts_per_step=2: only method=grpo reads it" in \
        capsys.readouterr().out
    assert not (tmp_path / "cache").exists()


def test_a_file_of_grpo_fields_reads_with_method_grpo_given_on_the_command_line(tmp_path):
    """The method is the last one set, whichever of file and command line sets it: a file
    without `method` is read by the class of the command line's."""
    f = tmp_path / "grpo.yaml"
    f.write_text("group_size: 4\nreward_error: score:0\n")
    cfg = FS.load_config(f, ["method=grpo"])
    assert (type(cfg), cfg.group_size, cfg.reward_error) == (GrpoConfig, 4, "score:0")


def test_a_checkpoint_config_recording_grpo_defaults_reads_as_a_finetune_config():
    """Checkpoints written while FinetuneConfig held every method's fields record GRPO's at
    their defaults for a lora / qlora run: resuming one reads them back."""
    saved = {**asdict(FT.FinetuneConfig()), **{k: getattr(GrpoConfig, k) for k in GRPO_FIELDS}}
    cfg = FS.config_from_dict(saved, source="checkpoint config")
    assert cfg == FT.FinetuneConfig()
    with pytest.raises(FT.FinetuneConfigError, match="^config field kl_beta=0.5: only"):
        FS.config_from_dict({**saved, "kl_beta": 0.5}, source="checkpoint config")


def test_changing_the_method_over_a_grpo_config_keeps_only_what_the_method_reads():
    grpo = FS.load_config(None, ["method=grpo", "lora_r=4"])
    cfg = FS.config_from_dict({"method": "lora"}, base=grpo)
    assert (type(cfg), cfg.method, cfg.lora_r) == (FT.FinetuneConfig, "lora", 4)
    tuned = FS.load_config(None, ["method=grpo", "group_size=4"])
    with pytest.raises(FT.FinetuneConfigError, match="^config field group_size=4: only"):
        FS.config_from_dict({"method": "lora"}, base=tuned)


@pytest.mark.parametrize("cls, method", [(FT.FinetuneConfig, "grpo"), (GrpoConfig, "qlora")])
def test_a_config_class_refuses_the_method_it_does_not_configure(cls, method):
    with pytest.raises(FT.FinetuneConfigError, match=f"config field method='{method}': "
                                                     f"{cls.__name__} configures"):
        cls.load(None, [f"method={method}"])


@pytest.mark.parametrize("override, field", [("grad_accum=2", "grad_accum"),
                                             ("lora_dropout=0.1", "lora_dropout")])
def test_grpo_refuses_shared_fields_it_cannot_honour(override, field):
    cfg = FS.load_config(None, ["method=grpo", override, "device=cpu", "out_dir=unused"])
    with pytest.raises(FT.FinetuneConfigError, match=f"config field {field}="):
        GrpoRun(cfg, FT.Objectives())


def test_grpo_iterations_must_divide_steps_and_checkpoints():
    cfg = FS.load_config(None, ["method=grpo", "grpo_iterations=2", "max_steps=5",
                                "device=cpu"])
    with pytest.raises(FT.FinetuneConfigError, match="max_steps=5: must be a multiple"):
        GrpoRun(cfg, FT.Objectives())
    cfg = FS.load_config(None, ["method=grpo", "grpo_iterations=2", "save_every=3",
                                "device=cpu"])
    with pytest.raises(FT.FinetuneConfigError, match="save_every=3"):
        GrpoRun(cfg, FT.Objectives())


def test_cli_config_error_exits_2_before_any_work(tmp_path, capsys):
    from falsify.cli import main

    assert main(["finetune", "--method", "grpo", "group_size=1",
                 f"cache_dir={tmp_path / 'cache'}", f"out_dir={tmp_path / 'o'}"]) == 2
    assert "group_size" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()


# ----------------------------------------------------------------------------- rewards
def test_user_reward_module_function_is_loaded_and_called(tmp_path, monkeypatch):
    (tmp_path / "my_reward_mod.py").write_text(
        "CALLS = []\n"
        "def score(prompt, completion, problem):\n"
        "    CALLS.append((prompt, completion, problem.task_id))\n"
        "    return len(completion) / 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = RW.load_reward("my_reward_mod:score")
    out = RW.score_rewards(fn, [PROBLEM, PROBLEM], [" x\n", " 12"], None)
    import my_reward_mod

    assert my_reward_mod.CALLS == [(PROBLEM.prompt, " x\n", "t/0"),
                                   (PROBLEM.prompt, " 12", "t/0")]
    assert out.rewards == [0.3, 0.3] and out.errors == 0 and out.first_error is None


@pytest.mark.parametrize("spec, why", [("no_such_module_xyz:f", "cannot import"),
                                       ("math:no_such_function", "has no function"),
                                       ("builtin:exact_match", "the built-in reward is")])
def test_bad_reward_specs_name_the_field(spec, why):
    with pytest.raises(RW.RewardConfigError, match=f"config field reward=.*{why}"):
        RW.load_reward(spec)


def _raises_on_odd(prompt, completion, problem):
    if len(completion) % 2:
        raise KeyError("odd")
    return 1.0


def test_reward_exceptions_are_counted_and_never_scored_by_default():
    comps = ["ab", "abc", "abcd", "a"]
    out = RW.score_rewards(_raises_on_odd, [PROBLEM] * 4, comps, None)
    assert out.errors == 2 and out.failed == [1, 3]
    assert out.first_error == "t/0: KeyError: 'odd'"
    assert out.rewards[0] == 1.0 and out.rewards[2] == 1.0
    assert math.isnan(out.rewards[1]) and math.isnan(out.rewards[3])  # never a silent score
    scored = RW.score_rewards(_raises_on_odd, [PROBLEM] * 4, comps, 0.0)
    assert scored.errors == 2 and scored.rewards == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("value", ["1.0", float("nan"), float("inf"), True, None])
def test_a_reward_that_is_not_a_finite_number_is_a_failure(value):
    out = RW.score_rewards(lambda p, c, q: value, [PROBLEM], ["x"], -1.0)
    assert out.errors == 1 and out.rewards == [-1.0] and "not a finite number" in \
        out.first_error


def test_reward_error_values():
    assert RW.parse_reward_error("error") is None
    assert RW.parse_reward_error("score:0") == 0.0
    assert RW.parse_reward_error("score:-1.5") == -1.5
    for bad in ("score:", "score:abc", "score:inf", "0", "ignore"):
        with pytest.raises(ValueError):
            RW.parse_reward_error(bad)


def test_unit_test_reward_is_the_fraction_of_asserts_passed():
    r = RW.UnitTestReward()
    got = r.score([PROBLEM] * 5, [" x\n", " 1\n", " x +\n", " x\n    print('@@passed-0 3')",
                                  " x if x else 1\n"])
    assert got == [2 / 3, 2 / 3, 0.0, 2 / 3, 1.0]  # " 1" passes f(1) and f(0)
    check, n = RW.instrument_check(PROBLEM.test)
    assert n == 3 and "_falsify_passed += 1" in check


def test_every_shipped_toy_problem_passes_its_canonical_body_and_fails_none():
    ps = load_problems(shipped_toy_problems())
    assert len(ps) >= 20 and all(p.prompt.endswith("    return") for p in ps)
    r = RW.UnitTestReward()
    assert r.score(ps, [p.canonical_solution for p in ps]) == [1.0] * len(ps)
    assert max(r.score(ps, [" self\n"] * len(ps))) == 0.0


# ----------------------------------------------------------------------------- top-p
def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()  # noqa: E731
    assert kept(1.0) == [True] * 4
    assert kept(0.5) == [False, True, False, False]  # 0.5 alone reaches 0.5
    assert kept(0.6) == [False, True, False, True]
    assert kept(0.9) == [False, True, True, True]
    assert kept(1e-6) == [False, True, False, False]  # the most likely token always stays


@pytest.mark.parametrize("seed", range(5))
def test_top_p_nucleus_is_minimal_on_random_logits(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 50, generator=g) * 3
    for top_p in (0.3, 0.7, 0.95):
        out = top_p_filter(logits, top_p)
        p = torch.softmax(logits, -1)
        keep = torch.isfinite(out)
        mass = (p * keep).sum(-1)
        smallest_kept = torch.where(keep, p, torch.inf).min(-1).values
        assert bool((mass >= top_p - 1e-6).all())
        assert bool((mass - smallest_kept < top_p).all())  # minimal: drop one, fall short
        assert bool(keep.gather(-1, p.argmax(-1, keepdim=True)).all())
        assert torch.equal(out[keep], logits[keep])  # kept logits untouched


def test_sampling_is_seeded_and_stays_in_the_nucleus():
    from falsify.probes.grpo_finetune import _base

    m = _base(0, scale=0.3).model  # weights far from init: a next-token distribution with a head
    prompt = [0, 5, 9, 11]

    def draw(seed, top_p=0.5):
        return sample_group(m, prompt, 16, 3, 1.0, top_p, torch.Generator().manual_seed(seed),
                            stop_id=0)

    assert draw(1) == draw(1) and draw(1) != draw(2)
    with torch.no_grad():
        first = top_p_filter(m(torch.tensor([prompt]))[:, -1, :].float(), 0.5)
    allowed = set(torch.isfinite(first)[0].nonzero().flatten().tolist())
    assert 1 < len(allowed) < m.cfg.vocab_size // 2
    assert {row[0] for row in draw(3)} <= allowed


# --------------------------------------------------------------------- the command
def test_grpo_cli_smallest_run_writes_metrics_curve_and_adapter(tmp_path, capsys,
                                                                monkeypatch):
    from falsify.cli import main

    out = tmp_path / "run"
    assert main(["finetune", "--method", "grpo", f"cache_dir={tmp_path / 'cache'}",
                 f"out_dir={out}", "progress=false", "base_steps=20", "max_steps=2",
                 "prompts_per_step=2", "group_size=2", "threads=1"]) == 0
    text = capsys.readouterr().out
    assert "built-in demo (shipped toy problems" in text and "mean reward" in text
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert all(r["reward_errors"] == 0 and r["completion_tokens"] > 0 for r in recs)
    assert recs[0]["ratio_dev"] == 0.0  # π_old is the sampling policy: ratio 1
    png = (out / "reward.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 100
    s = json.loads((out / "summary.json").read_text())
    assert s["final_step"] == 2 and len(s["rewards"]) == 2 and s["kind"] == "grpo"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["lora"]["method"] == "qlora" and cfg["finetune"]["method"] == "grpo"
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    # a raising reward stops the run after the first batch: exit 2, the failure named
    (tmp_path / "bad_reward_mod.py").write_text(
        "def score(prompt, completion, problem):\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    bad = tmp_path / "bad"
    assert main(["finetune", "--method", "grpo", f"cache_dir={tmp_path / 'cache'}",
                 f"out_dir={bad}", "progress=false", "base_steps=20", "max_steps=2",
                 "prompts_per_step=2", "group_size=2", "threads=1",
                 "reward=bad_reward_mod:score", "--allow-any-import"]) == 2
    text = capsys.readouterr().out
    assert "failed on 4 of 4 completions" in text and "RuntimeError: boom" in text
    last = json.loads((bad / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["reward_errors"] == 4 and last["update"] is False


def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path):
    """Checkpoints fall between batches and the rollout generator is seeded by (seed, batch,
    prompt): stopping after step 2 and resuming gives the uninterrupted run's rewards,
    metrics and final adapter."""
    from safetensors.torch import load_file

    from falsify.probes.grpo_finetune import _base, _config, _problems

    def cfg(out, **kw):
        return _config(str(out), 0, max_steps=4, save_every=2, **kw)

    full = finetune(cfg(tmp_path / "full"), base=_base(0), problems=_problems())
    finetune(cfg(tmp_path / "cut"), base=_base(0), problems=_problems(), stop_after=2)
    resumed = finetune(cfg(tmp_path / "cut"), base=_base(0), problems=_problems(),
                          resume="auto")
    assert resumed.resumed_from and resumed.final_step == 4
    lines = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text()
             .splitlines()]
    ref = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text()
           .splitlines()]
    drop = ("step_s", "rollout_s", "tok_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in lines] == \
        [{k: v for k, v in r.items() if k not in drop} for r in ref]
    a = load_file(str(tmp_path / "full" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert full.rewards[2:] == resumed.rewards


def test_resume_reads_the_checkpoints_grpo_config_back(tmp_path):
    """`falsify finetune --method grpo --resume`: the checkpoint's config (GRPO fields and all)
    is read back as a GrpoConfig, and the command line's method agrees with it."""
    from rich.console import Console

    from falsify.probes.grpo_finetune import _base, _config, _problems

    cfg = _config(str(tmp_path / "run"), 0, max_steps=2, save_every=1, group_size=2,
                  kl_beta=0.5)
    finetune(cfg, base=_base(0), problems=_problems(), stop_after=1)
    args = FS.FinetuneArgs(resume="auto", overrides=["method=grpo",
                                                     f"out_dir={tmp_path / 'run'}"])
    got = FS.resolve_config(args, Console(quiet=True))
    assert type(got) is GrpoConfig and got == cfg
    assert Path(args.resume) == tmp_path / "run" / "checkpoints" / "step-00000001"


def test_bench_grpo_times_both_sides(tmp_path):
    """`falsify bench grpo` at its smallest: our GRPO step and TRL's GRPOTrainer on the same
    tiny model, prompts and group, as a user runs it (another directory)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "grpo", "--steps", "1",
                        "--prompts", "2", "--group", "2", "--tokens", "4", "--format", "json"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout[r.stdout.index("{"):])
    for side in ("ours", "theirs"):
        s = out[side]
        assert "error" not in s, s
        assert s["steps"] == 1 and s["step_s"] > 0 and s["peak"] > 0
        assert 0 < s["completion_tokens"] <= 2 * 2 * 4 and s["tok_s"] > 0
    assert out["theirs"]["name"].startswith("TRL")
    # in a log (no terminal): one line per finished side on stderr, beside stdout's JSON
    done = [ln.split(":")[1].strip() for ln in r.stderr.splitlines()
            if re.match(r"^bench grpo: \w+: \d+ tok/s, step \d+ ms, \d+ s$", ln)]
    assert done == ["ours", "theirs"], r.stderr


def test_completions_end_at_their_first_stop_token_which_they_keep():
    from falsify.probes.grpo_finetune import _base

    m = _base(0, scale=0.3).model
    stops = torch.arange(4, 512, 2)  # every even id (from 4) ends a completion
    outs = sample_group(m, [0, 5, 9, 11], 16, 6, 1.0, 1.0, torch.Generator().manual_seed(0),
                        stop_id=0, stop_ids=stops)
    for row in outs:
        ends = [i for i, t in enumerate(row) if t == 0 or (t >= 4 and t % 2 == 0)]
        assert ends == [] and len(row) == 6 or ends == [len(row) - 1]
    assert any(len(row) < 6 for row in outs)
