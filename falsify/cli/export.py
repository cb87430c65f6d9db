"""`falsify export SRC --out DIR [--format hf|gguf] [--gguf-type f32|f16|q8_0] [--tokenizer FILE]`

Writes a model others load, from anything falsify produced:

- a pretraining run, one of its checkpoints, or `falsify merge`'s `ours` output → DIR in the
  Hugging Face LLaMA layout (falsify/llm/hf.py): weights, config.json, generation_config.json and
  the tokenizer files, so `AutoModelForCausalLM.from_pretrained(DIR)` and
  `AutoTokenizer.from_pretrained(DIR)` work unchanged;
- an adapter written by `falsify finetune` → DIR/base, the HF-layout base with the weights the
  adapter was trained against (the NF4 dequantization for QLoRA), and DIR/adapter, the PEFT
  adapter whose base_model_name_or_path names DIR/base, so
  `AutoPeftModelForCausalLM.from_pretrained(DIR/adapter)` works unchanged.

- a pretraining run, checkpoint or merge output with `--format gguf` (or `--gguf`) → one
  llama.cpp GGUF LLaMA file (falsify/llm/gguf_io/write.py): weights as f32, f16 or q8_0
  (`--gguf-type`; norms stay f32), config and tokenizer in the metadata, so `llama-cli -m FILE`
  loads it.

DIR (or FILE) appears whole or not at all (written beside it, then renamed into place). The
command then reads its own output back and checks every tensor is bit-identical to the source's
(for GGUF: to the source stored the same way — its fp16 rounding, its q8_0 blocks). A pretraining
checkpoint does not store its tokenizer: it is found again from the run's data spec, as
`falsify finetune --model` does; a run on the synthetic corpus has none, and the export says so
(--tokenizer supplies one). Exit codes: 0 done, 2 bad input, 4 self-check failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console

from falsify.errors import UsageError

FORMATS = ("hf", "gguf")
GGUF_TYPES = ("f32", "f16", "q8_0")


def register(sub) -> None:
    p = sub.add_parser("export", help="write a checkpoint or adapter as HF or GGUF files",
                       description="export a checkpoint or adapter in the Hugging "
                       "Face layout, or a model as a llama.cpp GGUF file")
    p.add_argument("src", metavar="SRC",
                   help="a run dir, a checkpoint dir, `falsify merge` output, an HF or GGUF "
                   "model, or an adapter dir")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory (a .gguf file for --format gguf)")
    p.add_argument("--format", default=None, choices=FORMATS, help="output layout (default hf)")
    p.add_argument("--gguf", action="store_true", help="shorthand for --format gguf")
    p.add_argument("--gguf-type", default=None, choices=GGUF_TYPES,
                   help="GGUF tensor type of the 2-D weights (default f32; norms stay f32)")
    p.add_argument("--tokenizer", metavar="FILE",
                   help="tokenizer.json to ship when SRC has none of its own")
    p.set_defaults(func=cmd_export)


def _tensors_equal(a: dict, b: dict) -> list[str]:
    """Names whose tensors differ (or are missing on one side)."""
    return sorted(k for k in set(a) | set(b)
                  if k not in a or k not in b or not torch.equal(a[k].float(), b[k].float()))


def _no_tokenizer(base) -> str:
    """Why an export ships no tokenizer: a pretraining run's is recovered from its corpus
    whenever it has one, so the cases left are a run on synthetic ids and a model saved
    without its tokenizer.json."""
    if base.info.get("corpus") == "synthetic":
        return f"{base.source} was trained on the synthetic corpus (token ids, no tokenizer)"
    return f"no tokenizer.json found with {base.source}"


def _export_model(src: Path, out: Path, tokenizer: str | None, console) -> int:
    from falsify.llm import finetune as FT
    from falsify.llm import hf

    base = FT.load_base(src, "torch", need_tokenizer=False, tokenizer=tokenizer)
    if base.layout == "hf":
        raise UsageError(f"{src} is already in the HF layout (config.json + model.safetensors)")
    tok = tokenizer or base.tokenizer_path
    hf.export_hf(base.model, out, tok)
    console.print(f"wrote {out} (HF LLaMA layout) from {base.source}")
    if tok is None:
        console.print(f"note: {_no_tokenizer(base)}: weights and config only; pass --tokenizer "
                      "FILE to include one")
    back = hf.import_hf(out, "torch").state_dict()
    bad = _tensors_equal(back, base.model.state_dict())
    return _verdict(bad, console)


def _export_gguf(src: Path, out: Path, tokenizer: str | None, gtype: str, console) -> int:
    from falsify.llm import finetune as FT
    from falsify.llm import gguf_io

    base = FT.load_base(src, "torch", need_tokenizer=False, tokenizer=tokenizer)
    tok = tokenizer or base.tokenizer_path
    gguf_io.write_gguf(base.model, out, tok, gtype, name=src.resolve().name)
    console.print(f"wrote {out} (GGUF, llama, {gtype}) from {base.source}")
    if tok is None:
        console.print(f"note: {_no_tokenizer(base)}: tokenizer.ggml.model = none; pass "
                      "--tokenizer FILE to include one")
    return _verdict(gguf_io.stored_mismatches(base.model, out, gtype), console)


def _export_adapter(src: Path, out: Path, tokenizer: str | None, console) -> int:
    from falsify.cli.merge import load_adapted
    from falsify.llm import hf
    from falsify.llm import lora_model as LM
    from falsify.llm.checkpoint import atomic_dir

    model, base, side = load_adapted(src, None, "torch", console)
    tok = tokenizer or (str(src / "tokenizer.json") if (src / "tokenizer.json").is_file()
                        else base.tokenizer_path)
    plain = LM.base_as_trained(model)
    final = out.resolve()

    def fill(tmp: Path):
        hf.export_hf(plain, tmp / "base", tok)
        LM.export_peft(model, tmp / "adapter", str(final / "base"), tok,
                       meta={k: v for k, v in side.items() if k not in ("lora_spec", "model")})

    atomic_dir(final, fill)
    spec = side["lora_spec"]
    console.print(f"wrote {final / 'base'} (HF LLaMA layout: the base the {spec['method']} "
                  "adapter was trained against)")
    console.print(f"wrote {final / 'adapter'} (PEFT; base_model_name_or_path = {final / 'base'})")
    back = hf.import_hf(final / "base", "torch").state_dict()
    bad = _tensors_equal(back, plain.state_dict())
    _, tensors, _ = LM.read_adapter(final / "adapter")
    bad += _tensors_equal(tensors, LM.adapter_parameters(model))
    return _verdict(bad, console)


def _verdict(bad: list[str], console) -> int:
    if bad:
        console.print(f"[bold red]self-check failed:[/] {len(bad)} tensor(s) read back differ "
                      f"from the source: {', '.join(bad[:5])}")
        return 4
    console.print("self-check: every tensor read back is bit-identical to the source")
    return 0


def cmd_export(args) -> int:
    from falsify.llm import lora_model as LM
    from falsify.llm.checkpoint import CheckpointError
    from falsify.llm.config import ConfigError
    from falsify.llm.data import DataError
    from falsify.llm.model import ModelConfigError

    console = Console()
    src, out = Path(args.src), Path(args.out)
    if args.gguf and args.format not in (None, "gguf"):
        raise UsageError(f"falsify export: --gguf contradicts --format {args.format}")
    fmt = "gguf" if args.gguf else (args.format or "hf")
    if args.gguf_type is not None and fmt != "gguf":
        raise UsageError("falsify export: --gguf-type applies to --format gguf only")
    if not src.exists():
        raise UsageError(f"falsify export: {src}: no such file or directory")
    if args.tokenizer and not Path(args.tokenizer).is_file():
        raise UsageError(f"falsify export: --tokenizer {args.tokenizer}: no such file")
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise UsageError(f"falsify export: --out {out} lies inside SRC {src}")
    from falsify.llm.gguf_io import GGUFError

    try:
        if fmt == "gguf":
            if (src / LM.ADAPTER_CONFIG).is_file():
                raise UsageError(f"falsify export: {src} is an adapter: `falsify finetune` "
                                 "writes its GGUF form (adapter.gguf) beside it")
            if out.is_dir():
                raise UsageError(f"falsify export: --out {out} is a directory; GGUF is one file")
            return _export_gguf(src, out, args.tokenizer, args.gguf_type or "f32", console)
        if (src / LM.FALSIFY_META).is_file():
            return _export_adapter(src, out, args.tokenizer, console)
        if (src / LM.ADAPTER_CONFIG).is_file():
            raise UsageError(f"falsify export: {src} is a PEFT adapter without "
                             f"{LM.FALSIFY_META}: not one `falsify finetune` wrote")
        return _export_model(src, out, args.tokenizer, console)
    except (ConfigError, DataError, LM.LoraConfigError, CheckpointError, ModelConfigError,
            GGUFError, json.JSONDecodeError) as e:
        raise UsageError(f"falsify export: {e}") from None
