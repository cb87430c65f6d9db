"""`falsify quantize [--model BASE] [--method int8|int4|nf4] [--group 32|64|128]
[--asymmetric] [--double-quant] --out DIR`

Weight-only quantization of every attention and MLP projection with the contract-checked
kernels (falsify/llm/quantize_model.py has the layout). Writes OUT/quantized (the codes, scales and
zero points, with `quantization.json`) and OUT/ours (the dequantized float32 model, a `--model`
for every other command), and reports the held-out perplexity of the original and the
dequantized model and the sizes on disk. Without --model it quantizes the built-in base.
With --method nf4 it also writes OUT/hf-bnb-nf4: a pre-quantized Hugging Face checkpoint that
`AutoModelForCausalLM.from_pretrained` loads with bitsandbytes as 4-bit NF4 Linear4bit layers
(config.json's quantization_config, the packed weights with their quant_state; tokenizer files
included) and that decodes to exactly OUT/ours' weights.
The command reads its own output back: the dequantized model must be bit-identical to the
kernels' round trip of every projection, and OUT/hf-bnb-nf4 must decode to the same tensors
(exit 4 otherwise). Exit codes: 0 done, 2 bad input, 4 self-check failed.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from falsify.errors import UsageError


def register(sub) -> None:
    p = sub.add_parser("quantize", help="weight-only int8, int4 or NF4 quantization",
                       description="quantize a model's projections (weight-only)")
    p.add_argument("--model", metavar="BASE",
                   help="our checkpoint or an HF LLaMA dir (default: the built-in base)")
    p.add_argument("--method", default="int8", choices=("int8", "int4", "nf4"))
    p.add_argument("--group", type=int, default=128, help="int4: columns per group (32/64/128)")
    p.add_argument("--asymmetric", action="store_true", help="int4: a zero point per group")
    p.add_argument("--double-quant", action="store_true",
                   help="nf4: quantize the per-block absmax to 8 bits too (QLoRA's double "
                        "quantization)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: OUT/quantized, OUT/ours, and for nf4 OUT/hf-bnb-nf4 "
                        "(a bitsandbytes 4-bit checkpoint AutoModelForCausalLM loads)")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_quantize)


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*.safetensors")) / 2**20


def _self_check(model, deq, args, spec, out: Path) -> list[str]:
    """The tensors whose decoded form is not exactly the kernels' round trip of the original
    (and, for nf4, the bitsandbytes checkpoint's tensors that differ from the dequantized
    model): a quantized directory is trusted only when this is empty."""
    import torch

    from falsify.kernels.torch import nf4 as nf4_kernel
    from falsify.kernels.torch import quantize as q_kernel
    from falsify.llm import quantize_model as Q
    from falsify.llm.prune import projection_weights

    bad = []
    got = projection_weights(deq)
    for name, w in projection_weights(model).items():
        w = w.detach().float().cpu()
        if args.method == "int8":
            want = q_kernel.int8_roundtrip(w)
        elif args.method == "int4":
            want = q_kernel.int4_roundtrip(w, args.group, spec.symmetric)
        else:
            want = nf4_kernel.nf4_roundtrip(w, Q.NF4_BLOCK, spec.double_quant)
        if not torch.equal(got[name].detach().cpu(), want):
            bad.append(name)
    if args.method == "nf4":
        # the bitsandbytes checkpoint decodes (by our kernel) to exactly the dequantized model
        hf_state = Q.read_hf_bnb(out / Q.BNB_DIR)
        ours = deq.state_dict()
        bad += sorted(f"{Q.BNB_DIR}:{k}" for k in set(ours) | set(hf_state)
                      if k not in ours or k not in hf_state
                      or not torch.equal(ours[k].detach().cpu(), hf_state[k]))
    return bad


def cmd_quantize(args) -> int:

    from falsify.cli.merge import write_ours
    from falsify.llm import evaluate as EV
    from falsify.llm import finetune as FT
    from falsify.llm import quantize_model as Q
    from falsify.llm.config import ConfigError
    from falsify.llm.data import DataError

    console = Console()
    spec = Q.QuantSpec(args.method, args.group, not args.asymmetric, args.double_quant)
    out = Path(args.out)
    try:
        spec.validate()
        if args.asymmetric and args.method != "int4":
            raise Q.QuantizeError("--asymmetric goes with --method int4")
        base = FT.base_or_builtin(args.model, args.backend, console)
        model = base.model
        Q.quantize_model(model, spec, out / "quantized", base.tokenizer_path)
        deq = Q.dequantize_model(out / "quantized")
        write_ours(deq, out / "ours", base.tokenizer_path,
                   {"quantized_from": base.source, "method": args.method,
                    "group": args.group, "symmetric": spec.symmetric,
                    "double_quant": spec.double_quant})
        if args.method == "nf4":
            Q.export_hf_bnb(out / "quantized", out / Q.BNB_DIR, base.tokenizer_path)
    except (Q.QuantizeError, ConfigError, DataError) as e:
        raise UsageError(f"falsify quantize: {e}") from None
    bad = _self_check(model, deq, args, spec, out)
    report = {"from": base.source, "method": args.method, "group": args.group,
              "double_quant": spec.double_quant,
              "symmetric": spec.symmetric,
              "size_mb": {"original_fp32": _size_mb(out / "ours"),
                          "quantized": _size_mb(out / "quantized")}}
    if base.tokenizer is not None:
        texts = [p.prompt + p.canonical_solution for p in EV.load_problems()]
        report["perplexity_before"] = EV.perplexity(model, base.tokenizer, texts)["perplexity"]
        report["perplexity_after"] = EV.perplexity(deq, base.tokenizer, texts)["perplexity"]
    (out / "quantize.json").write_text(json.dumps(report, indent=1))
    t = Table(title=f"falsify quantize: {args.method}"
              + (f", group {args.group}, {'symmetric' if spec.symmetric else 'asymmetric'}"
                 if args.method == "int4" else ""))
    t.add_column("")
    t.add_column("value", justify="right")
    for k in ("perplexity_before", "perplexity_after"):
        if k in report:
            t.add_row(k.replace("_", " ") + " (held-out code)", f"{report[k]:.3f}")
    t.add_row("size on disk, fp32 → quantized (MB)",
              f"{report['size_mb']['original_fp32']:.2f} → {report['size_mb']['quantized']:.2f}")
    console.print(t)
    wrote = [out / "quantized", out / "ours"] + ([out / Q.BNB_DIR] if args.method == "nf4"
                                                 else [])
    console.print(f"wrote {', '.join(map(str, wrote))} and {out / 'quantize.json'}")
    if bad:
        console.print(f"[bold red]self-check failed:[/] {len(bad)} tensor(s) decode to "
                      f"something other than the kernels' round trip: {', '.join(bad[:3])}")
        return 4
    console.print("self-check: every projection decodes bit for bit to the kernels' round trip")
    return 0
