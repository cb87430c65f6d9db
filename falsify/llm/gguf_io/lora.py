"""Our LoRA adapters as a llama.cpp LoRA adapter GGUF, and reading one back."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from falsify.llm import lora_model as LM
from falsify.llm.gguf_io.common import (
    ARCH,
    GGUFError,
    _gguf,
    _heads_of,
    dequantize,
    gguf_name,
    permute_qk,
)
from falsify.llm.gguf_io.read import _tensor, field_value, open_reader
from falsify.llm.gguf_io.write import _write

ADAPTER_FILE = "adapter.gguf"


def lora_tensors(model) -> tuple[dict[str, np.ndarray], float]:
    """llama.cpp's adapter tensors for an adapted model, as convert_lora_to_gguf.py names and
    shapes them: `blk.N.attn_q.weight.lora_a` = A [r, in], `.lora_b` = B [out, r] (ggml dims
    reversed), B's rows permuted like the base's q/k rows (the delta B·A is a q/k weight), and
    the alpha llama.cpp needs to apply our scale as alpha / r (rsLoRA's α/√r: alpha = α·√r)."""
    cfg = model.cfg
    out, alphas = {}, set()
    for name, mod in LM.adapted_layers(model):
        if not mod.has_adapter:
            continue
        if mod.weight_mask is not None:
            raise GGUFError(f"{name}: a masked adapter (keep_masks) is not a LoRA adapter "
                            "llama.cpp can apply (M ⊙ (s·B·A) is not low rank)")
        base = gguf_name(name + ".weight", cfg.num_layers)
        a = mod.lora_A.weight.detach().to("cpu", torch.float32).contiguous().numpy()
        b = mod.lora_B.weight.detach().to("cpu", torch.float32).contiguous().numpy()
        heads = _heads_of(name + ".weight", cfg)
        if heads is not None:
            b = np.ascontiguousarray(permute_qk(b, heads))
        out[base + ".lora_a"], out[base + ".lora_b"] = a, b
        alphas.add(mod.alpha * math.sqrt(mod.r) if mod.rslora else mod.alpha)
    if not out:
        raise GGUFError("the model carries no LoRA adapter")
    if len(alphas) != 1:  # one adapter.lora.alpha per file
        raise GGUFError(f"the adapters' scales differ ({sorted(alphas)}): one GGUF alpha "
                        "cannot express them")
    return out, alphas.pop()


def write_lora_gguf(model, path: str | Path, name: str = "falsify-lora") -> Path:
    """Our LoRA adapters as a llama.cpp LoRA adapter GGUF (`llama-cli -m base.gguf --lora
    FILE`), f32, written atomically. The base is the GGUF export of the same base model."""
    gguf = _gguf()
    tensors, alpha = lora_tensors(model)

    def fill(w):
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        w.add_name(name)
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        for n, arr in tensors.items():
            w.add_tensor(n, arr)

    return _write({}, Path(path), fill)


def read_lora_gguf(path: str | Path) -> tuple[dict[str, torch.Tensor], float]:
    """(llama.cpp-named float32 tensors as stored, adapter.lora.alpha) of a LoRA adapter GGUF;
    checks the adapter keys and that every lora_a has its lora_b."""
    gguf = _gguf()
    p = Path(path)
    r = open_reader(p)
    for key, want in ((gguf.Keys.General.ARCHITECTURE, ARCH),
                      (gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER),
                      (gguf.Keys.Adapter.TYPE, "lora")):
        got = field_value(r, key, p)
        if got != want:
            raise GGUFError(f"{p}: {key}={got!r}, expected {want!r}")
    alpha = float(field_value(r, gguf.Keys.Adapter.LORA_ALPHA, p))
    tensors = {t.name: _tensor(t, p) for t in r.tensors}
    for n in tensors:
        if not n.endswith((".lora_a", ".lora_b")):
            raise GGUFError(f"{p}: tensor {n} is not a .lora_a / .lora_b tensor")
        twin = n[:-1] + ("b" if n.endswith("a") else "a")
        if twin not in tensors:
            raise GGUFError(f"{p}: tensor {twin} is missing (its pair {n} is present)")
    return {k: dequantize(v) for k, v in tensors.items()}, alpha


# ------------------------------------------------------------------------ a fine-tuning base
