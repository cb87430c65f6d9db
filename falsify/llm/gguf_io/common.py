"""Shared by the GGUF modules: the error, the `gguf` import, llama.cpp tensor names, the
q/k row permutation (see the package docstring for why) and quantized tensors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from falsify.kernels.torch import gguf_quants as GQ
from falsify.llm.model import ModelConfig, Transformer

ARCH = "llama"
WRITE_TYPES = ("f32", "f16", "q8_0")


class GGUFError(ValueError):
    """A GGUF file we cannot read or write as our model; the message names the file and the
    key or tensor."""


def _gguf():
    try:
        import gguf
    except ImportError as e:  # the `interop` extra
        raise GGUFError("the `gguf` package is needed for GGUF files: pip install "
                        "'falsify[interop]'") from e
    return gguf


# ----------------------------------------------------------------------------------- names
def _name_map(n_layers: int):
    gguf = _gguf()
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)


def gguf_name(ours: str, n_layers: int) -> str:
    """Our parameter name (HF's without "model.") -> llama.cpp's tensor name."""
    name = _name_map(n_layers).get_name("model." + ours, try_suffixes=(".weight",))
    if name is None:
        raise GGUFError(f"no llama.cpp tensor name for parameter {ours!r}")
    return name  # the matched suffix (".weight") is kept


def our_names(cfg: ModelConfig) -> dict[str, str]:
    """llama.cpp tensor name -> our parameter name, for every tensor of a model of `cfg`."""
    with torch.device("meta"):
        names = list(Transformer(cfg, backend="torch").state_dict())
    return {gguf_name(n, cfg.num_layers): n for n in names}


def _heads_of(ours: str, cfg: ModelConfig) -> int | None:
    """Heads whose rows RoPE rotates: q_proj -> num_heads, k_proj -> num_kv_heads, else None."""
    if ours.endswith("self_attn.q_proj.weight"):
        return cfg.num_heads
    if ours.endswith("self_attn.k_proj.weight"):
        return cfg.num_kv_heads
    return None


def permute_qk(w, n_head: int):
    """Rows of a q/k projection (or its LoRA B) from rotate-half to GGML's interleaved order:
    row h·D + j·D/2 + i -> h·D + 2i + j (llama.cpp convert_hf_to_gguf's permute). Works on any
    row-major [rows, ...] tensor or array, raw quant blocks included (rows stay whole)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute_qk(w, n_head: int):
    """Inverse of permute_qk."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


# ----------------------------------------------------------------------------- quantized
@dataclass
class QuantTensor:
    """A tensor kept in a GGUF block format: `blocks` uint8 [rows, row_bytes] (each row whole
    blocks), `qtype` "q8_0" | "q4_k" | "q6_k", `shape` the logical (rows, cols)."""
    blocks: torch.Tensor
    qtype: str
    shape: tuple[int, int]


DEQUANT = {"q8_0": GQ.q8_0_dequantize, "q4_k": GQ.q4_k_dequantize, "q6_k": GQ.q6_k_dequantize}


def dequantize(t) -> torch.Tensor:
    """float32 values of a QuantTensor (contracted dequantizers), or of a plain tensor."""
    if isinstance(t, QuantTensor):
        out = DEQUANT[t.qtype](t.blocks)
        if tuple(out.shape) != tuple(t.shape):
            raise GGUFError(f"{t.qtype} blocks decode to {tuple(out.shape)}, expected {t.shape}")
        return out
    return t.float()


def quant_linear(x: torch.Tensor, blocks: torch.Tensor, qtype: str,
                 shape: tuple[int, int]) -> torch.Tensor:
    """y = x·dequant(W)ᵀ for a frozen GGUF-quantized weight, through the contracted fused
    dequantize-matmul (gguf-quants-kernel-v1's `dequant_matmul`: W decoded a chunk at a time,
    never whole in fp32). The one place a quantized GGUF projection is applied. No gradient
    reaches W (uint8 blocks); x's gradient is dy·W, decoded the same way."""
    n, k = shape
    return GQ.dequant_matmul(x, blocks, qtype, n, k)


def encode(w: torch.Tensor, gtype: str, name: str = "tensor"):
    """A float32 tensor as stored for `gtype` (1-D tensors always f32): (numpy array,
    GGMLQuantizationType or None for plain float arrays)."""
    gguf = _gguf()
    w = w.detach().to("cpu", torch.float32).contiguous()
    if not bool(torch.isfinite(w).all()):
        raise GGUFError(f"tensor {name}: non-finite values (a diverged model?)")
    if w.dim() == 1 or gtype == "f32":
        return w.numpy(), None
    if gtype == "f16":
        h = w.to(torch.float16)
        if bool(torch.isinf(h).any()):
            raise GGUFError(f"tensor {name}: max |w| = {float(w.abs().max()):.6g} is beyond fp16 "
                            "(65504); use --gguf-type f32")
        return h.numpy(), None
    if gtype == "q8_0":
        if w.dim() != 2 or w.shape[1] % 32:
            raise GGUFError(f"tensor {name}: shape {tuple(w.shape)} has rows that are not whole "
                            "32-value q8_0 blocks; use --gguf-type f16 or f32")
        try:
            return GQ.q8_0_quantize(w).numpy(), gguf.GGMLQuantizationType.Q8_0
        except ValueError as e:  # a block scale beyond fp16
            raise GGUFError(f"tensor {name}: {e}; use --gguf-type f32") from None
    raise GGUFError(f"GGUF tensor type {gtype!r} is not one we write (known: "
                    f"{', '.join(WRITE_TYPES)})")


def expected_stored(w: torch.Tensor, gtype: str) -> torch.Tensor:
    """What reading back a tensor written as `gtype` must give, bit for bit: the source for f32
    and 1-D tensors, its fp16 rounding for f16, the q8_0 blocks for q8_0."""
    arr, _ = encode(w, gtype)
    return torch.from_numpy(np.ascontiguousarray(arr))
