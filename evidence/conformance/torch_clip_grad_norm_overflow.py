"""torch: clip_grad_norm_ zeroes fp32 gradients whose norm is finite but whose squares overflow.

torch._foreach_norm / linalg.vector_norm sum g² without scaling by max|g|: for |g| ≈ 1e35 the
squares (1e70) exceed fp32's range (3.4e38), the norm comes back +inf although the true norm
(≈ 6.4e34) is representable, clip_coef = max_norm / (inf + 1e-6) = 0, and every gradient is
multiplied to ±0 instead of being scaled onto the ball. (A scaled norm, max|g|·√Σ(g/max|g|)²,
cannot overflow.) Exploding gradients are exactly when a clip is needed.

Backs FALSIFY-CLIP-004 (parity for exploding gradients) and FALSIFY-CLIP-005 (they are
clipped onto the ball, the reported norm finite) of grad-clip-kernel-v1, for
clip_grad_norm_(foreach=False) and (foreach=True).
Run: python torch_clip_grad_norm_overflow.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
import sys

import mpmath
import numpy as np
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS32 = 2.0 ** -23

# the contract's example r = c = n = k = 1 of the `huge` input (float32)
G = {"g0": [[-3.347349014206372e+34]], "g1": [5.4404775920827135e+34],
     "g2": [[-5.137440962722725e+29, 9.279332079676781e+28, -1.7388121734511698e+29]]}
MAX_NORM, CLIP_EPS = 1.0, 1e-6
N = 1 * 1 + 1 + 3 * 1
# FALSIFY-CLIP-004/005 float32 tolerance: atol 1e-44, rtol ((r·c + n + 3k)/2 + 6)·eps32
RTOL, ATOL = (N / 2 + 6) * EPS32, 1.0e-44

flat = [mpmath.mpf(v) for v in (G["g0"][0] + G["g1"] + G["g2"][0])]
norm = mpmath.sqrt(sum(v * v for v in flat))
coef = min(mpmath.mpf(1), MAX_NORM / (norm + CLIP_EPS))
true = [coef * v for v in flat]

bad = []
for foreach in (False, True):
    grads = [torch.tensor(G[k], dtype=torch.float32) for k in ("g0", "g1", "g2")]
    params = []
    for g in grads:
        p = torch.empty_like(g)
        p.grad = g.clone()
        params.append(p)
    total = torch.nn.utils.clip_grad_norm_(params, MAX_NORM, norm_type=2.0, foreach=foreach)
    got = [v for p in params for v in p.grad.reshape(-1).tolist()]
    errs = [abs(mpmath.mpf(a) - b) for a, b in zip(got, true)]
    bounds = [ATOL + RTOL * abs(b) for b in true]
    print(f"case FALSIFY-CLIP-004, clip_grad_norm_(foreach={foreach}): clipped gradients")
    print(f"input:   g0 = {G['g0']}, g1 = {G['g1']}, g2 = {G['g2']} (float32), "
          f"max_norm = {MAX_NORM}, norm_type 2")
    print(f"library: torch {VERSION}: clipped {got}, returned total_norm {total.item()!r}")
    print(f"true:    {[mpmath.nstr(b, 9) for b in true]} (norm {mpmath.nstr(norm, 9)}, "
          f"finite in float32: {bool(np.isfinite(np.float32(float(norm))))})")
    print(f"bound:   {[mpmath.nstr(b, 3) for b in bounds]} (rtol {RTOL:.3g}·|true|)")
    print(f"error:   {[mpmath.nstr(e, 3) for e in errs]}")
    bad.append(any(e > b for e, b in zip(errs, bounds)))
    print("verdict:", "REPRODUCES: gradients zeroed, not clipped" if bad[-1]
          else "does not reproduce")
    print()
    # FALSIFY-CLIP-005: the reported norm is finite and ‖g'‖ ≤ max_norm·(1 + rtol), and
    # (the ball) ‖g'‖ = max_norm·‖g‖/(‖g‖ + 1e-6) within rtol.
    out_norm = mpmath.sqrt(sum(mpmath.mpf(v) ** 2 for v in got))
    target = min(norm, MAX_NORM * norm / (norm + CLIP_EPS))
    ok = math.isfinite(total.item()) and out_norm <= MAX_NORM * (1 + RTOL) \
        and abs(out_norm - target) <= RTOL * target
    print(f"case FALSIFY-CLIP-005, clip_grad_norm_(foreach={foreach}): norm reported, ball reached")
    print("input:   as above")
    print(f"library: torch {VERSION}: total_norm {total.item()!r}, ||clipped|| = "
          f"{mpmath.nstr(out_norm, 9)}")
    print(f"true:    total_norm {mpmath.nstr(norm, 9)}, ||clipped|| {mpmath.nstr(target, 9)}")
    print(f"bound:   total_norm finite; | ||clipped|| - true | <= {mpmath.nstr(RTOL * target, 3)}")
    print(f"error:   total_norm {'finite' if math.isfinite(total.item()) else 'not finite'}, "
          f"||clipped|| off by {mpmath.nstr(abs(out_norm - target), 3)}")
    bad.append(not ok)
    print("verdict:", "REPRODUCES: norm inf, gradients on no ball" if bad[-1]
          else "does not reproduce")
    print()

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
