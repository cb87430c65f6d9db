"""The library half of `falsify quantize` (falsify/cli/quantize.py parses and prints; `falsify
pipeline`'s quantize stage calls `quantize` directly): quantize every projection with the
contract-checked kernels, write OUT/quantized, OUT/ours (and for nf4 OUT/hf-bnb-nf4) and
OUT/quantize.json, and read the output back: the dequantized model must be bit-identical to the
kernels' round trip of every projection, and OUT/hf-bnb-nf4 must decode to the same tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.table import Table

from falsify.kernels.torch import nf4 as nf4_kernel
from falsify.kernels.torch import quantize as q_kernel
from falsify.llm import evaluate as EV
from falsify.llm import finetune as FT
from falsify.llm import quantize_model as Q
from falsify.llm.merge_stage import write_ours
from falsify.llm.prune import projection_weights


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*.safetensors")) / 2**20


def self_check(model, deq, spec: Q.QuantSpec, out: Path) -> list[str]:
    """The tensors whose decoded form is not exactly the kernels' round trip of the original
    (and, for nf4, the bitsandbytes checkpoint's tensors that differ from the dequantized
    model): a quantized directory is trusted only when this is empty."""
    bad = []
    got = projection_weights(deq)
    for name, w in projection_weights(model).items():
        w = w.detach().float().cpu()
        if spec.method == "int8":
            want = q_kernel.int8_roundtrip(w)
        elif spec.method == "int4":
            want = q_kernel.int4_roundtrip(w, spec.group, spec.symmetric)
        else:
            want = nf4_kernel.nf4_roundtrip(w, Q.NF4_BLOCK, spec.double_quant)
        if not torch.equal(got[name].detach().cpu(), want):
            bad.append(name)
    if spec.method == "nf4":
        # the bitsandbytes checkpoint decodes (by our kernel) to exactly the dequantized model
        hf_state = Q.read_hf_bnb(out / Q.BNB_DIR)
        ours = deq.state_dict()
        bad += sorted(f"{Q.BNB_DIR}:{k}" for k in set(ours) | set(hf_state)
                      if k not in ours or k not in hf_state
                      or not torch.equal(ours[k].detach().cpu(), hf_state[k]))
    return bad


@dataclass
class Quantized:
    """What `quantize` did: the spec, OUT/quantize.json's report, the tensors that failed the
    self-check (empty passes) and the output directory."""
    spec: Q.QuantSpec
    report: dict
    bad: list[str]
    out: Path


def _group(group: int | None, method: str, m, console) -> int:
    """The int4 group size: `group` if given, else the largest of 128/64/32 dividing every
    projection's input width (said on `console`); other methods keep QuantSpec's default."""
    if group is not None or method != "int4":
        return Q.QuantSpec.group if group is None else group
    group = Q.default_group(m)
    if console is not None:
        console.print(f"int4: group {group} (no --group given: the largest of 128/64/32 that "
                      f"divides every projection's input width)")
    return group


def quantize(model: str | None, out: Path, method: str = "int8", group: int | None = None,
             asymmetric: bool = False, double_quant: bool = False, backend: str = "auto",
             console=None) -> Quantized:
    """Quantize `model` (default: the built-in base) into `out`; int4 without `group` uses the
    largest of 128/64/32 that fits the model (quantize_model.default_group). Raises
    QuantizeError, ConfigError or DataError on bad input."""
    Q.QuantSpec(method, Q.QuantSpec.group if group is None else group, not asymmetric,
                double_quant).validate()
    if asymmetric and method != "int4":
        raise Q.QuantizeError("--asymmetric goes with --method int4")
    base = FT.base_or_builtin(model, backend, console)
    m = base.model
    group = _group(group, method, m, console)
    spec = Q.QuantSpec(method, group, not asymmetric, double_quant)
    Q.quantize_model(m, spec, out / "quantized", base.tokenizer_path)
    deq = Q.dequantize_model(out / "quantized")
    write_ours(deq, out / "ours", base.tokenizer_path,
               {"quantized_from": base.source, "method": method,
                "group": group, "symmetric": spec.symmetric,
                "double_quant": spec.double_quant})
    if method == "nf4":
        Q.export_hf_bnb(out / "quantized", out / Q.BNB_DIR, base.tokenizer_path)
    bad = self_check(m, deq, spec, out)
    report = {"from": base.source, "method": method, "group": group,
              "double_quant": spec.double_quant,
              "symmetric": spec.symmetric,
              "size_mb": {"original_fp32": _size_mb(out / "ours"),
                          "quantized": _size_mb(out / "quantized")}}
    if base.tokenizer is not None:
        texts = [p.prompt + p.canonical_solution for p in EV.load_problems()]
        report["perplexity_before"] = EV.perplexity(m, base.tokenizer, texts)["perplexity"]
        report["perplexity_after"] = EV.perplexity(deq, base.tokenizer, texts)["perplexity"]
    (out / "quantize.json").write_text(json.dumps(report, indent=1))
    return Quantized(spec, report, bad, out)


def show_quantized(console, r: Quantized) -> int:
    """Print what `falsify quantize` prints; the exit code (4: self-check failed)."""
    spec, report, out = r.spec, r.report, r.out
    t = Table(title=f"falsify quantize: {spec.method}"
              + (f", group {spec.group}, {'symmetric' if spec.symmetric else 'asymmetric'}"
                 if spec.method == "int4" else ""))
    t.add_column("")
    t.add_column("value", justify="right")
    for k in ("perplexity_before", "perplexity_after"):
        if k in report:
            t.add_row(k.replace("_", " ") + " (held-out code)", f"{report[k]:.3f}")
    t.add_row("size on disk, fp32 → quantized (MB)",
              f"{report['size_mb']['original_fp32']:.2f} → {report['size_mb']['quantized']:.2f}")
    console.print(t)
    wrote = [out / "quantized", out / "ours"] + ([out / Q.BNB_DIR] if spec.method == "nf4"
                                                 else [])
    console.print(f"wrote {', '.join(map(str, wrote))} and {out / 'quantize.json'}")
    if r.bad:
        console.print(f"[bold red]self-check failed:[/] {len(r.bad)} tensor(s) decode to "
                      f"something other than the kernels' round trip: {', '.join(r.bad[:3])}")
        return 4
    console.print("self-check: every projection decodes bit for bit to the kernels' round trip")
    return 0
