"""transformers: RoPE on an integer tensor silently returns integers, the rotation lost.

LlamaRotaryEmbedding.forward returns `cos.to(dtype=x.dtype)`, `sin.to(dtype=x.dtype)`: for
int64 x the table's values in [-1, 1] truncate to 0 or ±1, and apply_rotary_pos_emb's
`q * cos + rotate_half(q) * sin` then runs in int64. No error is raised and the result is
not the rotation of x.

Backs FALSIFY-ROPE-011 (rope) and FALSIFY-ROPE-012 (rope_grouping, the same call per head) of
rope-kernel-v1: every undeclared dtype is refused with a TypeError or ValueError naming it.
Run: python transformers_llama_rope_integer_input.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
D, THETA, POS = 4, 10000.0, 5
X = [3, -2, 1, 4]

config = LlamaConfig(hidden_size=D, num_attention_heads=1, num_key_value_heads=1, head_dim=D,
                     rope_parameters={"rope_type": "default", "rope_theta": THETA})
rotary = LlamaRotaryEmbedding(config)
q = torch.tensor(X, dtype=torch.int64).reshape(1, 1, 1, D)
true = []
for k in range(D // 2):
    a = POS * mpmath.power(THETA, mpmath.mpf(-2 * k) / D)
    true.append((k, mpmath.mpf(X[k]) * mpmath.cos(a) - X[k + D // 2] * mpmath.sin(a)))
    true.append((k + D // 2, mpmath.mpf(X[k + D // 2]) * mpmath.cos(a) + X[k] * mpmath.sin(a)))
true = [v for _, v in sorted(true)]

print("case FALSIFY-ROPE-011 / FALSIFY-ROPE-012: int64 q")
print(f"input:   q = {X} (int64) as [1, 1, 1, {D}], position_ids [[{POS}]], rope_theta {THETA:g}")
try:
    cos, sin = rotary(q, torch.tensor([[POS]]))
    y, _ = apply_rotary_pos_emb(q, q, cos, sin)
except (TypeError, ValueError) as e:
    named = "int64" in str(e) or "Long" in str(e)
    print(f"library: transformers {VERSION}: refused: {type(e).__name__}: {e}")
    print(f"true:    {[mpmath.nstr(t, 10) for t in true]}")
    print("bound:   a TypeError or ValueError naming the dtype")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
got = y.flatten().tolist()
err = max(abs(mpmath.mpf(g) - t) for g, t in zip(got, true))
print(f"library: transformers {VERSION}: cos/sin {cos.dtype} = {cos.flatten().tolist()} / "
      f"{sin.flatten().tolist()}; apply_rotary_pos_emb -> {got} ({y.dtype}), no error")
print(f"true:    {[mpmath.nstr(t, 10) for t in true]}")
print("bound:   a TypeError or ValueError naming int64 (rope-kernel-v1 declares float32 and "
      "float16); a computed rotation would be exact to float32 rounding")
print(f"error:   accepted; max |result - rotation| = {mpmath.nstr(err, 6)}")
bad = err > 1e-5
print("verdict:", "REPRODUCES: integer input accepted, rotation lost" if bad
      else "does not reproduce")
sys.exit(1 if bad else 0)
