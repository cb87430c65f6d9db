"""Liger-Kernel: differentiating LigerRopeFunction's backward gives a wrong value.

LigerRopeFunction.backward rotates the upstream gradient dq in place with the Triton kernel
and returns that buffer; it is not marked once_differentiable. Under create_graph=True
autograd records the backward's output as if it were dq itself, so the derivative of
S = Σ⟨dx, v⟩ with respect to dy comes back as v, where it is v rotated by +a (dx = R(−a)·dy).
A silent wrong value instead of an error; the caller's dy tensor is overwritten as well.

Backs FALSIFY-ROPE-014 (rope-kernel-v1: the double backward matches finite differences of
the reference backward, or is refused), binding LigerRopeFunction (transformers table).
The Triton kernel runs under the Triton interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_rope_double_backward.py (exit 1 = reproduces).
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
EPS32 = 2.0 ** -23
D, THETA, POS = 4, 10000.0, 5
angles = [POS * mpmath.power(THETA, mpmath.mpf(-2 * k) / D) for k in range(D // 2)]
cos = torch.tensor([[[float(mpmath.cos(a)) for a in angles] * 2]])  # [1, S, D]
sin = torch.tensor([[[float(mpmath.sin(a)) for a in angles] * 2]])

X, DY, V = [1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.25, 2.0], [1.0, 0.0, 0.0, 0.0]
x = torch.tensor(X).reshape(1, 1, 1, D).requires_grad_(True)
q = x.clone().transpose(1, 2)  # [B, H, S, D], as an attention layer hands it over
k = torch.zeros(1, 1, 1, D)
y = liger_rotary_pos_emb(q, k, cos, sin)[0]
dy = torch.tensor(DY).reshape(1, 1, 1, D).requires_grad_(True)
(dx,) = torch.autograd.grad(y, x, dy, create_graph=True)
S = (dx * torch.tensor(V).reshape(1, 1, 1, D)).sum()
(g,) = torch.autograd.grad(S, dy)
got = g.flatten().tolist()

# S = ⟨R(−a)·dy, v⟩ = ⟨dy, R(a)·v⟩, so ∂S/∂dy = R(a)·v (rotate-half layout)
true = [None] * D
for kk, a in enumerate(angles):
    v1, v2 = mpmath.mpf(V[kk]), mpmath.mpf(V[kk + D // 2])
    true[kk] = v1 * mpmath.cos(a) - v2 * mpmath.sin(a)
    true[kk + D // 2] = v2 * mpmath.cos(a) + v1 * mpmath.sin(a)
ref_max = max(abs(t) for t in true)
bound = 3 * EPS32 * (ref_max + 11)  # FALSIFY-ROPE-014 float32: atol 3·eps32·(ref_max + 11)
errs = [abs(mpmath.mpf(a) - t) for a, t in zip(got, true)]
print("case FALSIFY-ROPE-014: d/ddy of S = <dx, v>, dx from autograd with create_graph=True")
print(f"input:   x = {X} as q [1, 1, 1, {D}], position {POS}, theta {THETA:g} (float32 "
      f"cos/sin from float64 angles), dy = {DY}, v = {V}")
print(f"library: liger-kernel {VERSION}: dS/ddy = {got} (and dy was overwritten: "
      f"{dy.detach().flatten().tolist()})")
print(f"true:    R(a)·v = {[mpmath.nstr(t, 9) for t in true]}")
print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)}")
print(f"error:   {mpmath.nstr(max(errs), 6)}")
bad = max(errs) > bound
print("verdict:", "REPRODUCES: the second derivative is v, not R(a)·v" if bad
      else "does not reproduce")
sys.exit(1 if bad else 0)
