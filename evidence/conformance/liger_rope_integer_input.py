"""Liger-Kernel: liger_rotary_pos_emb accepts an integer q and truncates the rotation.

The kernel loads q, rotates it with the (float) cos/sin table and stores the result into
q's own buffer, of q's dtype: for int64 q the rotated values are truncated to integers, with
no error. A rotation of integers is not an integer tensor.

Backs FALSIFY-ROPE-011 (rope-kernel-v1: every undeclared dtype is refused with a TypeError or
ValueError naming it), binding LigerRopeFunction (transformers table). Runs the Triton
kernel under the Triton interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_rope_integer_input.py (exit 1 = reproduces).
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
D, THETA, POS = 4, 10000.0, 5
X = [3, -2, 1, 4]
angles = [POS * mpmath.power(THETA, mpmath.mpf(-2 * k) / D) for k in range(D // 2)]
cos = torch.tensor([[[float(mpmath.cos(a)) for a in angles] * 2]])
sin = torch.tensor([[[float(mpmath.sin(a)) for a in angles] * 2]])
true = [None] * D
for k, a in enumerate(angles):
    x1, x2 = mpmath.mpf(X[k]), mpmath.mpf(X[k + D // 2])
    true[k], true[k + D // 2] = x1 * mpmath.cos(a) - x2 * mpmath.sin(a), \
        x2 * mpmath.cos(a) + x1 * mpmath.sin(a)

q = torch.tensor(X, dtype=torch.int64).reshape(1, 1, 1, D)
k_ = torch.zeros(1, 1, 1, D, dtype=torch.int64)
print("case FALSIFY-ROPE-011: int64 q")
print(f"input:   q = {X} (int64) as [1, 1, 1, {D}], position {POS}, theta {THETA:g}, float32 "
      "cos/sin from float64 angles")
try:
    qe, _ = liger_rotary_pos_emb(q, k_, cos, sin)
except (TypeError, ValueError) as e:
    named = "int64" in str(e) or "Long" in str(e)
    print(f"library: liger-kernel {VERSION}: refused: {type(e).__name__}: {e}")
    print(f"true:    {[mpmath.nstr(t, 10) for t in true]}")
    print("bound:   a TypeError or ValueError naming the dtype")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
got = qe.flatten().tolist()
err = max(abs(mpmath.mpf(g) - t) for g, t in zip(got, true))
print(f"library: liger-kernel {VERSION}: liger_rotary_pos_emb(q, k, cos, sin)[0] = {got} "
      f"({qe.dtype}), no error")
print(f"true:    {[mpmath.nstr(t, 10) for t in true]}")
print("bound:   a TypeError or ValueError naming int64 (rope-kernel-v1 declares float32 and "
      "float16); a computed rotation would be exact to float32 rounding")
print(f"error:   accepted; max |result - rotation| = {mpmath.nstr(err, 6)}")
bad = err > 1e-5
print(f"verdict: {'REPRODUCES: integer q accepted and truncated' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
