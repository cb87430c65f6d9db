"""`falsify train [--config FILE] [--resume [DIR]] [key=value ...]`

With no arguments: trains the `tiny` preset on the Python standard library of this interpreter
(tokenizer training included, cached under .falsify/cache/) for a few minutes on CPU, then prints
the validation perplexity and a generated code sample. Exit codes: 0 done, 2 config/preflight
error, 3 Andon stop.
"""

from __future__ import annotations

import logging
import os
import sys

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from falsify.llm import checkpoint as ckpt_mod
from falsify.llm.checkpoint import CheckpointError
from falsify.llm.config import (
    ConfigError,
    TrainConfig,
    model_config,
    parse_overrides,
    read_yaml_config,
)
from falsify.llm.config_file import LIMITS as CONFIG_FILE_LIMITS
from falsify.llm.data import DataError
from falsify.llm.model import param_count
from falsify.llm.preflight import PreflightError
from falsify.llm.run import find_resume_checkpoint, train
from falsify.llm.trainer import AndonStop


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="pretrain a LLaMA-style model (default: tiny, on the stdlib)",
        description="Pretrain a LLaMA-style code model (default: tiny preset on the Python "
                    "stdlib, a few minutes on CPU).")
    add_loop_args(p, "TrainConfig", "max_steps=100 lr=1e-3")
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


def add_loop_args(p, config_class: str, example: str) -> None:
    """--config, --resume and key=value overrides: the arguments of every run that is the
    pretraining loop (`falsify train`, `falsify distill`)."""
    p.add_argument("--config", metavar="FILE",
                   help=f"YAML file of {config_class} fields ({CONFIG_FILE_LIMITS}; duplicate "
                        "keys and YAML tags are errors)")
    p.add_argument("--resume", nargs="?", const="auto", metavar="DIR",
                   help="continue from a checkpoint: a checkpoint or run directory; without "
                        "DIR, the latest checkpoint in out_dir")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help=f"override config fields, e.g. {example}")


def _resume_config(args, cls=TrainConfig) -> TrainConfig:
    """On resume the checkpoint's config is the base; --config/overrides may only change fields
    that do not alter the arithmetic (train() enforces that)."""
    base = cls.load(args.config, []) if args.config else cls()
    out_dir = parse_overrides(args.overrides).get("out_dir", base.out_dir)
    # resolved once (a damaged latest checkpoint is reported once, and train() uses this one)
    args.resume = str(find_resume_checkpoint(args.resume, out_dir))
    saved = ckpt_mod.read_state(args.resume)["config"]["train"]
    cfg = cls.from_dict(saved, source="checkpoint config")
    if args.config:
        cfg = cls.from_dict(read_yaml_config(args.config), source=args.config, base=cfg)
    if args.overrides:
        cfg = cls.from_dict(parse_overrides(args.overrides), source="command line", base=cfg,
                            from_text=True)
    return cfg


def cmd_train(args) -> int:
    from falsify.llm import distributed

    if (args.nproc > 1 or args.nnodes > 1) and distributed.launched_world_size() == 1:
        if not args.resume:  # a bad field is refused once, here, not by every rank
            try:
                TrainConfig.load(args.config, args.overrides).validate()
            except ConfigError as e:
                Console().print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
                return 2
        try:
            return distributed.launch(args.nproc, args.nnodes, args.rdzv_endpoint,
                                      ["train", *train_argv(args)])
        except ValueError as e:
            Console().print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
            return 2
    return leave_rank(run_loop(args, TrainConfig,
                               lambda cfg, console: train(cfg, resume=args.resume)))


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
    """The command line each rank runs: this one's, without the launcher's options."""
    return [*(["--config", args.config] if args.config else []),
            *(["--resume", args.resume] if args.resume else []), *args.overrides]


def run_loop(args, cls, runner, verb: str = "train", errors: tuple = ()) -> int:
    """Config (fresh or resumed) -> `runner(cfg, console)` -> the report; shared by `falsify
    train` and `falsify distill`, whose runs differ only in their step."""
    # in a data-parallel job rank 0 reports; the other ranks only log warnings and errors
    rank = int(os.environ.get("RANK", "0"))
    console = Console(quiet=rank != 0)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        cfg = _resume_config(args, cls) if args.resume else cls.load(args.config, args.overrides)
        mcfg = model_config(cfg)
        console.print(f"[bold]falsify {verb}[/]: model={cfg.model} ({param_count(mcfg):,} "
                      f"params, {mcfg.num_layers}L/{mcfg.hidden_size}H/{mcfg.num_heads}A/"
                      f"{mcfg.num_kv_heads}KV, vocab {mcfg.vocab_size}, seq {mcfg.max_seq_len}) "
                      f"corpus={cfg.corpus} max_steps={cfg.max_steps} "
                      f"out_dir={cfg.out_dir or 'runs/<model>-<time> (new)'}")
        result = runner(cfg, console)
        out_dir = result.out_dir
    except (ConfigError, PreflightError, DataError, CheckpointError, *errors) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except OSError as e:  # out_dir not creatable, a disk full: name the path, keep what is saved
        console.print(f"[bold red]error:[/] {escape(str(e.filename or ''))}: "
                      f"{escape(e.strerror or str(e))}", soft_wrap=True)
        return 2
    except AndonStop as e:
        where = e.result.out_dir if e.result is not None else cfg.out_dir
        console.print(f"[bold red]{e}[/]\nlast good checkpoint kept: "
                      f"{ckpt_mod.latest_checkpoint(where) if where else None}")
        return 3
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}")
    console.print(f"run directory {out_dir}")
    console.print(f"trained {result.final_step} steps, {result.tokens:,} tokens in "
                  f"{result.elapsed_s:.1f} s ({result.tokens_per_s:,.0f} tok/s); "
                  f"checkpoint {result.checkpoint}")
    if result.val_loss is not None:
        console.print(f"[bold]validation loss {result.val_loss:.4f}, perplexity "
                      f"{result.val_ppl:.2f}[/] (per token, vocab {mcfg.vocab_size})")
    if result.sample is not None:
        console.print(Panel(Text(result.sample), title=f"sample (prompt {cfg.sample_prompt!r}, "
                            f"T={cfg.sample_temperature}, top-k {cfg.sample_top_k})",
                            expand=False))
    return 0

