"""Writing a model in our checkpoint layout, and merging an adapter into its base: the library
half of `falsify merge --adapter` (falsify/cli/merge.py parses and prints; `falsify pipeline`'s
merge stage calls `merge_adapter` directly).

`merge_adapter` writes W' = deq(W) + (α/r)·B·A for every adapted projection (a masked adapter
keeps its pruning masks beside the weights) and checks its own output: merged logits against
base+adapter logits on a probe batch, within the fp32 op-order tolerance.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from falsify.llm import hf
from falsify.llm import lora_model as LM
from falsify.llm.checkpoint import (
    STATE_HASHES,
    atomic_dir,
    content_hashes,
    save_file,
    write_manifest,
)
from falsify.llm.finetune_base import load_adapted

U32 = 2.0**-24
LAYOUTS = ("ours", "hf")


class MergeStageError(ValueError):
    """A bad merge request (the layouts); the CLI prints it and exits 2."""


def probe_tolerance(model, logits: torch.Tensor) -> float:
    """fp32 op-order difference bound (tests/test_hf.py): 8·(2L+1)·√K·u·max|logits|."""
    c = model.cfg
    k = max(c.hidden_size, c.intermediate_size)
    return 8 * (2 * c.num_layers + 1) * math.sqrt(k) * U32 * float(logits.abs().max())


def write_ours(model, out: Path, tokenizer_path: str | None, meta: dict,
               masks: dict | None = None) -> Path:
    """Our layout: model.safetensors + state.json (with the model config) + manifest.json,
    atomically; with `masks`, the pruning masks in masks.safetensors beside the weights."""

    def fill(tmp: Path):
        sd = {k: v.detach().to("cpu", torch.float32).contiguous()
              for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / "model.safetensors"))
        if masks is not None:
            LM.save_masks(masks, tmp / LM.MASKS_FILE)
        if tokenizer_path:
            shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
        (tmp / "state.json").write_text(json.dumps(
            {"step": 0, "time": time.time(), "config": {"model": model.cfg.to_dict()},
             "merged_from": meta, STATE_HASHES: content_hashes(tmp)}, indent=1, default=str))
        # verified like any checkpoint when it is read back as a base (falsify/llm/checkpoint.py)
        write_manifest(tmp)

    return atomic_dir(out, fill)


def write_layouts(model, out: Path, layouts: list[str], tokenizer_path: str | None, meta: dict,
                  masks: dict | None = None) -> list[Path]:
    """`model` in each of `layouts` under `out` (OUT/ours: write_ours; OUT/hf: the Hugging Face
    layout, with `masks` beside it); the directories written."""
    written = []
    if "ours" in layouts:
        written.append(write_ours(model, out / "ours", tokenizer_path, meta, masks=masks))
    if "hf" in layouts:
        written.append(hf.export_hf(model, out / "hf", tokenizer_path))
        if masks is not None:
            LM.save_masks(masks, out / "hf" / LM.MASKS_FILE)
    return written


def parse_layouts(layout: str) -> list[str]:
    layouts = [s.strip() for s in layout.split(",") if s.strip()]
    if not layouts or any(s not in LAYOUTS for s in layouts):
        raise MergeStageError(f"--layout {layout!r}: choose from ours, hf")
    return layouts


@dataclass
class AdapterMerge:
    """What `merge_adapter` did: the adapter's LoRA spec, the base it merged into, the
    directories written, and the self-check (diff <= tol passes)."""
    spec: dict
    base_source: str
    written: list[Path]
    diff: float
    tol: float
    effect: float

    @property
    def ok(self) -> bool:
        return self.diff <= self.tol


def merge_adapter(adapter: str, out: Path, layouts: list[str], model: str | None = None,
                  backend: str = "auto", console=None) -> AdapterMerge:
    """Merge `adapter` into its base (`model`, default: the recorded one) and write `layouts`
    under `out`. Raises ConfigError, DataError, LoraConfigError or FileNotFoundError on bad
    input."""
    adapted, base, side = load_adapted(adapter, model, backend, console)
    merged = LM.merge_lora(adapted).eval()
    tok = str(Path(adapter) / "tokenizer.json") \
        if (Path(adapter) / "tokenizer.json").is_file() else base.tokenizer_path
    meta = {"adapter": str(Path(adapter).resolve()), "base": base.source,
            "lora": side.get("lora_spec")}
    masks = LM.model_masks(adapted)  # a masked adapter: the merged model stays pruned
    written = write_layouts(merged, out, layouts, tok, meta, masks)
    adapted.eval()
    c = adapted.cfg
    x = torch.randint(4, c.vocab_size, (2, min(64, c.max_seq_len)),
                      generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a = adapted(x)
        m = merged(x)
        with LM.adapters_disabled(adapted):
            b = adapted(x)
    return AdapterMerge(side["lora_spec"], base.source, written, float((a - m).abs().max()),
                        probe_tolerance(adapted, a), float((a - b).abs().max()))


def show_adapter_merge(console, r: AdapterMerge) -> int:
    """Print what `falsify merge --adapter` prints; the exit code (4: self-check failed)."""
    spec = r.spec
    console.print(f"merged {spec['method']} adapter (r={spec['r']}, alpha={spec['alpha']}, "
                  f"targets {','.join(spec['targets'])}) into {r.base_source}")
    for w in r.written:
        console.print(f"  wrote {w}")
    console.print(f"self-check: max |merged − (base+adapter)| = {r.diff:.3g} (tolerance "
                  f"{r.tol:.3g}); the adapter moves the logits by {r.effect:.3g}")
    if not r.ok:
        console.print("[bold red]self-check failed: the merged model does not reproduce "
                      "base+adapter[/]")
        return 4
    return 0
