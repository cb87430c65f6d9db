"""transformers: eager_attention_forward rounds large fp16 attention scores before the softmax.

eager_attention_forward computes `torch.matmul(query, key_states.transpose(2, 3)) * scaling`
in the query dtype: for fp16 the product q·kᵀ (here up to ~85) is rounded to fp16, an
absolute error of up to 2^-11·|s| (0.03 at |s| = 64) in the exponent of the softmax, which
moves the probabilities by ~3 % relative; the fp32 softmax is then rounded to fp16
(`.to(query.dtype)`) before the fp16 product with V. With fp32 scores the output is within
the contract's bound; ordinary logits (|q|, |k| ≤ 1) pass in fp16 too.

Backs FALSIFY-ATT-002/float16 (attention-kernel-v1: parity at large logits),
eager_attention_forward binding.
Run: python transformers_eager_attention_fp16_scores.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
import sys

import mpmath
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaAttention, eager_attention_forward

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS16, U32 = 2.0 ** -10, 1.2e-7

Q = [[[[3.177734375, 4.76171875, 6.21484375, 5.703125],
       [0.1881103515625, -2.14453125, 0.80419921875, -2.966796875]]]]
K = [[[[0.07568359375, 3.068359375, 4.28515625, 3.69921875],
       [7.07421875, -3.828125, 4.32421875, 5.80859375]]]]
V = [[[[-0.6142578125, -0.5966796875, 0.0223236083984375, -0.67578125],
       [0.81494140625, 0.77392578125, 0.0187530517578125, -0.640625]]]]
S, D = 2, 4

config = LlamaConfig(hidden_size=D, num_attention_heads=1, num_key_value_heads=1, head_dim=D)
attn = LlamaAttention(config, layer_idx=0).eval()  # eager_attention_forward reads its attributes
q, k, v = (torch.tensor(t, dtype=torch.float16) for t in (Q, K, V))
out, _ = eager_attention_forward(attn, q, k, v, None, scaling=attn.scaling)  # [b, s, h, d]
got = out[0, :, 0, :].flatten().tolist()

# exact softmax(q·kᵀ/√d)·V, no mask
true = []
for i in range(S):
    sc = [mpmath.fsum(mpmath.mpf(a) * b for a, b in zip(Q[0][0][i], K[0][0][j])) / mpmath.sqrt(D)
          for j in range(S)]
    mx = max(sc)
    w = [mpmath.exp(x - mx) for x in sc]
    tot = mpmath.fsum(w)
    true += [mpmath.fsum(w[j] / tot * V[0][0][j][c] for j in range(S)) for c in range(D)]
# FALSIFY-ATT-002 float16 tolerance (attention-kernel-v1.yaml): atol
# eps16 + (128·(d + 1)·√d + 2·s + 6)·1.2e-7: fp32 scores with |q·k| ≤ 64·d, their error
# through the softmax, the fp32 sums, ONE rounding of the output to fp16
bound = EPS16 + (128 * (D + 1) * math.sqrt(D) + 2 * S + 6) * U32
errs = [abs(mpmath.mpf(g) - t) for g, t in zip(got, true)]
j = max(range(len(errs)), key=lambda i: errs[i])
print("case FALSIFY-ATT-002/float16: attention output with large scores")
print(f"input:   q = {Q}, k = {K}, v = {V} (float16, [b, h, s, d] = [1, 1, {S}, {D}]), "
      f"no mask, scaling = head_dim**-0.5")
print(f"library: transformers {VERSION}: eager_attention_forward(...)[0] = {got}; "
      f"element {j} = {got[j]!r}")
print(f"true:    element {j} = {mpmath.nstr(true[j], 12)} "
      f"(all: {[mpmath.nstr(t, 8) for t in true]})")
print(f"bound:   {bound:.6g}")
print(f"error:   {mpmath.nstr(errs[j], 6)} ({sum(e > bound for e in errs)} of {len(errs)} "
      "elements beyond)")
bad = errs[j] > bound
print(f"verdict: {'REPRODUCES: error > bound' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
