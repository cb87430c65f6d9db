"""`falsify eval [--model BASE] [--adapter DIR] [--samples N] [--k 1,5] ...`

Held-out perplexity and pass@k on the shipped code problems (falsify/llm/evaluate.py), each
completion run in the sandbox (falsify/llm/sandbox.py). Without --model or --adapter it evaluates
the built-in base (the pretraining loop's tiny preset on the stdlib, trained once and cached,
as `falsify finetune` uses). Before any model is scored the harness proves itself on this
machine: every canonical solution must pass and every `return None` body fail, or the command
stops (exit 1) instead of reporting a meaningless 0. Exit codes: 0 done, 1 harness self-check
failed, 2 bad input.
"""

from __future__ import annotations

import dataclasses
import json

from rich.console import Console

from falsify.errors import UsageError
from falsify.llm import eval_stage as ES
from falsify.llm import evaluate as EV
from falsify.llm.config import ConfigError
from falsify.llm.data import DataError
from falsify.llm.sandbox import SandboxError


def register(sub) -> None:
    p = sub.add_parser("eval", help="perplexity and pass@k on code problems, run in a sandbox",
                       description="evaluate a model: held-out perplexity and pass@k")
    p.add_argument("--model", metavar="BASE", help="our checkpoint or an HF LLaMA dir "
                   "(default: the built-in base)")
    p.add_argument("--adapter", metavar="DIR", help="adapter written by `falsify finetune`")
    p.add_argument("--problems", metavar="FILE", help="JSONL problems (default: the shipped 40)")
    p.add_argument("--text", metavar="FILE", action="append", default=[],
                   help="held-out text for perplexity (default: the problems' canonical code)")
    p.add_argument("--limit", type=int, default=None, help="only the first N problems")
    p.add_argument("--samples", type=int, default=5, help="completions per problem (n)")
    p.add_argument("--k", default="1,5", help="comma-separated k for pass@k, each <= n")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu-s", type=int, default=5, help="CPU seconds per program")
    p.add_argument("--wall-s", type=float, default=10.0, help="wall-clock seconds per program")
    p.add_argument("--memory-mb", type=int, default=512, help="address space per program")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_eval)


def settings(args) -> ES.EvalSettings:
    return ES.EvalSettings(**{f.name: getattr(args, f.name)
                              for f in dataclasses.fields(ES.EvalSettings)})


def cmd_eval(args) -> int:
    console = Console(stderr=args.format == "json")
    s = settings(args)
    try:
        ks = ES.check_settings(s)
    except EV.EvalError as e:
        raise UsageError(f"falsify eval: {e}") from None
    try:
        report = ES.evaluate(s, ks, console)
    except ES.HarnessFailed as e:
        console.print(f"[bold red]harness self-check failed:[/] {e}")
        return 1
    except (EV.EvalError, ConfigError, DataError, UnicodeDecodeError) as e:
        raise UsageError(f"falsify eval: {e}") from None
    except SandboxError as e:
        console.print(f"[bold red]error:[/] {e}")
        return 1
    if args.format == "json":
        print(json.dumps(report, indent=1))
        return 0
    ES.show_report(console, report)
    return 0
