"""The library half of `falsify eval` (falsify/cli/eval.py parses and prints; `falsify
pipeline`'s eval stage calls `evaluate` directly): held-out perplexity and pass@k on the code
problems, each completion run in the sandbox, after the harness proves itself on this machine
(every canonical solution passes, every `return None` body fails).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from falsify.llm import data as data_mod
from falsify.llm import evaluate as EV
from falsify.llm import finetune as FT
from falsify.llm.finetune_base import load_adapted
from falsify.llm.sandbox import Limits, run_python


class HarnessFailed(Exception):
    """The harness self-check failed on this machine: no score would be meaningful."""


@dataclass
class EvalSettings:
    """`falsify eval`'s settings, its flags' defaults."""
    model: str | None = None
    adapter: str | None = None
    problems: str | None = None
    text: list[str] = field(default_factory=list)
    limit: int | None = None
    samples: int = 5
    k: str = "1,5"
    temperature: float = 0.8
    top_k: int | None = None
    max_new_tokens: int = 96
    seed: int = 0
    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    backend: str = "auto"


def check_settings(s: EvalSettings) -> list[int]:
    """The k's of pass@k, sorted; EvalError (naming the flag) on a bad setting."""
    try:
        ks = sorted({int(x) for x in s.k.split(",") if x.strip()})
    except ValueError:
        raise EV.EvalError(f"--k {s.k!r}: comma-separated integers") from None
    if s.samples < 1:
        raise EV.EvalError("--samples must be >= 1")
    if not ks or ks[0] < 1 or ks[-1] > s.samples:
        raise EV.EvalError(f"--k {s.k}: each k must be in 1..--samples ({s.samples})")
    if s.samples > 1 and s.temperature == 0:
        raise EV.EvalError("--samples > 1 at --temperature 0 draws the same greedy completion "
                           "n times; give a temperature > 0 or --samples 1")
    for name in ("max_new_tokens", "cpu_s", "memory_mb"):
        if getattr(s, name) < 1:
            raise EV.EvalError(f"--{name.replace('_', '-')} must be >= 1")
    if s.temperature < 0 or s.wall_s <= 0 or (s.limit is not None and s.limit < 1) \
            or (s.top_k is not None and s.top_k < 1):
        raise EV.EvalError("--temperature >= 0, --wall-s > 0, --limit and --top-k >= 1")
    return ks


def _load(s: EvalSettings, console):
    if s.adapter:
        model, base, _ = load_adapted(s.adapter, s.model, s.backend, console)
        tp = Path(s.adapter) / "tokenizer.json"
        tok = data_mod.load_tokenizer(tp) if tp.is_file() else base.tokenizer
        return model, tok, f"{base.source} + adapter {s.adapter}"
    base = FT.base_or_builtin(s.model, s.backend, console)
    return base.model, base.tokenizer, base.source


def _texts(s: EvalSettings, problems) -> list[str]:
    texts = []
    for t in s.text:
        if not Path(t).is_file():
            raise EV.EvalError(f"--text {t}: no such file")
        texts.append(Path(t).read_text(encoding="utf-8"))
    return texts or [p.prompt + p.canonical_solution for p in problems]


def evaluate(s: EvalSettings, ks: list[int], console=None) -> dict:
    """The eval report (`falsify eval --format json`'s). Raises HarnessFailed, SandboxError,
    and EvalError, ConfigError, DataError or UnicodeDecodeError on bad input."""
    limits = Limits(cpu_s=s.cpu_s, wall_s=s.wall_s, memory_mb=s.memory_mb)
    problems = EV.load_problems(s.problems)[: s.limit]
    texts = _texts(s, problems)
    harness = EV.check_harness(problems, limits)
    if harness["canonical_pass"] != len(problems) or harness["wrong_pass"]:
        raise HarnessFailed(f"{harness['canonical_pass']}/{len(problems)} canonical solutions "
                            f"pass and {harness['wrong_pass']} `return None` bodies pass; no "
                            "score is meaningful on this machine")
    model, tok, source = _load(s, console)
    if tok is None:
        raise EV.EvalError(f"{source}: no tokenizer.json found next to it")
    ppl = EV.perplexity(model, tok, texts)
    code = EV.evaluate_code(model, tok, problems, s.samples, ks, s.max_new_tokens,
                            s.temperature, s.top_k, s.seed, limits)
    containment = run_python("pass\n", limits).containment
    return {"model": source, "problems": len(problems), "samples": s.samples,
            "temperature": s.temperature, "max_new_tokens": s.max_new_tokens,
            "seed": s.seed, "perplexity": ppl, "pass_at_k": code["pass_at_k"],
            "prompts_truncated": code["prompts_truncated"],
            "harness": harness, "containment": containment,
            "per_problem": code["problems"]}


def show_report(console, report: dict) -> None:
    """Print `falsify eval`'s table and notes for `report`."""
    ppl, harness, n = report["perplexity"], report["harness"], report["problems"]
    t = Table(title=f"falsify eval: {report['model']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row(f"perplexity ({ppl['tokens']} held-out tokens)", f"{ppl['perplexity']:.3f}")
    for k, v in report["pass_at_k"].items():
        t.add_row(f"pass@{k} ({n} problems, n = {report['samples']}, "
                  f"T = {report['temperature']})", f"{v:.3f}")
    console.print(t)
    if report["prompts_truncated"]:
        console.print(f"note: {report['prompts_truncated']} prompt(s) longer than the model's "
                      "context minus --max-new-tokens; sampling conditioned on their last "
                      "tokens (each program still runs the whole prompt)")
    console.print(f"harness: {harness['canonical_pass']}/{n} canonical solutions "
                  f"pass, {harness['wrong_pass']} wrong bodies pass; sandbox: "
                  + ", ".join(f"{k} {'on' if v else 'OFF'}"
                              for k, v in report["containment"].items()))
