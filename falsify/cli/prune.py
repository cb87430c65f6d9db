"""`falsify prune [--model BASE] [--method wanda|magnitude] [--sparsity 0.5 | --pattern 2:4]
--out DIR`

Prunes every attention and MLP projection of a model per output row (falsify/llm/prune.py), with
the masks from the contract-checked kernel (pruning-kernel-v1). WANDA's activation norms come
from calibration windows of the shipped fine-tuning text. Writes OUT/ours (our layout, a
`--model` for every other command) and OUT/hf (the HF layout), each with masks.safetensors (the
kernel's keep masks, the source of truth for which weights are pruned: `falsify finetune
--keep-masks` trains a delta that keeps them 0), and OUT/prune.json with the
perplexity on held-out code before and after and each projection's achieved sparsity. Without
--model it prunes the built-in base. The command checks its own output: every projection must
have exactly the sparsity the plan asks for (exit 4 otherwise). Exit codes: 0 done, 2 bad
input, 4 self-check failed.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from falsify.errors import UsageError
from falsify.llm import prune_stage as PS
from falsify.llm.config import ConfigError
from falsify.llm.data import DataError
from falsify.llm.prune import PruneError


def register(sub) -> None:
    p = sub.add_parser("prune", help="prune projections: magnitude or WANDA, per row or N:M",
                       description="prune a model (magnitude or WANDA)")
    p.add_argument("--model", metavar="BASE",
                   help="our checkpoint or an HF LLaMA dir (default: the built-in base)")
    p.add_argument("--method", default="wanda", choices=("wanda", "magnitude"))
    g = p.add_mutually_exclusive_group()
    g.add_argument("--sparsity", type=float, default=None,
                   help="fraction of each row pruned (default 0.5 without --pattern)")
    g.add_argument("--pattern", default=None, metavar="N:M", help="keep N of every M (2:4)")
    p.add_argument("--calibration", type=int, default=16, metavar="N",
                   help="calibration windows of the model's context (WANDA)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_prune)


def cmd_prune(args) -> int:
    console = Console()
    try:
        r = PS.prune_model(args.model, Path(args.out), args.method, args.sparsity, args.pattern,
                           args.calibration, args.backend, console)
    except (PruneError, ConfigError, DataError) as e:
        raise UsageError(f"falsify prune: {e}") from None
    return PS.show_pruned(console, r)
