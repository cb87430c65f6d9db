"""One flag convention on every verb: each field of a verb's config dataclass is `--field-name`,
generated (falsify/cli/config_flags.py), its value parsed by the same code as the old
`key=value` form, which still works for this release, comes last, wins, and says once on
stderr which flags to use instead. Built at the parser, no training run."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from falsify.cli import build_parser, main
from falsify.cli import config_flags as CF
from falsify.cli import finetune as finetune_cli
from falsify.cli import parity as parity_cli
from falsify.cli.common import Parser
from falsify.cli.train import add_loop_args, loop_args, train_argv
from falsify.llm import finetune_stage as FS
from falsify.llm.config import ConfigError, TrainConfig
from falsify.llm.distill import DistillConfig
from falsify.llm.finetune_config import FinetuneConfig
from falsify.llm.grpo import GrpoConfig
from falsify.llm.model import ModelConfig

VERB_CONFIGS = {"train": [TrainConfig], "distill": [DistillConfig],
                "finetune": [FinetuneConfig, GrpoConfig], "parity": [ModelConfig]}


def _verb(name: str) -> argparse.ArgumentParser:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def _train_cfg(*argv: str) -> TrainConfig:
    return TrainConfig.load(None, loop_args(_parse("train", *argv)).overrides)


def _finetune_cfg(*argv: str):
    return FS.load_config(None, finetune_cli.finetune_args(_parse("finetune", *argv)).overrides)


@pytest.mark.parametrize("verb", VERB_CONFIGS)
def test_every_config_field_is_a_flag_of_its_verb(verb):
    options = {o: a.dest for a in _verb(verb)._actions for o in a.option_strings}
    names = {f.name for cls in VERB_CONFIGS[verb] for f in dataclasses.fields(cls)}
    missing = {n for n in names if options.get("--" + n.replace("_", "-")) != n}
    assert not missing, f"falsify {verb}: config fields without a flag: {sorted(missing)}"


def test_a_new_config_field_is_a_flag_with_no_other_edit():
    """A field added to the dataclass is on the command line, typed by the config's parser."""

    @dataclasses.dataclass
    class Grown(TrainConfig):
        extra_knob: int = 1
        extra_ratio: float | None = None
        extra_switch: bool = False
        extra_names: list[str] = dataclasses.field(default_factory=list)

    p = Parser(prog="grown")
    add_loop_args(p, Grown)
    args = p.parse_args(["--extra-knob", "5", "--extra-ratio", "0.25", "--extra-switch",
                         "--extra-names", "a,b", "--out", "o"])
    cfg = Grown.load(None, loop_args(args).overrides)
    assert (cfg.extra_knob, cfg.extra_ratio, cfg.extra_switch, cfg.extra_names, cfg.out_dir) \
        == (5, 0.25, True, ["a", "b"], "o")
    assert "config field extra_knob (default: 1)" in " ".join(p.format_help().split())
    with pytest.raises(ConfigError, match=r"'extra_knob': cannot parse 'five' as int"):
        Grown.load(None, loop_args(p.parse_args(["--extra-knob", "five"])).overrides)


def test_flags_and_key_value_give_the_same_config():
    flags = _train_cfg("--max-steps", "7", "--lr", "1e-3", "--no-progress", "--data-files",
                       "a.txt,b.txt", "--out", "o", "--hidden-size", "null",
                       "--corpus", "synthetic")
    old = _train_cfg("max_steps=7", "lr=1e-3", "progress=false", "data_files=a.txt,b.txt",
                     "out_dir=o", "hidden_size=null", "corpus=synthetic")
    assert flags == old
    assert (flags.max_steps, flags.lr, flags.progress, flags.data_files, flags.out_dir) == \
        (7, 1e-3, False, ["a.txt", "b.txt"], "o")
    assert flags != TrainConfig()

    grpo = _finetune_cfg("--method", "grpo", "--group-size", "3", "--rank", "4", "--no-shuffle",
                         "--grad-checkpoint", "--out", "o", "--targets", "q_proj,v_proj")
    assert grpo == _finetune_cfg("method=grpo", "group_size=3", "lora_r=4", "shuffle=false",
                                 "activation_checkpointing=true", "out_dir=o",
                                 "targets=q_proj,v_proj")
    assert isinstance(grpo, GrpoConfig)
    assert (grpo.group_size, grpo.lora_r, grpo.shuffle, grpo.activation_checkpointing) == \
        (3, 4, False, True)

    a = _parse("distill", "--teacher", "t", "--alpha", "0.9", "--teacher-topk", "8", "--out", "o")
    b = _parse("distill", "teacher=t", "alpha=0.9", "teacher_topk=8", "out_dir=o")
    assert DistillConfig.load(None, loop_args(a).overrides) == \
        DistillConfig.load(None, loop_args(b).overrides)
    assert DistillConfig.load(None, loop_args(a).overrides).teacher_topk == 8


def test_the_old_key_value_form_comes_last_and_wins():
    assert _train_cfg("--max-steps", "5", "max_steps=9").max_steps == 9
    assert _train_cfg("max_steps=9", "--max-steps", "5").max_steps == 9
    assert _finetune_cfg("lora_r=2", "--rank", "16", "--lora-r", "8").lora_r == 2
    assert _finetune_cfg("--rank", "16", "--lora-r", "8").lora_r == 8  # the last flag


@pytest.mark.parametrize(("argv", "needle"), [
    (("train", "--max-steps", "two"), "config field 'max_steps': cannot parse 'two' as int"),
    (("train", "--lr", "inf"), "config field 'lr' must be a finite number"),
    (("finetune", "--lora-r", "0"), "config field lora_r=0: must be an int >= 1"),
    (("distill", "--alpha", "2"), "config field alpha=2.0: must be in [0, 1]"),
])
def test_a_bad_flag_is_the_same_error_as_key_value(argv, needle, capsys):
    verb, flag, value = argv
    assert main([verb, flag, value]) == 2
    said = capsys.readouterr()
    assert needle in said.out and "note:" not in said.err
    assert main([verb, f"{flag[2:].replace('-', '_')}={value}"]) == 2
    old = capsys.readouterr()
    assert old.out == said.out  # the same message, word for word


def test_the_old_form_prints_one_note_naming_the_flags(capsys, monkeypatch):
    assert main(["train", "max_steps=0", "lr=1e-3", "progress=no", "sample_prompt=a b"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: key=value is the old form, kept for this release: use "
                   "--max-steps 0 --lr 1e-3 --no-progress --sample-prompt 'a b'"]
    assert main(["train", "--max-steps", "0"]) == 2
    assert "note:" not in capsys.readouterr().err
    assert main(["train", "max_steps=0", "sample_prompt=-x"]) == 2  # a value, not an option
    assert capsys.readouterr().err.endswith("use --max-steps 0 --sample-prompt=-x\n")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a rank of a data-parallel job: its launcher said it
    CF.note_old_form(_parse("train", "max_steps=1"))
    assert capsys.readouterr().err == ""


def test_data_parallel_ranks_get_flags_and_build_the_same_config():
    args = _parse("train", "--nproc", "2", "--max-steps", "3", "--out", "o", "lr=1e-3",
                  "progress=no", "sample_prompt=-x", "max_steps=4")
    argv = train_argv(args)
    assert not [a for a in argv if not a.startswith("--")], argv  # no key=value: no notes
    assert "--nproc" not in " ".join(argv)
    rank = TrainConfig.load(None, loop_args(_parse("train", *argv)).overrides)
    assert rank == TrainConfig.load(None, loop_args(args).overrides)
    assert (rank.max_steps, rank.lr, rank.progress, rank.sample_prompt, rank.out_dir) == \
        (4, 1e-3, False, "-x", "o")

    args = _parse("finetune", "--nproc", "2", "--rank", "4", "--data", "a.jsonl", "--data",
                  "b.jsonl", "--no-shuffle", "seed=3")
    argv = finetune_cli.finetune_argv(args, None)
    assert argv[0] == "finetune" and all(a.startswith("--") for a in argv[1:]), argv
    rank = _parse(*argv)
    assert finetune_cli.finetune_args(rank).overrides == \
        finetune_cli.finetune_args(_parse(*argv)).overrides
    assert FS.load_config(None, finetune_cli.finetune_args(rank).overrides) == \
        FS.load_config(None, finetune_cli.finetune_args(args).overrides)
    assert rank.data == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("verb", ["train", "distill", "finetune", "merge", "prune", "quantize",
                                  "export", "pipeline"])
def test_out_is_the_output_directory_on_every_verb_that_writes_one(verb):
    (out,) = [a for a in _verb(verb)._actions if "--out" in a.option_strings]
    assert out.dest in ("out", "out_dir")
    if verb in VERB_CONFIGS:
        assert out.dest == "out_dir"


def test_parity_backend_and_its_old_name(capsys):
    assert _parse("parity", "--backend", "torch,triton").backends == "torch,triton"
    assert capsys.readouterr().err == ""
    assert _parse("parity", "--backends", "torch").backends == "torch"
    assert capsys.readouterr().err.splitlines() == [
        "note: --backends is the old name, kept for this release: use --backend"]


def test_parity_model_fields_are_flags_like_their_key_value():
    flags = _parse("parity", "--num-layers", "1", "--rope-theta", "500")
    old = _parse("parity", "num_layers=1", "rope_theta=500")
    over = parity_cli._overrides(CF.config_overrides(flags))
    assert over == parity_cli._overrides(CF.config_overrides(old)) == \
        {"num_layers": 1, "rope_theta": 500}
    with pytest.raises(Exception, match="model config field 'num_layers': cannot parse 'two'"):
        parity_cli._overrides(CF.config_overrides(_parse("parity", "--num-layers", "two")))


def test_a_flag_table_naming_no_field_is_refused():
    with pytest.raises(ValueError, match="lora_rank"):
        CF.add_config_flags(Parser(prog="x"), [FinetuneConfig], aliases={"lora_rank": ["--r"]})


def test_the_pipeline_logs_each_stage_as_flags_that_build_the_stage_config(tmp_path):
    """`falsify pipeline` prints each stage's command; run as printed, it builds the config the
    stage ran with, and in the flag form."""
    from falsify.llm import pipeline as PL

    d = str(tmp_path / "stage")
    pre = {"max_steps": 3, "progress": False, "data_files": ["a.txt", "b.txt"], "lr": 0.001,
           "memory_budget_gb": None, "corpus": "synthetic"}
    spec = {"pretrain": pre}
    runs = {
        "pretrain": (pre, None, lambda: TrainConfig.load(
            None, [*PL._overrides(pre), f"out_dir={d}"])),
        "distill": ({"alpha": 0.9, "progress": True}, "teacher-dir", lambda: DistillConfig.load(
            None, [*PL._overrides({**{k: pre[k] for k in PL.SHARED_DATA if k in pre},
                                   "alpha": 0.9, "progress": True}),
                   f"out_dir={d}", "teacher=teacher-dir"])),
        "finetune": ({"lora_r": 4, "shuffle": False, "targets": ["q_proj"]}, "base-dir",
                     lambda: FS.load_config(None, ["model=base-dir", f"out_dir={d}",
                                                   "lora_r=4", "shuffle=false",
                                                   "targets=q_proj"])),
    }
    load = {"train": lambda a: TrainConfig.load(None, loop_args(a).overrides),
            "distill": lambda a: DistillConfig.load(None, loop_args(a).overrides),
            "finetune": lambda a: FS.load_config(
                None, finetune_cli.finetune_args(a).overrides)}
    for stage, (settings, prev, ran) in runs.items():
        argv = PL._argv(stage, settings, tmp_path / "stage", prev, spec)
        args = _parse(*argv)
        assert args.overrides == [], argv  # no old form in what the log shows
        assert load[argv[0]](args) == ran(), stage


def test_the_word_none_is_null_only_where_a_field_takes_null():
    """corpus=none ("no built-in corpus, only data_files") is the word; threads=none is
    null; a field that takes no null still refuses `null`."""
    from falsify.llm.config import ConfigError, TrainConfig

    cfg = TrainConfig.load(None, ["corpus=none", "data_files=a.txt", "threads=none"])
    assert cfg.corpus == "none" and cfg.threads is None
    with pytest.raises(ConfigError, match="'corpus' may not be null"):
        TrainConfig.load(None, ["corpus=null"])
