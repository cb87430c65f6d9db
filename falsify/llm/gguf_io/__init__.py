"""Our model as a llama.cpp GGUF LLaMA model, and a GGUF LLaMA model back as ours.

The container is the `gguf` package's (GGUFWriter / GGUFReader); names come from its LLaMA
tensor map (`model.layers.0.self_attn.q_proj.weight` -> `blk.0.attn_q.weight`) and its key
constants (`llama.context_length`, `tokenizer.ggml.tokens`, ...).

RoPE layout. GGML's LLaMA graph rotates adjacent pairs (2i, 2i+1) of each head (rope mode 0,
LLAMA_ROPE_TYPE_NORM); our model, like HF LLaMA, rotates (i, i + D/2) (rotate-half). Within a
head, `permute_qk` moves row i + D/2·j of q_proj/k_proj to row 2i + j — exactly what llama.cpp's
convert_hf_to_gguf.py does to HF checkpoints — so interleaved RoPE on the permuted rows yields
our rotated vector with its components in that same order. q and k are permuted alike, so every
q·k score, hence the attention output, is unchanged; v and o are untouched. Reading inverts it.
tests/test_gguf_io.py checks both RoPE conventions on the file's own weights.

The LM head is tied: there is no `output.weight` (llama.cpp then uses `token_embd.weight`). A
file whose output.weight differs from token_embd.weight is refused on reading.

Tensor types: f32, f16, q8_0 on writing (q8_0 through the contracted `q8_0_quantize`); 1-D
tensors (the norms) always f32, as llama.cpp writes them. Reading keeps q8_0 / q4_k / q6_k
tensors as raw blocks (`QuantTensor`); `dequantize` goes through the contracted torch
dequantizers (falsify/kernels/torch/gguf_quants.py).

The tokenizer is our byte-level BPE (`tokenizers`): `tokenizer.ggml.model = "gpt2"`, pre
`"gpt-2"` (the GPT-2 split regex, which our pre-tokenizer uses), tokens, token types (special
tokens CONTROL, others NORMAL), merges, and <|endoftext|> as bos/eos/pad with nothing added
around a text (add_bos/add_eos false), the same choices as the HF export (falsify/llm/hf.py).

Modules: common (names, the q/k permutation, quantized tensors and `quant_linear`, the one
function that applies a frozen quantized GGUF projection, for a fused kernel to replace), write,
read, base (a GGUF as a fine-tuning base), and lora (llama.cpp LoRA adapter files), which this
package does not import: it reads the adapted model (falsify/llm/lora_model.py), which itself
stands on `common`'s quantized projections, so import it by its own name,
`from falsify.llm.gguf_io import lora`.
"""

from falsify.llm.gguf_io.base import base_model, tokenizer_file
from falsify.llm.gguf_io.common import (
    ARCH,
    DEQUANT,
    WRITE_TYPES,
    GGUFError,
    QuantTensor,
    dequantize,
    encode,
    expected_stored,
    gguf_name,
    our_names,
    permute_qk,
    quant_linear,
    unpermute_qk,
)
from falsify.llm.gguf_io.read import (
    GGUFModel,
    load_model,
    read_gguf,
    stored_mismatches,
    tokenizer_from_metadata,
)
from falsify.llm.gguf_io.write import FILE_TYPES, gguf_tensors, write_gguf

__all__ = ["ARCH", "DEQUANT", "FILE_TYPES", "GGUFError", "GGUFModel", "QuantTensor",
           "WRITE_TYPES", "base_model", "dequantize", "encode", "expected_stored", "gguf_name",
           "gguf_tensors", "load_model", "our_names", "permute_qk", "quant_linear",
           "read_gguf", "stored_mismatches", "tokenizer_file",
           "tokenizer_from_metadata", "unpermute_qk", "write_gguf"]
