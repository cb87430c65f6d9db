"""`falsify quantize [--model BASE] [--method int8|int4|nf4] [--group 32|64|128]
[--asymmetric] [--double-quant] --out DIR`

Without --group, int4 groups by the largest of 128, 64 and 32 that divides every projection's
input width (and says so), so the default fits every model the other defaults build.

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

from pathlib import Path

from rich.console import Console

from falsify.errors import UsageError
from falsify.llm import quantize_stage as QS
from falsify.llm.config import ConfigError
from falsify.llm.data import DataError
from falsify.llm.quantize_model import QuantizeError


def register(sub) -> None:
    p = sub.add_parser("quantize", help="weight-only int8, int4 or NF4 quantization",
                       description="quantize a model's projections (weight-only)")
    p.add_argument("--model", metavar="BASE",
                   help="our checkpoint or an HF LLaMA dir (default: the built-in base)")
    p.add_argument("--method", default="int8", choices=("int8", "int4", "nf4"))
    p.add_argument("--group", type=int, default=None,
                   help="int4: columns per group (32/64/128; default: the largest of them that "
                        "divides every projection's input width)")
    p.add_argument("--asymmetric", action="store_true", help="int4: a zero point per group")
    p.add_argument("--double-quant", action="store_true",
                   help="nf4: quantize the per-block absmax to 8 bits too (QLoRA's double "
                        "quantization)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory: OUT/quantized, OUT/ours, and for nf4 OUT/hf-bnb-nf4 "
                        "(a bitsandbytes 4-bit checkpoint AutoModelForCausalLM loads)")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_quantize)


def cmd_quantize(args) -> int:
    console = Console()
    try:
        r = QS.quantize(args.model, Path(args.out), args.method, args.group, args.asymmetric,
                        args.double_quant, args.backend, console)
    except (QuantizeError, ConfigError, DataError) as e:
        raise UsageError(f"falsify quantize: {e}") from None
    return QS.show_quantized(console, r)
