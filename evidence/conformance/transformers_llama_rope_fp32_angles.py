"""transformers: LlamaRotaryEmbedding's angles pos·inv_freq are computed in float32.

compute_default_rope_parameters forms inv_freq = 1/theta^(2k/D) in fp32 and
LlamaRotaryEmbedding.forward the angles `inv_freq_expanded.float() @
position_ids_expanded.float()` in fp32, so an angle pos·f_k errs by up to ~pos·2^-24 rad
(4.5e-4 at pos 7583) before cos/sin are taken: the rotation is off by that much at every
frequency with f_k near 1, for every later use of the table (forward, backward, double
backward, and the relative-position property, whose error now grows with the absolute
position). Angles computed in float64 and rounded once to fp32 are exact to 2^-24 relative of
cos/sin. For fp16 x the table is further cast to fp16 (`cos.to(dtype=x.dtype)`) and
`q * cos + rotate_half(q) * sin` runs in fp16.

Backs, for apply_rotary_pos_emb with the LlamaRotaryEmbedding table: FALSIFY-ROPE-001/float32,
FALSIFY-ROPE-001/float16, FALSIFY-ROPE-005/float32, FALSIFY-ROPE-005/float16,
FALSIFY-ROPE-003/float32, FALSIFY-ROPE-014/float32 and FALSIFY-ROPE-018/float32 of
rope-kernel-v1; and FALSIFY-ROPE-001 / FALSIFY-ROPE-005 of Liger's LigerRopeFunction fed the
same table (Liger's kernel takes the model's cos/sin as given).
Run: python transformers_llama_rope_fp32_angles.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("transformers")
EPS32, EPS16, U32 = 2.0 ** -23, 2.0 ** -10, 1.2e-7
TINY32 = 2.0 ** -126
D, HALF, THETA, POS = 34, 17, 500000.0, 7583

config = LlamaConfig(hidden_size=D, num_attention_heads=1, num_key_value_heads=1, head_dim=D,
                     rope_parameters={"rope_type": "default", "rope_theta": THETA})
rotary = LlamaRotaryEmbedding(config)


def rope(q, pos):
    """q [B, H, S, D] rotated as a Llama attention layer does (k = q, unused)."""
    cos, sin = rotary(q, torch.tensor([pos]))
    return apply_rotary_pos_emb(q, q, cos, sin)[0]


def exact_rope(x, pos, sign=1):
    """rotate-half RoPE of one vector x (length D) at position pos, float64-exact angles."""
    X = [mpmath.mpf(v) for v in x]
    out = [None] * D
    for k in range(HALF):
        a = sign * pos * mpmath.power(THETA, mpmath.mpf(-2 * k) / D)
        c, s = mpmath.cos(a), mpmath.sin(a)
        out[k] = X[k] * c - X[k + HALF] * s
        out[k + HALF] = X[k + HALF] * c + X[k] * s
    return out


def report(name, inp, call, got, true, bounds):
    """got, true, bounds: per element (bounds: a list, or one number for every element)."""
    if not isinstance(bounds, list):
        bounds = [bounds] * len(got)
    errs = [abs(mpmath.mpf(g) - t) for g, t in zip(got, true)]
    j = max(range(len(got)), key=lambda i: errs[i] / bounds[i])
    bad = errs[j] > bounds[j]
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: transformers {VERSION}: {call}: element {j} = {got[j]!r}")
    print(f"true:    element {j} = {mpmath.nstr(true[j], 12)}")
    print(f"bound:   {mpmath.nstr(mpmath.mpf(bounds[j]), 6)}")
    print(f"error:   {mpmath.nstr(errs[j], 6)} "
          f"({sum(e > b for e, b in zip(errs, bounds))} of {len(got)} elements beyond)")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


E = [1.0] * HALF + [0.0] * HALF  # (x1, x2) = (1, 0): the result is (cos a_k, sin a_k)
TXT = f"x = [1.0]*17 + [0.0]*17 as q [1, 1, 1, {D}], position_ids [[{POS}]], rope_theta {THETA:g}"
bad = []
# FALSIFY-ROPE-001: float32 atol 3·eps32·ref_max + 3·tiny32·eps32/2; float16 atol
# 3·1.2e-7·ref_max + 6e-8 with rtol eps16/2 (fp32 rotation from a float64 table, ONE rounding)
true = exact_rope(E, POS)
ref_max = max(abs(t) for t in true)
for dt, bound_of in ((torch.float32, lambda t: 3 * EPS32 * ref_max + 3 * TINY32 * EPS32 / 2),
                     (torch.float16, lambda t: 3 * U32 * ref_max + 6.0e-8 + EPS16 / 2 * abs(t))):
    got = rope(torch.tensor(E, dtype=dt).reshape(1, 1, 1, D), POS).flatten().tolist()
    bad.append(report(f"FALSIFY-ROPE-001/{str(dt)[6:]} (forward)", f"{TXT} ({str(dt)[6:]})",
                      "apply_rotary_pos_emb(q, k, *LlamaRotaryEmbedding(config)(q, pos))",
                      got, true, [bound_of(t) for t in true]))

# FALSIFY-ROPE-005: autograd's dx = R(−a)·dy; same bounds as FALSIFY-ROPE-001, dy = E
true = exact_rope(E, POS, sign=-1)
for dt, bound_of in ((torch.float32, lambda t: 3 * EPS32 * 1 + 3 * TINY32 * EPS32 / 2),
                     (torch.float16, lambda t: 3 * U32 * 1 + 6.0e-8 + EPS16 / 2 * abs(t))):
    x = torch.tensor(E, dtype=dt).reshape(1, 1, 1, D).requires_grad_(True)
    rope(x, POS).backward(torch.tensor(E, dtype=dt).reshape(1, 1, 1, D))
    got = x.grad.flatten().tolist()
    bad.append(report(f"FALSIFY-ROPE-005/{str(dt)[6:]} (backward)",
                      f"{TXT} ({str(dt)[6:]}), dy = x", "autograd dq", got, true,
                      [bound_of(t) for t in true]))

# FALSIFY-ROPE-014/float32: S = Σ⟨dq, v⟩ with dq from autograd (create_graph); ∂S/∂dy is v
# rotated by +a. Bound atol 3·eps32·(ref_max + 11).
x = torch.tensor(E).reshape(1, 1, 1, D).requires_grad_(True)
dy = torch.zeros(1, 1, 1, D, requires_grad=True)
(dq,) = torch.autograd.grad(rope(x, POS), x, dy, create_graph=True)
(d2,) = torch.autograd.grad((dq * torch.tensor(E).reshape(1, 1, 1, D)).sum(), dy)
true = exact_rope(E, POS)
bad.append(report("FALSIFY-ROPE-014/float32 (double backward: dS/ddy = v rotated)",
                  f"{TXT}, v = x", "d/ddy <autograd.grad(rope(q), q, dy, create_graph=True), v>",
                  d2.flatten().tolist(), true, 3 * EPS32 * (1 + 11)))

# FALSIFY-ROPE-018/float32: an expanded view (stride 0) of one value, under ROPE-001's bound
xv = torch.tensor([0.75]).reshape(1, 1, 1, 1).expand(1, 1, 1, D)
got = rope(xv, POS).flatten().tolist()
true = exact_rope([0.75] * D, POS)
ref_max = max(abs(t) for t in true)
bad.append(report("FALSIFY-ROPE-018/float32 (layouts: expanded view)",
                  f"q = torch.tensor([0.75]).reshape(1, 1, 1, 1).expand(1, 1, 1, {D}) "
                  f"(stride {tuple(xv.stride())}), position_ids [[{POS}]]",
                  "apply_rotary_pos_emb on the view", got, true,
                  3 * EPS32 * ref_max + 3 * TINY32 * EPS32 / 2))

# FALSIFY-ROPE-003/float32: ⟨y_s, y_t⟩ for two tokens at positions (0, 7583) and shifted by
# c = 4096 must agree: exactly, both equal Σ_k x_k·x_k' cos(a_k(t) − a_k(s)) for the same x.
# Bound 2·D·(2·ref_max·d + d²), d = 3·eps32·ref_max + 3·tiny32·eps32/2 (ROPE-001's).
C = 4096  # the largest shift the contract draws (c in [-4096, 4096])
q = torch.tensor([E, E]).reshape(1, 1, 2, D)
grams = []
for shift in (0, C):
    cos, sin = rotary(q, torch.tensor([[0 + shift, POS + shift]]))
    y = apply_rotary_pos_emb(q, q, cos, sin)[0][0, 0]
    grams.append(mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b)
                             for a, b in zip(y[0].tolist(), y[1].tolist())))
d = 3 * EPS32 * 1 + 3 * TINY32 * EPS32 / 2
bound = 2 * D * (2 * 1 * d + d * d)
true = mpmath.fsum(mpmath.mpf(a) * b for a, b in zip(E, exact_rope(E, POS)))
print("case FALSIFY-ROPE-003/float32 (relative position: shift both positions by c = 4096)")
print(f"input:   q = [x, x] as [1, 1, 2, {D}], x = [1.0]*17 + [0.0]*17, positions [0, {POS}] "
      f"and [{C}, {POS + C}], rope_theta {THETA:g}")
print(f"library: transformers {VERSION}: <y_0, y_1> = {mpmath.nstr(grams[0], 12)} at [0, {POS}], "
      f"{mpmath.nstr(grams[1], 12)} at [{C}, {POS + C}]")
print(f"true:    {mpmath.nstr(true, 12)} for both (depends on the position difference only)")
print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)} between the two")
print(f"error:   {mpmath.nstr(abs(grams[0] - grams[1]), 6)}")
bad.append(abs(grams[0] - grams[1]) > bound)
print("verdict:", "REPRODUCES: the Gram entry moved with the absolute position" if bad[-1]
      else "does not reproduce")
print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
