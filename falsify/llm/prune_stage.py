"""The library half of `falsify prune` (falsify/cli/prune.py parses and prints; `falsify
pipeline`'s prune stage calls `prune_model` directly): prune every projection of a model with the
contract-checked masks, write OUT/ours, OUT/hf and OUT/prune.json, and check that every
projection has exactly the sparsity the plan asks for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from falsify.llm import evaluate as EV
from falsify.llm import finetune as FT
from falsify.llm import hf
from falsify.llm import lora_model as LM
from falsify.llm import prune as P
from falsify.llm.merge_stage import write_ours
from falsify.reference.pruning import n_pruned


def expected_sparsity(plan, n_in: int) -> float:
    if plan.pattern is not None:
        keep, m = plan.pattern
        return (m - keep) / m
    return n_pruned(plan.sparsity, n_in) / n_in


@dataclass
class Pruned:
    """What `prune_model` did: the plan, the perplexities, each projection's sparsity, the
    projections off the plan (the self-check: empty passes) and the output directory."""
    plan: P.Plan
    before: dict
    after: dict
    stats: dict
    off: dict
    out: Path


def _prune(model, tok, plan, calibration: int):
    held_out = [p.prompt + p.canonical_solution for p in EV.load_problems()]
    before = EV.perplexity(model, tok, held_out)
    norms = None
    if plan.method == "wanda":
        windows = P.calibration_ids(tok, calibration, model.cfg.max_seq_len)
        norms = P.activation_norms(model, windows)
    masks: dict = {}
    stats = P.prune(model, plan, norms, masks)
    return before, EV.perplexity(model, tok, held_out), norms, masks, stats


def prune_model(model: str | None, out: Path, method: str = "wanda",
                sparsity: float | None = None, pattern: str | None = None,
                calibration: int = 16, backend: str = "auto", console=None) -> Pruned:
    """Prune `model` (default: the built-in base) into `out`. Raises PruneError, ConfigError
    or DataError on bad input."""
    sparsity = 0.5 if sparsity is None and pattern is None else sparsity
    plan = P.parse_plan(method, sparsity, pattern)
    if calibration < 1:
        raise P.PruneError("--calibration must be >= 1")
    base = FT.base_or_builtin(model, backend, console)
    m, tok = base.model, base.tokenizer
    if tok is None:
        raise P.PruneError(f"{base.source}: no tokenizer.json found next to it (the "
                           "calibration and the perplexity need it)")
    before, after, norms, masks, stats = _prune(m, tok, plan, calibration)
    weights = P.projection_weights(m)
    off = {n: s for n, s in stats.items()
           if s != expected_sparsity(plan, weights[n].shape[1])}
    meta = {"pruned_from": base.source, "plan": plan.describe()}
    write_ours(m, out / "ours", base.tokenizer_path, meta, masks=masks)
    # HF loaders read model.safetensors only; the masks beside it let `falsify finetune
    # --keep-masks` start from the HF layout as well (written in the same atomic directory)
    hf.export_hf(m, out / "hf", base.tokenizer_path,
                 also=lambda tmp: LM.save_masks(masks, tmp / LM.MASKS_FILE))
    report = {**meta, "calibration_windows": calibration if norms else 0,
              "perplexity_before": before["perplexity"], "perplexity_after": after["perplexity"],
              "held_out_tokens": before["tokens"], "sparsity": stats,
              "masks": LM.MASKS_FILE}
    (out / "prune.json").write_text(json.dumps(report, indent=1))
    return Pruned(plan, before, after, stats, off, out)


def show_pruned(console, r: Pruned) -> int:
    """Print what `falsify prune` prints; the exit code (4: self-check failed)."""
    before, after, stats, out = r.before, r.after, r.stats, r.out
    t = Table(title=f"falsify prune: {r.plan.describe()}")
    t.add_column("")
    t.add_column("value", justify="right")
    t.add_row(f"perplexity before ({before['tokens']} held-out tokens)",
              f"{before['perplexity']:.3f}")
    t.add_row("perplexity after", f"{after['perplexity']:.3f}")
    t.add_row(f"projections pruned ({len(stats)})",
              f"{min(stats.values()):.4f} .. {max(stats.values()):.4f} sparsity")
    console.print(t)
    console.print(f"wrote {out / 'ours'}, {out / 'hf'} and {out / 'prune.json'}")
    if r.off:
        console.print(f"[bold red]self-check failed:[/] {len(r.off)} projection(s) off the "
                      f"planned sparsity: {', '.join(sorted(r.off)[:3])}")
        return 4
    console.print("self-check: every projection has exactly the planned sparsity")
    return 0
