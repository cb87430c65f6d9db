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

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from falsify.errors import UsageError


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


def _settings(args) -> list[int]:
    try:
        ks = sorted({int(x) for x in args.k.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"falsify eval: --k {args.k!r}: comma-separated integers") from None
    if args.samples < 1:
        raise UsageError("falsify eval: --samples must be >= 1")
    if not ks or ks[0] < 1 or ks[-1] > args.samples:
        raise UsageError(f"falsify eval: --k {args.k}: each k must be in 1..--samples "
                         f"({args.samples})")
    if args.samples > 1 and args.temperature == 0:
        raise UsageError("falsify eval: --samples > 1 at --temperature 0 draws the same "
                         "greedy completion n times; give a temperature > 0 or --samples 1")
    for name in ("max_new_tokens", "cpu_s", "memory_mb"):
        if getattr(args, name) < 1:
            raise UsageError(f"falsify eval: --{name.replace('_', '-')} must be >= 1")
    if args.temperature < 0 or args.wall_s <= 0 or (args.limit is not None and args.limit < 1) \
            or (args.top_k is not None and args.top_k < 1):
        raise UsageError("falsify eval: --temperature >= 0, --wall-s > 0, --limit and "
                         "--top-k >= 1")
    return ks


def _load(args, console):
    from falsify.llm import data as data_mod
    from falsify.llm import finetune as FT

    if args.adapter:
        from falsify.cli.merge import load_adapted

        model, base, _ = load_adapted(args.adapter, args.model, args.backend, console)
        tp = Path(args.adapter) / "tokenizer.json"
        tok = data_mod.load_tokenizer(tp) if tp.is_file() else base.tokenizer
        return model, tok, f"{base.source} + adapter {args.adapter}"
    base = FT.base_or_builtin(args.model, args.backend, console)
    return base.model, base.tokenizer, base.source


def cmd_eval(args) -> int:
    from falsify.llm import evaluate as EV
    from falsify.llm.config import ConfigError
    from falsify.llm.data import DataError
    from falsify.llm.sandbox import Limits, SandboxError

    console = Console(stderr=args.format == "json")
    ks = _settings(args)
    limits = Limits(cpu_s=args.cpu_s, wall_s=args.wall_s, memory_mb=args.memory_mb)
    try:
        problems = EV.load_problems(args.problems)[: args.limit]
        texts = []
        for t in args.text:
            if not Path(t).is_file():
                raise EV.EvalError(f"--text {t}: no such file")
            texts.append(Path(t).read_text(encoding="utf-8"))
        texts = texts or [p.prompt + p.canonical_solution for p in problems]
        harness = EV.check_harness(problems, limits)
        if harness["canonical_pass"] != len(problems) or harness["wrong_pass"]:
            console.print(f"[bold red]harness self-check failed:[/] {harness['canonical_pass']}/"
                          f"{len(problems)} canonical solutions pass and "
                          f"{harness['wrong_pass']} `return None` bodies pass; no score is "
                          "meaningful on this machine")
            return 1
        model, tok, source = _load(args, console)
        if tok is None:
            raise EV.EvalError(f"{source}: no tokenizer.json found next to it")
        ppl = EV.perplexity(model, tok, texts)
        code = EV.evaluate_code(model, tok, problems, args.samples, ks, args.max_new_tokens,
                                args.temperature, args.top_k, args.seed, limits)
    except (EV.EvalError, ConfigError, DataError, UnicodeDecodeError) as e:
        raise UsageError(f"falsify eval: {e}") from None
    except SandboxError as e:
        console.print(f"[bold red]error:[/] {e}")
        return 1
    from falsify.llm.sandbox import run_python

    containment = run_python("pass\n", limits).containment
    report = {"model": source, "problems": len(problems), "samples": args.samples,
              "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
              "seed": args.seed, "perplexity": ppl, "pass_at_k": code["pass_at_k"],
              "prompts_truncated": code["prompts_truncated"],
              "harness": harness, "containment": containment,
              "per_problem": code["problems"]}
    if args.format == "json":
        print(json.dumps(report, indent=1))
        return 0
    t = Table(title=f"falsify eval: {source}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row(f"perplexity ({ppl['tokens']} held-out tokens)", f"{ppl['perplexity']:.3f}")
    for k, v in code["pass_at_k"].items():
        t.add_row(f"pass@{k} ({len(problems)} problems, n = {args.samples}, "
                  f"T = {args.temperature})", f"{v:.3f}")
    console.print(t)
    if code["prompts_truncated"]:
        console.print(f"note: {code['prompts_truncated']} prompt(s) longer than the model's "
                      "context minus --max-new-tokens; sampling conditioned on their last "
                      "tokens (each program still runs the whole prompt)")
    console.print(f"harness: {harness['canonical_pass']}/{len(problems)} canonical solutions "
                  f"pass, {harness['wrong_pass']} wrong bodies pass; sandbox: "
                  + ", ".join(f"{k} {'on' if v else 'OFF'}" for k, v in containment.items()))
    return 0
