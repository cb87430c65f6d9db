"""The library half of `falsify train` and `falsify distill` (falsify/cli/train.py and
falsify/cli/distill.py parse and launch; `falsify pipeline`'s pretrain and distill stages call
`run_loop` directly): config (fresh or resumed) -> the run -> the report, with the commands'
exit codes (0 done, 2 config/preflight/data/checkpoint error, 3 Andon stop).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import distill as D
from falsify.llm.checkpoint import CheckpointError
from falsify.llm.config import (
    ConfigError,
    TrainConfig,
    model_config,
    parse_overrides,
    read_yaml_config,
)
from falsify.llm.data import DataError
from falsify.llm.model import param_count
from falsify.llm.preflight import PreflightError
from falsify.llm.run import find_resume_checkpoint, train
from falsify.llm.run_base import report_error
from falsify.llm.trainer import AndonStop


@dataclass
class LoopArgs:
    """What a pretraining-loop run is asked for: `--config FILE`, `--resume [DIR]` ("auto":
    the latest checkpoint in out_dir; resolved in place to the checkpoint used) and `key=value`
    overrides (parsed as text, as on the command line)."""
    config: str | None = None
    resume: str | None = None
    overrides: list[str] = field(default_factory=list)


def resume_config(args, cls=TrainConfig) -> TrainConfig:
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


def train_runner(args):
    """`falsify train`'s run: the pretraining loop."""
    return lambda cfg, console: train(cfg, resume=args.resume)


def distill_runner(args):
    """`falsify distill`'s run: the loop with the teacher's KD loss."""

    def runner(cfg, console):
        console.print(f"teacher: {cfg.teacher or 'the built-in base'}; alpha={cfg.alpha} "
                      f"temperature={cfg.temperature} "
                      f"teacher_topk={cfg.teacher_topk or 'full logits'}")
        result = D.distill(cfg, resume=args.resume, console=console)
        console.print(f"distill.json: {result.out_dir}/distill.json")
        return result

    return runner


def _report(console, cfg, mcfg, result) -> None:
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}")
    console.print(f"run directory {result.out_dir}")
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


def run_loop(args, cls, runner, verb: str = "train", errors: tuple = ()) -> int:
    """Config (fresh or resumed) -> `runner(cfg, console)` -> the report; shared by `falsify
    train` and `falsify distill`, whose runs differ only in their step. `args`: a LoopArgs (or
    the parsed command line, which has the same fields)."""
    # in a data-parallel job rank 0 reports; the other ranks only log warnings and errors
    rank = int(os.environ.get("RANK", "0"))
    console = Console(quiet=rank != 0)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(name)s: %(message)s")
    try:
        cfg = resume_config(args, cls) if args.resume else cls.load(args.config, args.overrides)
        mcfg = model_config(cfg)
        console.print(f"[bold]falsify {verb}[/]: model={cfg.model} ({param_count(mcfg):,} "
                      f"params, {mcfg.num_layers}L/{mcfg.hidden_size}H/{mcfg.num_heads}A/"
                      f"{mcfg.num_kv_heads}KV, vocab {mcfg.vocab_size}, seq {mcfg.max_seq_len}) "
                      f"corpus={cfg.corpus} max_steps={cfg.max_steps} "
                      f"out_dir={cfg.out_dir or 'runs/<model>-<time> (new)'}")
        result = runner(cfg, console)
    except (ConfigError, PreflightError, DataError, CheckpointError, OSError, *errors) as e:
        return report_error(console, e)
    except AndonStop as e:
        where = e.result.out_dir if e.result is not None else cfg.out_dir
        console.print(f"[bold red]{e}[/]\nlast good checkpoint kept: "
                      f"{ckpt_mod.latest_checkpoint(where) if where else None}")
        return 3
    _report(console, cfg, mcfg, result)
    return 0
