"""`falsify pipeline [--config FILE] [--out DIR]`

The whole chain pretrain -> distill -> finetune -> merge -> prune -> quantize -> eval from one
YAML file (falsify/llm/pipeline.py), each stage what the `falsify` command does, reading the
previous stage's model. Stages are content-hashed: rerunning skips every stage whose settings
and input are unchanged, so a killed or edited pipeline resumes where it must. Without
--config it runs the built-in tiny preset on the stdlib (minutes on 2 CPU cores).

The file maps stage names to their settings; a stage it leaves out keeps the built-in ones:

    pretrain: {max_steps: 300}            # `falsify train` config fields
    distill:  {alpha: 0.9, temperature: 2} # `falsify distill` config fields (data: pretrain's)
    finetune: {method: lora, max_steps: 40}   # `falsify finetune` config fields
    merge:    {}                          # `falsify merge --adapter` flags (model, layout)
    prune:    {method: magnitude, pattern: "2:4"}   # `falsify prune` flags
    quantize: {method: int4, group: 64}   # `falsify quantize` flags
    eval:     {samples: 5, k: "1,5"}      # `falsify eval` flags

A flag is its name without dashes (`max_new_tokens: 48`); the pipeline sets each stage's
input model and output directory itself. An unknown or mistyped setting is an error naming
the file, the stage and the key.
Writes OUT/<stage>/output (what the stage's command wrote), OUT/<stage>/stage.json and
OUT/report.json; prints the report table (stage, time, perplexity, pass@1, size on disk).
Exit codes: 0 done, 2 bad pipeline file or a stage failed (finished stages are kept).
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def register(sub) -> None:
    p = sub.add_parser("pipeline", help="the post-training chain from one YAML, resumable",
                       description="pretrain -> distill -> finetune -> merge -> prune -> "
                                   "quantize -> eval, each stage skipped when unchanged")
    p.add_argument("--config", metavar="FILE", help="pipeline YAML (default: the tiny preset)")
    p.add_argument("--out", default="runs/pipeline", metavar="DIR",
                   help="output directory (default: runs/pipeline)")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_pipeline)


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n else "-"


def cmd_pipeline(args) -> int:
    from falsify.llm import pipeline as PL
    from falsify.llm.config import ConfigError

    console = Console()
    try:
        spec = PL.load_spec(args.config)
        results = PL.run(spec, Path(args.out), args.backend,
                         say=lambda m: console.print(f"[bold]pipeline[/] {m}", soft_wrap=True))
    except (PL.PipelineError, ConfigError) as e:
        console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
        return 2
    t = Table(title=f"falsify pipeline: {args.out}")
    for col in ("stage", "time", "perplexity", "pass@1", "size on disk"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for r in results:
        t.add_row(r.stage + (" (skipped)" if r.skipped else ""), f"{r.seconds:.1f} s",
                  "-" if r.perplexity is None else f"{r.perplexity:.3f}",
                  "-" if r.pass_at_1 is None else f"{r.pass_at_1:.3f}", _mb(r.size_bytes))
    console.print(t)
    report = [vars(r) for r in results]
    tmp = Path(args.out) / ".report.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(Path(args.out) / "report.json")
    return 0
