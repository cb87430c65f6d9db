"""transformers: LlamaAttention with head_dim = 0 fails with ZeroDivisionError.

LlamaAttention.__init__ sets `self.scaling = self.head_dim**-0.5`, which raises Python's
ZeroDivisionError ('0.0 cannot be raised to a negative power') for head_dim = 0, instead of
a ValueError that says the head dimension must be positive. Batches, groups and sequences of
size 0 pass through eager_attention_forward as empty results.

Backs FALSIFY-ATT-036 (attention-kernel-v1, size 0: d = 0 raises a ValueError naming d = 0),
eager_attention_forward binding.
Run: python transformers_llama_attention_head_dim_zero.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention

VERSION = importlib.metadata.version("transformers")
config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=0)
print("case FALSIFY-ATT-036: d = 0")
print("input:   LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, "
      "head_dim=0); LlamaAttention(config, layer_idx=0)")
try:
    LlamaAttention(config, layer_idx=0)
    outcome, ok = "built without an error", False
except ValueError as e:
    outcome = f"ValueError: {e}"
    ok = "head_dim" in str(e) or "d = 0" in str(e)
except Exception as e:  # noqa: BLE001 - the finding is which exception this is
    outcome, ok = f"{type(e).__name__}: {e}", False
print(f"library: transformers {VERSION}: {outcome}")
print("true:    d = 0 is outside the domain (q·k is an empty sum, 1/sqrt(d) infinite)")
print("bound:   a ValueError naming d = 0 (head_dim), before any work")
print(f"error:   {'none' if ok else outcome}")
print("verdict:", "does not reproduce: a ValueError naming the dim" if ok
      else "REPRODUCES: not a ValueError naming d = 0")
sys.exit(0 if ok else 1)
