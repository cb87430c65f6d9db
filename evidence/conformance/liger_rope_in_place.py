"""Liger-Kernel: liger_rotary_pos_emb overwrites q (and k) with the rotated values.

rope_forward transposes q [B, H, S, D] back to [B, S, H, D] and calls `.contiguous()`, which
is a no-op when q is the transposed view of a [B, S, H, D] buffer (as a Llama attention
layer passes `q_proj(x).view(B, S, H, D).transpose(1, 2)`); _triton_rope then stores into that
buffer. The caller's tensor is rotated in place and the returned tensor is its storage, so a
second call on the same tensor (a recomputation, a second rope on a shared q, the
relative-position property: rope at positions p and p + c of the same x) rotates the already
rotated values. The docstring does not say that q and k are modified.

Backs FALSIFY-ROPE-009 (determinism: the same call twice) and FALSIFY-ROPE-003 (relative
position) of rope-kernel-v1, binding LigerRopeFunction (transformers table). The Triton
kernel runs under the Triton interpreter (TRITON_INTERPRET=1) when there is no GPU.
Run: python liger_rope_in_place.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.transformers.rope import liger_rotary_pos_emb  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
EPS32, TINY32 = 2.0 ** -23, 2.0 ** -126
THETA, D, HALF = 500000.0, 2, 1
X = [0.8467130064964294, -3.4146060943603516]  # float32 values; one token, one head, D = 2
POS = 668


def table(positions):
    """cos/sin [1, S, D] (rotate-half layout, halves duplicated) from float64-exact angles."""
    cos, sin = [], []
    for p in positions:
        a = [p * mpmath.power(THETA, mpmath.mpf(-2 * k) / D) for k in range(HALF)]
        cos.append([float(mpmath.cos(v)) for v in a] * 2)
        sin.append([float(mpmath.sin(v)) for v in a] * 2)
    return torch.tensor([cos]), torch.tensor([sin])


def exact(x, p):
    a = p * mpmath.power(THETA, 0)
    x1, x2 = mpmath.mpf(x[0]), mpmath.mpf(x[1])
    return [x1 * mpmath.cos(a) - x2 * mpmath.sin(a), x2 * mpmath.cos(a) + x1 * mpmath.sin(a)]


def rope(buf, positions):
    """buf [B, S, H, D], passed as q = buf.transpose(1, 2) as an attention layer does."""
    q = buf.transpose(1, 2)
    k = torch.zeros(buf.shape[0], 1, buf.shape[1], D)  # a separate key, unused here
    cos, sin = table(positions)
    return liger_rotary_pos_emb(q, k, cos, sin)[0].transpose(1, 2).clone()


bad = []
# FALSIFY-ROPE-009: the same call twice must return the same rotation of x, x untouched.
# Each result is compared with FALSIFY-ROPE-001's float32 bound, atol 3·eps32·ref_max.
buf = torch.tensor(X).reshape(1, 1, 1, D)
first = rope(buf, [POS]).flatten().tolist()
after_first = buf.flatten().tolist()
second = rope(buf, [POS]).flatten().tolist()
true = exact(X, POS)
bound = 3 * EPS32 * max(abs(t) for t in true) + 3 * TINY32 * EPS32 / 2
errs = [max(abs(mpmath.mpf(a) - t) for a, t in zip(r, true)) for r in (first, second)]
print("case FALSIFY-ROPE-009: the same call twice on one tensor")
print(f"input:   x = {X} (float32) as a [1, 1, 1, 2] buffer, q = x.transpose(1, 2), position "
      f"{POS}, theta {THETA:g}, float32 cos/sin from float64 angles")
print(f"library: liger-kernel {VERSION}: first call {first}, second call {second}; x after the "
      f"first call: {after_first}")
print(f"true:    both calls {[mpmath.nstr(t, 9) for t in true]}; x unchanged {X}")
print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)} (each call)")
print(f"error:   first {mpmath.nstr(errs[0], 6)}, second {mpmath.nstr(errs[1], 6)}")
bad.append(errs[1] > bound or after_first != X)
print("verdict:", "REPRODUCES: x was rotated in place, the second call rotates it again" if bad[-1]
      else "does not reproduce")
print()

# FALSIFY-ROPE-003: ⟨y_s, y_t⟩ of two tokens at positions (p0, p1) and (p0 + c, p1 + c),
# each from the same x, must agree (within 2·D·(2·ref_max·d + d²), d as above).
C, P = 851, [3, 668]
xs = [X, [1.5, 0.25]]
buf = torch.tensor(xs).reshape(1, 2, 1, D)
grams = []
for shift in (0, C):
    y = rope(buf, [p + shift for p in P])[0, :, 0, :]
    grams.append(mpmath.fsum(mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(y[0].tolist(),
                                                                             y[1].tolist())))
ys = [exact(x, p) for x, p in zip(xs, P)]
true = mpmath.fsum(a * b for a, b in zip(*ys))
ref_max = max(abs(v) for y in ys for v in y)
d = 3 * EPS32 * ref_max + 3 * TINY32 * EPS32 / 2
bound = 2 * D * (2 * ref_max * d + d * d)
print(f"case FALSIFY-ROPE-003: relative position, positions {P} and shifted by c = {C}")
print(f"input:   x = {xs} (float32) as a [1, 2, 1, 2] buffer, q = x.transpose(1, 2), "
      f"theta {THETA:g}; rope at {P}, then at {[p + C for p in P]} on the same x")
print(f"library: liger-kernel {VERSION}: <y_0, y_1> = {mpmath.nstr(grams[0], 10)}, then "
      f"{mpmath.nstr(grams[1], 10)}")
print(f"true:    {mpmath.nstr(true, 10)} both times")
print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)}")
print(f"error:   {mpmath.nstr(abs(grams[1] - grams[0]), 6)} between the two")
bad.append(abs(grams[1] - grams[0]) > bound)
print("verdict:", "REPRODUCES: the second call saw the rotated x" if bad[-1]
      else "does not reproduce")
print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
