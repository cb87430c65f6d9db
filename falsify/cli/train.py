"""`falsify train [--config FILE] [--resume [DIR]] [key=value ...]`

With no arguments: trains the `tiny` preset on the Python standard library of this interpreter
(tokenizer training included, cached under .falsify/cache/) for a few minutes on CPU, then prints
the validation perplexity and a generated code sample. Exit codes: 0 done, 2 config/preflight
error, 3 Andon stop.
"""

from __future__ import annotations

import logging

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from falsify.impl.llm import checkpoint as ckpt_mod
from falsify.impl.llm.checkpoint import CheckpointError
from falsify.impl.llm.config import (
    ConfigError,
    TrainConfig,
    model_config,
    parse_overrides,
    read_yaml_config,
)
from falsify.impl.llm.config_file import LIMITS as CONFIG_FILE_LIMITS
from falsify.impl.llm.data import DataError
from falsify.impl.llm.model import param_count
from falsify.impl.llm.preflight import PreflightError
from falsify.impl.llm.run import find_resume_checkpoint, train
from falsify.impl.llm.trainer import AndonStop


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="pretrain a LLaMA-style model (default: tiny, on the stdlib)",
        description="Pretrain a LLaMA-style code model (default: tiny preset on the Python "
                    "stdlib, a few minutes on CPU).")
    add_loop_args(p, "TrainConfig", "max_steps=100 lr=1e-3")
    p.set_defaults(func=cmd_train)


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
    return run_loop(args, TrainConfig, lambda cfg, console: train(cfg, resume=args.resume))


def run_loop(args, cls, runner, verb: str = "train", errors: tuple = ()) -> int:
    """Config (fresh or resumed) -> `runner(cfg, console)` -> the report; shared by `falsify
    train` and `falsify distill`, whose runs differ only in their step."""
    console = Console()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
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

