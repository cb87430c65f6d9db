"""`falsify train [--config FILE] [--resume [DIR]] [--FIELD VALUE ...]`

Every TrainConfig field is a flag (`--max-steps 100 --lr 1e-3`; `--out DIR` is out_dir);
`key=value` is the old form, kept for this release (it comes last and wins).

With no arguments: trains the `tiny` preset on the Python standard library of this interpreter
(tokenizer training included, cached under .falsify/cache/) for a few minutes on CPU, then prints
the validation perplexity and a generated code sample. Exit codes: 0 done, 2 config/preflight
error, 3 Andon stop.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.markup import escape

from falsify.cli import config_flags as CF
from falsify.llm.config import (
    CHOICES,
    ConfigError,
    TrainConfig,
)
from falsify.llm.config_file import LIMITS as CONFIG_FILE_LIMITS
from falsify.llm.preflight import PreflightError, check_config
from falsify.llm.train_stage import LoopArgs, run_loop, train_runner

# the short flags of the pretraining loop's verbs (train, distill), beside the generated ones
LOOP_ALIASES = {"out_dir": ["--out"]}


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="pretrain a LLaMA-style model (default: tiny, on the stdlib)",
        description="Pretrain a LLaMA-style code model (default: tiny preset on the Python "
                    "stdlib, a few minutes on CPU).")
    add_loop_args(p, TrainConfig)
    add_launch_args(p)
    p.set_defaults(func=cmd_train)


def add_launch_args(p) -> None:
    """--nproc/--nnodes/--rdzv-endpoint: a data-parallel job through torchrun's launcher."""
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data-parallel processes on this node (DDP through torchrun's launcher; "
                        "gloo on the CPU, nccl on CUDA)")
    p.add_argument("--nnodes", type=int, default=1, metavar="M",
                   help="nodes of a multi-node job (each node runs this command with --nproc)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="rendezvous of a multi-node job (c10d); default: a free local port")


def add_loop_args(p, config_class: type, helps: dict | None = None) -> None:
    """--config, --resume, a flag per config field and the old form's key=value overrides:
    the arguments of every run that is the pretraining loop (`falsify train`, `falsify
    distill`)."""
    p.add_argument("--config", metavar="FILE",
                   help=f"YAML file of {config_class.__name__} fields ({CONFIG_FILE_LIMITS}; "
                        "duplicate keys and YAML tags are errors)")
    p.add_argument("--resume", nargs="?", const="auto", metavar="DIR",
                   help="continue from a checkpoint: a checkpoint or run directory; without "
                        "DIR, the latest checkpoint in out_dir")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="the old form of the flags, kept for this release: override config "
                        "fields (they come last and win)")
    p.intermixed = True  # key=value overrides may come before, between or after the flags
    CF.add_config_flags(p, [config_class], aliases=LOOP_ALIASES, helps=helps or {},
                        choices=CHOICES)


def loop_args(args) -> LoopArgs:
    """The run the parsed command line asks for: its flags and key=value overrides as the
    loader's override list."""
    return LoopArgs(args.config, args.resume, CF.config_overrides(args))


def cmd_train(args) -> int:
    from falsify.llm import distributed

    CF.note_old_form(args)
    run = loop_args(args)
    if (args.nproc > 1 or args.nnodes > 1) and distributed.launched_world_size() == 1:
        def check():
            if not args.resume:  # a resumed config is the checkpoint's, checked by the ranks
                check_config(TrainConfig.load(args.config, run.overrides))

        return launch_checked(args, check, lambda: ["train", *train_argv(args)], Console())
    return leave_rank(run_loop(run, TrainConfig, train_runner(run)))


def launch_checked(args, check, argv, console, errors: tuple = ()) -> int:
    """The launcher's side of `--nproc N`: `check()` runs once, here (the config's rules, the
    warmup fraction: falsify/llm/preflight.py:check_config, and whatever else the verb needs
    first), so a bad field is one error before any rank starts, not one per rank after the
    spawn; then every rank runs `python -m falsify ARGV`, `argv()` being called after the
    check (which may resolve what it names, as a resume's checkpoint). The exit code (2:
    refused)."""
    from falsify.llm import distributed

    try:
        check()
        return distributed.launch(args.nproc, args.nnodes, args.rdzv_endpoint, argv())
    except (ConfigError, PreflightError, ValueError, *errors) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2


def leave_rank(code: int) -> int:
    """A rank of a data-parallel job exits here with `code`. Its work is on disk (checkpoints
    are fsynced) and its process group is gone; the interpreter's own teardown after an FSDP
    run on gloo aborted now and then ("terminate called without an active exception",
    SIGABRT), which the launcher reports as a failed rank. Leave without it."""
    from falsify.llm import distributed

    if distributed.launched_world_size() > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def train_argv(args) -> list[str]:
    """The command line each rank runs: this one's, without the launcher's options, its
    config overrides all as flags (so no rank repeats the old form's note)."""
    return [*(["--config", args.config] if args.config else []),
            *(["--resume", args.resume] if args.resume else []), *CF.rank_argv(args)]
