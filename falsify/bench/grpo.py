"""`falsify bench grpo`: GRPO steps of ours (`falsify finetune --method grpo`'s loop) vs TRL's
GRPOTrainer, on CPU, in one run.

Both sides get the same tiny Llama (ours exported with falsify/llm/hf.py, so the weights are equal),
the same byte-level BPE, the same prompts (the shipped toy problems), group size, completion
length, sampling (temperature 1, top-p 1), LoRA adapters (rank 16, alpha 32, the seven target
projections, fp32 base), learning rate and β, and the same cheap reward (the fraction of
spaces in a completion), so the step is measured, not a sandbox. A step is the whole GRPO step
on both sides: sampling, scoring, old and reference log-probs, loss, backward, AdamW.

Each side runs in its own subprocess: libraries imported, the resident-set high-water mark
reset (`/proc/self/clear_refs`), the model built, one warm-up step, then the timed steps;
peak memory is VmHWM over the post-import RSS (Linux only). Tokens/s counts the completion
tokens each side generated per second of step time (a side whose completions end early at EOS
generates fewer). TRL runs with use_bias_correction_kl=False: our loss is the plain k3 term.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from falsify.bench.finetune import TARGETS, _status
from falsify.errors import UsageError
from falsify.helptext import first_paragraph

MODEL = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=384,
             vocab_size=1024, max_seq_len=128)
RANK, ALPHA, LR, BETA = 16, 32.0, 1e-3, 0.04


def space_reward(prompt, completion, problem=None, **kw) -> float:
    return completion.count(" ") / max(1, len(completion))


def _trl_reward(prompts, completions, **kw):
    return [space_reward(p, c) for p, c in zip(prompts, completions)]


def _setup(root: Path):
    """(our base, tokenizer path, prompts) — the same for both sides."""
    from falsify.llm import data as data_mod
    from falsify.llm.evaluate import load_problems
    from falsify.llm.finetune_base import Base
    from falsify.llm.grpo import shipped_toy_problems
    from falsify.llm.model import ModelConfig, build_model

    ps = load_problems(shipped_toy_problems())
    tok = data_mod.train_tokenizer([p.prompt + p.canonical_solution for p in ps] * 4,
                                   MODEL["vocab_size"])
    tok_path = root / "tokenizer.json"
    data_mod.save_tokenizer(tok, tok_path)
    model = build_model(ModelConfig(**MODEL), "torch", seed=0)
    return Base(model, tok, str(tok_path), "bench", "memory"), tok_path, ps


class Ours:
    name = "falsify (falsify/llm/grpo.py)"

    def __init__(self, root: Path, P: int, G: int, M: int, steps: int):
        from falsify.llm import finetune as FT
        from falsify.llm.grpo import GrpoConfig, GrpoRun

        base, _, ps = _setup(root)
        cfg = GrpoConfig.from_dict(dict(
            method="grpo", policy="lora", lora_r=RANK, lora_alpha=ALPHA, group_size=G,
            prompts_per_step=P, max_new_tokens=M, max_steps=steps + 1, warmup_steps=0, lr=LR,
            lr_min=LR, kl_beta=BETA, reward=f"{__name__}:space_reward", progress=False,
            sample_count=0, backend="torch", device="cpu", out_dir=str(root / "ours")),
            source="bench grpo")
        self.run = GrpoRun(cfg, FT.Objectives())
        self.run.open(None)
        self.run.load(base, ps, None)
        self.run.build()

    def go(self) -> tuple[list[float], list[int]]:
        self.run.loop(None, keep_model=False)
        recs = [json.loads(x) for x in (self.run.out / "metrics.jsonl").read_text()
                .splitlines()]
        return [r["step_s"] for r in recs], [r["completion_tokens"] for r in recs]


class Theirs:
    name = "TRL GRPOTrainer + peft"

    def __init__(self, root: Path, P: int, G: int, M: int, steps: int):
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from datasets import Dataset
        from peft import LoraConfig
        from transformers import PreTrainedTokenizerFast, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer

        from falsify.llm import data as data_mod
        from falsify.llm import hf

        base, tok_path, ps = _setup(root)
        hf_dir = hf.export_hf(base.model, root / "hf", tok_path)
        tok = PreTrainedTokenizerFast(tokenizer_file=str(tok_path), eos_token=data_mod.EOS,
                                      pad_token=data_mod.EOS)
        self.times: list[float] = []
        times = self.times

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                self.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                times.append(time.perf_counter() - self.t0)

        args = GRPOConfig(output_dir=str(root / "theirs"), per_device_train_batch_size=P * G,
                          num_generations=G, max_completion_length=M, beta=BETA,
                          learning_rate=LR, lr_scheduler_type="constant", max_steps=steps + 1,
                          temperature=1.0, top_p=1.0, report_to=[], use_cpu=True,
                          save_strategy="no", bf16=False, logging_steps=1,
                          use_bias_correction_kl=False)
        self.trainer = GRPOTrainer(
            model=str(hf_dir), reward_funcs=[_trl_reward], args=args,
            train_dataset=Dataset.from_list([{"prompt": p.prompt} for p in ps]),
            processing_class=tok, callbacks=[Clock()],
            peft_config=LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS,
                                   lora_dropout=0.0))
        self.PG = P * G

    def go(self) -> tuple[list[float], list[int]]:
        self.trainer.train()
        lens = [h["completions/mean_length"] for h in self.trainer.state.log_history
                if "completions/mean_length" in h]
        return self.times, [round(x * self.PG) for x in lens]


def measure(which: str, P: int, G: int, M: int, steps: int, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    if which == "theirs":
        import trl  # noqa: F401  (imported before the baseline RSS, like ours below)
    import falsify.llm.grpo  # noqa: F401

    rss0 = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with tempfile.TemporaryDirectory(prefix="falsify-bench-grpo-") as d:
        side = (Ours if which == "ours" else Theirs)(Path(d), P, G, M, steps)
        times, toks = side.go()
    times, toks = times[1:], toks[1:]  # the first step is the warm-up
    return {"name": side.name, "step_s": statistics.median(times),
            "tok_s": sum(toks) / sum(times), "completion_tokens": statistics.mean(toks),
            "peak": max(0, _status("VmHWM") - rss0), "steps": len(times)}


def _side(which: str, args) -> dict:
    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "grpo", "--measure", which,
                        "--prompts", str(args.prompts), "--group", str(args.group),
                        "--tokens", str(args.tokens), "--steps", str(args.steps),
                        "--threads", str(args.threads)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["exit " + str(r.returncode)])[-1]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _sides(args) -> dict:
    """Ours, then TRL, each in its own process, watched through the shared progress display on
    stderr (stdout is the table or JSON): on a terminal sides done of total and an ETA; in a
    log one line per finished side. A side that could not run is printed when it ends."""
    from rich.console import Console

    from falsify.harness.progress import Progress

    out = {}
    with Progress(Console(stderr=True), "sides", total=2, ticking=False) as view:
        for which in ("ours", "theirs"):
            view.start(f"{which} ({args.steps} steps)")
            t0 = time.monotonic()
            out[which] = r = _side(which, args)
            if "error" in r:
                view.failed(f"bench grpo: {which} failed: {r['error']}")
            view.finished(f"bench grpo: {which}: " + (
                "failed" if "error" in r else f"{r['tok_s']:.0f} tok/s, step "
                f"{r['step_s'] * 1e3:.0f} ms") + f", {time.monotonic() - t0:.0f} s")
    return out


def register(sub) -> None:
    p = sub.add_parser("grpo", help="GRPO steps, ours vs TRL's GRPOTrainer: time, memory",
                       description=first_paragraph(__doc__))
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--tokens", type=int, default=16, help="completion length")
    p.add_argument("--steps", type=int, default=3, help="timed steps per side")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--measure", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_grpo)


def cmd_grpo(args) -> int:
    for name in ("prompts", "tokens", "steps", "threads"):
        if getattr(args, name) < 1:
            raise UsageError(f"falsify bench grpo: --{name} must be >= 1")
    if args.group < 2:
        raise UsageError("falsify bench grpo: --group must be >= 2")
    if args.measure:
        print(json.dumps(measure(args.measure, args.prompts, args.group, args.tokens,
                                 args.steps, args.threads)))
        return 0
    r = {**_sides(args), "setup": {**MODEL, "prompts": args.prompts, "group": args.group,
                   "tokens": args.tokens, "steps": args.steps, "threads": args.threads}}
    if args.format == "json":
        print(json.dumps(r, indent=1))
        return 0 if "error" not in r["ours"] else 1
    from rich.console import Console
    from rich.table import Table

    o, t = r["ours"], r["theirs"]
    c = Console(width=140)
    if "error" in o:
        c.print(f"[bold red]ours failed:[/] {o['error']}")
        return 1
    tab = Table(title=f"falsify bench grpo — CPU, {args.threads} thread(s), {args.prompts} "
                      f"prompts x {args.group} completions x {args.tokens} tokens, LoRA r={RANK}"
                      f" (L={MODEL['num_layers']} H={MODEL['hidden_size']} "
                      f"V={MODEL['vocab_size']})")
    for col in ("", "ours", "TRL", "ratio ours/TRL"):
        tab.add_column(col, justify="right" if col else "left")
    ok = "error" not in t
    tab.add_row("implementation", o["name"], t["name"] if ok else "(did not run)", "")
    tab.add_row("step (median) s", f"{o['step_s']:.3f}", f"{t['step_s']:.3f}" if ok else "-",
                f"{o['step_s'] / t['step_s']:.2f}" if ok else "-")
    tab.add_row("completion tokens/s", f"{o['tok_s']:,.0f}",
                f"{t['tok_s']:,.0f}" if ok else "-", f"{o['tok_s'] / t['tok_s']:.2f}"
                if ok else "-")
    tab.add_row("completion tokens/step", f"{o['completion_tokens']:.0f}",
                f"{t['completion_tokens']:.0f}" if ok else "-", "")
    tab.add_row("peak RSS, MiB", f"{o['peak'] / 2**20:.1f}",
                f"{t['peak'] / 2**20:.1f}" if ok else "-",
                f"{o['peak'] / t['peak']:.2f}" if ok and t["peak"] else "-")
    c.print(tab)
    if not ok:
        c.print(f"TRL could not run: {t['error']}")
    return 0
