"""`falsify finetune [--method lora|qlora|grpo] [--model DIR|FILE.gguf] [--data FILE.jsonl ...]
[--config FILE] [--resume [DIR]] [flags] [key=value ...]`

With no arguments: trains (or reuses from .falsify/cache/finetune-base/) a tiny base with
the pretraining loop on the standard library, then QLoRA-fine-tunes it on the shipped
docstring -> body dataset (falsify/llm/sft/stdlib-docstrings.jsonl) for 60 steps, printing the
loss and the held-out loss before and after, and samples from the base and the adapted model
(the demo's settings, `DEMO`, are printed and each can be overridden).
`--method grpo` with no data: GRPO on the shipped toy code problems
(falsify/llm/evalset/toy-code-problems.jsonl) with unit-test rewards (`DEMO_GRPO`), printing the
mean reward per step, its first and last steps' means, and the curve as OUT/reward.png.
Every config field is a flag (`--lora-r 16`, `--max-steps 100`), some with a short alias
(`--rank 16`, `--out DIR`); `key=value` overrides are the old form, kept for this release: they
come last and win. `--model` takes our checkpoints, an HF LLaMA directory or a llama.cpp GGUF LLaMA
file (its quantized projections stay quantized and frozen, its tokenizer comes from its
metadata). A finished run also writes OUT/adapter.gguf, the adapter for llama.cpp's `--lora`.
Exit codes: 0 done, 2 config/data/preflight error, 3 Andon stop.
"""

from __future__ import annotations

import logging
import os

from rich.console import Console

from falsify.cli import config_flags as CF
from falsify.cli.train import add_launch_args, launch_checked, leave_rank
from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import finetune as FT
from falsify.llm import finetune_stage as FS
from falsify.llm.config import CHOICES
from falsify.llm.config_file import LIMITS as CONFIG_FILE_LIMITS
from falsify.llm.data import DataError
from falsify.llm.finetune_config import FinetuneConfig
from falsify.llm.finetune_stage import DEMO, DEMO_GRPO  # noqa: F401  (the demo's settings)
from falsify.llm.grpo import GRPO_FIELDS, GrpoConfig
from falsify.llm.lora_model import LoraConfigError
from falsify.llm.preflight import check_config

# the short flags, beside the generated `--field-name` of every config field
ALIASES = {"out_dir": ["--out"], "lora_r": ["--rank"], "lora_alpha": ["--alpha"],
           "lora_dropout": ["--dropout"], "early_stopping_patience": ["--early-stopping"],
           "activation_checkpointing": ["--grad-checkpoint"]}


# what a flag's help says instead of "config field KEY"
FLAG_HELP = {
    "method": ("the adapter and objective: lora (fp32 base) or qlora (NF4 base) train SFT, "
               "reward-weighted SFT or DPO, whichever the --data holds (DPO: a file of "
               'preference pairs, {"prompt", "chosen", "rejected"} per line; β: --dpo-beta); '
               "grpo: GRPO on code problems with unit-test rewards (config field method)"),
    "dpo_beta": ("DPO's β, the strength of the pull toward the base (preference-pair data "
                 "only; config field dpo_beta)"),
    **{name: f"config field {name} (method grpo only)" for name in GRPO_FIELDS},
}


def register(sub) -> None:
    p = sub.add_parser(
        "finetune", help="LoRA / QLoRA fine-tuning (SFT, reward-weighted, DPO, GRPO)",
        description="LoRA / QLoRA fine-tuning (SFT, reward-weighted SFT, DPO; GRPO with "
                    "--method grpo on code problems) of our checkpoints or an HF LLaMA "
                    "directory; the adapter is written in the PEFT format. DPO: --data a "
                    'JSONL file of {"prompt", "chosen", "rejected"} preference pairs.')
    # one file per --data (repeat it for more): nargs="+" would swallow key=value overrides
    p.add_argument("--data", action="append", metavar="FILE.jsonl", default=None,
                   help="training data, repeatable (chat, prompt/response, text, +reward, or "
                        "preference pairs; detected per file); default: the shipped stdlib "
                        "dataset")
    p.add_argument("--allow-any-import", action="store_true",
                   help="let a `module:function` reward import a module from outside the "
                        "project and the installed packages (it runs that module's code)")
    p.add_argument("--config", metavar="FILE",
                   help=f"YAML file of config fields: FinetuneConfig's, with method grpo "
                        f"GrpoConfig's ({CONFIG_FILE_LIMITS}; duplicate keys and YAML tags are "
                        "errors)")
    p.add_argument("--resume", nargs="?", const="auto", metavar="DIR",
                   help="continue from a checkpoint (default: the latest in out_dir)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="the old form of the flags, kept for this release: override config "
                        "fields (they come last and win)")
    add_launch_args(p)
    # FinetuneConfig's fields, then those GrpoConfig adds; `--data` is the one above
    CF.add_config_flags(p, [FinetuneConfig, GrpoConfig], aliases=ALIASES, helps=FLAG_HELP,
                        skip=("data",), choices={**CHOICES, "method": FT.METHODS})
    p.intermixed = True  # key=value overrides may come before, between or after the flags
    p.set_defaults(func=cmd_finetune)


def _data(args) -> list[str]:
    return [] if args.data is None else ["data=" + ",".join(args.data)]


def finetune_args(args) -> FS.FinetuneArgs:
    """The run the parsed command line asks for (its flags as `key=value` overrides first)."""
    return FS.FinetuneArgs(args.config, args.resume, CF.config_overrides(args, _data(args)),
                           args.allow_any_import)


def cmd_finetune(args) -> int:
    from falsify.llm import distributed

    launching = (args.nproc > 1 or args.nnodes > 1) and distributed.launched_world_size() == 1
    rank = int(os.environ.get("RANK", "0"))  # in a data-parallel job rank 0 reports
    console = Console(quiet=rank != 0)
    CF.note_old_form(args)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(name)s: %(message)s")
    if launching:
        return _launch(args, console)
    return leave_rank(FS.run_finetune(finetune_args(args), console))


def _launch(args, console: Console) -> int:
    """The launcher's side of `--nproc N`: the config is checked once, the built-in base is
    trained (or found cached) once, here, then every rank runs this command without the
    launcher's options."""
    from falsify.llm.finetune_base import builtin_base

    fa = finetune_args(args)

    def check():
        cfg = FS.resolve_config(fa, console)
        check_config(cfg)
        FS.check_reward(cfg, fa)
        if cfg.model is None:
            builtin_base(cfg, console)

    # after check(): resolve_config fixes fa.resume to the checkpoint it found
    return launch_checked(args, check, lambda: finetune_argv(args, fa.resume), console,
                          (DataError, LoraConfigError, ckpt_mod.CheckpointError))


def finetune_argv(args, resume: str | None) -> list[str]:
    """The command line each rank runs: this one's, without the launcher's options, its
    config overrides all as flags (so no rank repeats the old form's note)."""
    return ["finetune", *(["--config", args.config] if args.config else []),
            *(["--resume", resume] if resume else []),
            *(["--allow-any-import"] if args.allow_any_import else []),
            *(f"--data={f}" for f in args.data or ()), *CF.rank_argv(args)]


