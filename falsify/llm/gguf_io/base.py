"""A GGUF as a fine-tuning base (falsify/llm/finetune_base.py)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from falsify.harness.files import atomic_write
from falsify.llm.gguf_io.common import QuantTensor, dequantize
from falsify.llm.gguf_io.read import read_gguf
from falsify.llm.model import Transformer, build_model


def tokenizer_file(tok) -> Path:
    """The rebuilt tokenizer as a tokenizer.json the rest of falsify reads (the HF/PEFT exports
    copy it): content-addressed under the temporary directory, written atomically, so the same
    GGUF always yields the same path (rewritten if what lies there is not that content)."""
    text = tok.to_str()
    d = Path(tempfile.gettempdir()) / "falsify-gguf-tokenizers"
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    if not f.is_file() or f.read_text() != text:
        atomic_write(f, text)
    return f


def base_model(path: str | Path, backend: str = "auto") -> tuple[Transformer, object | None]:
    """(model, tokenizer) for fine-tuning on a GGUF: our Transformer with every tensor as float32
    values (embedding and norms stay so, frozen), and `model.gguf_quant` naming the projection
    weights stored quantized in the file (their raw blocks), which lora_model.apply_lora keeps
    quantized instead of the float32 copy."""
    g = read_gguf(path)
    model = build_model(g.config, backend, seed=0)  # seeded: leaves the global RNG alone
    model.load_state_dict({k: dequantize(v) for k, v in g.tensors.items()}, strict=True)
    model.gguf_quant = {k: v for k, v in g.tensors.items()
                        if isinstance(v, QuantTensor) and k.endswith("_proj.weight")}
    return model, g.tokenizer
