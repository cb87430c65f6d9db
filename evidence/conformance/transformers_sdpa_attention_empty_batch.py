"""transformers: sdpa_attention_forward crashes on a batch of size 0.

sdpa_attention_forward ends with `attn_output.reshape(attn_output.shape[0], -1, q_length,
value.shape[-1])` (after transposing), and -1 cannot be inferred from a tensor of 0 elements:
RuntimeError 'cannot reshape tensor of 0 elements into shape [0, -1, 3, 4]'.
torch.nn.functional.scaled_dot_product_attention itself returns the empty result. The same
reshape fails for s = 0 and d = 0.

Backs FALSIFY-ATT-036 (attention-kernel-v1, size 0: b = 0 returns the reference's empty
result), sdpa_attention_forward binding.
Run: python transformers_sdpa_attention_empty_batch.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import LlamaAttention

VERSION = importlib.metadata.version("transformers")
config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4)
config._attn_implementation = "sdpa"
attn = LlamaAttention(config, layer_idx=0).eval()
q = torch.zeros(0, 2, 3, 4)  # [b, heads, s, d], b = 0
k = v = torch.zeros(0, 1, 3, 4)
ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
print("case FALSIFY-ATT-036: b = 0")
print("input:   q zeros [0, 2, 3, 4], k = v zeros [0, 1, 3, 4] (float32), is_causal=True, "
      "the LlamaAttention module of a 2-query / 1-key-value-head config")
try:
    out, _ = sdpa_attention_forward(attn, q, k, v, None, is_causal=True)
    outcome, ok = f"result of shape {tuple(out.shape)}", tuple(out.shape) == tuple(ref.shape)
except Exception as e:  # noqa: BLE001 - the finding is this exception
    outcome, ok = f"{type(e).__name__}: {e}", False
print(f"library: transformers {VERSION}: sdpa_attention_forward(...): {outcome}")
print(f"true:    an empty result of shape {tuple(ref.shape)} ([b, s, h, d]; "
      f"F.scaled_dot_product_attention returns {tuple(ref.transpose(1, 2).shape)})")
print("bound:   the empty result, no error")
print(f"error:   {'none' if ok else outcome}")
print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: b = 0 crashes'}")
sys.exit(0 if ok else 1)
