"""`falsify distill [--teacher DIR] [--config FILE] [--resume [DIR]] [--FIELD VALUE ...]`

Knowledge distillation (falsify/llm/distill.py): a frozen teacher trains a smaller student with
L = α·T²·KL(teacher ‖ student at temperature T) + (1 − α)·CE, through the fused linear-KD kernel
(the student's logits are never built). The run is the pretraining run — same data pipeline,
preflight, schedule, checkpoints, resume, Andon stops — and takes every `falsify train` config
field plus alpha, temperature, teacher_topk, teacher_cache and kd_chunk, each a flag
(`--alpha 0.9 --temperature 2`; `--out DIR` is out_dir; `key=value` is the old form, kept for
this release, and comes last and wins).

With no arguments: the teacher is the built-in base (the tiny preset trained on the stdlib, as
`falsify finetune` uses it; trained once and cached), the student the tiny preset at half width
and depth on the same corpus and tokenizer, T = 4, α = 0.5, full teacher logits on the fly; a
couple of minutes on 2 CPU cores. `--teacher-topk K --teacher-cache DIR` precomputes the teacher's
top-k per training block into safetensors shards once and trains from them.

The run directory holds the checkpoints, metrics.jsonl, summary.json and distill.json (teacher,
its weight fingerprint, the loss settings, validation loss). Exit codes: 0 done, 2 config or
teacher error (a teacher with another vocabulary or tokenizer is refused before step 1), 3
Andon stop.
"""

from __future__ import annotations

from falsify.cli import config_flags as CF
from falsify.cli.train import add_loop_args, loop_args
from falsify.llm import distill as D
from falsify.llm.train_stage import distill_runner, run_loop

HELP = {"teacher": "our checkpoint or run dir, or an HF causal-LM dir; null is the built-in "
                   "base (config field teacher)"}


def register(sub) -> None:
    p = sub.add_parser(
        "distill", help="distill a teacher into a smaller student (KD loss)",
        description="Distill a frozen teacher into a smaller student (default: the built-in "
                    "base into a half-size tiny model, a couple of minutes on CPU).")
    add_loop_args(p, D.DistillConfig, HELP)
    p.set_defaults(func=cmd_distill)


def cmd_distill(args) -> int:
    CF.note_old_form(args)
    run = loop_args(args)
    return run_loop(run, D.DistillConfig, distill_runner(run), verb="distill")
