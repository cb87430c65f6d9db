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

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from falsify.errors import UsageError


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


def expected_sparsity(plan, n_in: int) -> float:
    if plan.pattern is not None:
        keep, m = plan.pattern
        return (m - keep) / m
    from falsify.reference.pruning import n_pruned

    return n_pruned(plan.sparsity, n_in) / n_in


def cmd_prune(args) -> int:
    from falsify.cli.merge import write_ours
    from falsify.llm import evaluate as EV
    from falsify.llm import finetune as FT
    from falsify.llm import hf
    from falsify.llm import lora_model as LM
    from falsify.llm import prune as P
    from falsify.llm.config import ConfigError
    from falsify.llm.data import DataError

    console = Console()
    sparsity = 0.5 if args.sparsity is None and args.pattern is None else args.sparsity
    try:
        plan = P.parse_plan(args.method, sparsity, args.pattern)
        if args.calibration < 1:
            raise P.PruneError("--calibration must be >= 1")
        base = FT.base_or_builtin(args.model, args.backend, console)
        model, tok = base.model, base.tokenizer
        if tok is None:
            raise P.PruneError(f"{base.source}: no tokenizer.json found next to it (the "
                               "calibration and the perplexity need it)")
        held_out = [p.prompt + p.canonical_solution for p in EV.load_problems()]
        before = EV.perplexity(model, tok, held_out)
        norms = None
        if plan.method == "wanda":
            windows = P.calibration_ids(tok, args.calibration, model.cfg.max_seq_len)
            norms = P.activation_norms(model, windows)
        masks: dict = {}
        stats = P.prune(model, plan, norms, masks)
        after = EV.perplexity(model, tok, held_out)
    except (P.PruneError, ConfigError, DataError) as e:
        raise UsageError(f"falsify prune: {e}") from None
    weights = P.projection_weights(model)
    off = {n: s for n, s in stats.items()
           if s != expected_sparsity(plan, weights[n].shape[1])}
    out = Path(args.out)
    meta = {"pruned_from": base.source, "plan": plan.describe()}
    write_ours(model, out / "ours", base.tokenizer_path, meta, masks=masks)
    # HF loaders read model.safetensors only; the masks beside it let `falsify finetune
    # --keep-masks` start from the HF layout as well (written in the same atomic directory)
    hf.export_hf(model, out / "hf", base.tokenizer_path,
                 also=lambda tmp: LM.save_masks(masks, tmp / LM.MASKS_FILE))
    report = {**meta, "calibration_windows": args.calibration if norms else 0,
              "perplexity_before": before["perplexity"], "perplexity_after": after["perplexity"],
              "held_out_tokens": before["tokens"], "sparsity": stats,
              "masks": LM.MASKS_FILE}
    (out / "prune.json").write_text(json.dumps(report, indent=1))
    t = Table(title=f"falsify prune: {plan.describe()}")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row(f"perplexity before ({before['tokens']} held-out tokens)",
              f"{before['perplexity']:.3f}")
    t.add_row("perplexity after", f"{after['perplexity']:.3f}")
    t.add_row(f"projections pruned ({len(stats)})",
              f"{min(stats.values()):.4f} .. {max(stats.values()):.4f} sparsity")
    console.print(t)
    console.print(f"wrote {out / 'ours'}, {out / 'hf'} and {out / 'prune.json'}")
    if off:
        console.print(f"[bold red]self-check failed:[/] {len(off)} projection(s) off the "
                      f"planned sparsity: {', '.join(sorted(off)[:3])}")
        return 4
    console.print("self-check: every projection has exactly the planned sparsity")
    return 0
