"""torch: clip_grad_norm_ on float16 gradients computes the norm and the coefficient in fp16.

clip_grad._get_total_norm returns torch._foreach_norm / linalg.vector_norm of the fp16
gradients as an fp16 tensor, and clip_coef = max_norm / (total_norm + 1e-6) is an fp16 tensor
too, so every clipped element carries the fp16 norm's rounding, the coefficient's, and the
product's: about three fp16 roundings where an fp32 norm and coefficient leave one (the
final store to fp16).

Backs FALSIFY-CLIP-001/float16 (parity) and FALSIFY-CLIP-002/float16 (the clipped norm lands
on the ball) of grad-clip-kernel-v1, for clip_grad_norm_(foreach=False) and (foreach=True).
Run: python torch_clip_grad_norm_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS16, EPS32 = 2.0 ** -10, 2.0 ** -23

# the contract's example r = c = n = k = 1 (grads input, float16): g0 [1, 1], g1 [1], g2 [1, 3]
G = {"g0": [[0.211669921875]], "g1": [-0.22119140625],
     "g2": [[-1.8271484375, -0.2474365234375, 3.33984375]]}
MAX_NORM, CLIP_EPS = 0.5, 1e-6  # torch adds a fixed 1e-6 to the norm, as the contract's eps
N = 1 * 1 + 1 + 3 * 1  # r·c + n + 3·k elements
# FALSIFY-CLIP-001 and -002 float16 tolerance (grad-clip-kernel-v1.yaml):
#   atol 3e-8, rtol eps16/2 + ((r·c + n + 3k)/2 + 6)·1.1920929e-7: an fp32 norm (pairwise
#   sum of N squares, sqrt, division: (N/2 + 6)·eps32) and ONE rounding of g' to fp16.
RTOL = EPS16 / 2 + (N / 2 + 6) * 1.1920929e-07
ATOL = 3.0e-8

flat = [mpmath.mpf(v) for v in (G["g0"][0] + G["g1"] + G["g2"][0])]
norm = mpmath.sqrt(sum(v * v for v in flat))
coef = min(mpmath.mpf(1), MAX_NORM / (norm + CLIP_EPS))
true = [coef * v for v in flat]
true_clipped_norm = min(norm, MAX_NORM * norm / (norm + CLIP_EPS))

bad = []
for foreach in (False, True):
    grads = [torch.tensor(G[k], dtype=torch.float16) for k in ("g0", "g1", "g2")]
    params = []
    for g in grads:
        p = torch.empty_like(g)
        p.grad = g.clone()
        params.append(p)
    total = torch.nn.utils.clip_grad_norm_(params, MAX_NORM, norm_type=2.0, foreach=foreach)
    got = [v for p in params for v in p.grad.reshape(-1).tolist()]
    errs = [abs(mpmath.mpf(a) - b) for a, b in zip(got, true)]
    bounds = [ATOL + RTOL * abs(b) for b in true]
    worst = max(range(len(got)), key=lambda i: errs[i] / bounds[i])
    print(f"case FALSIFY-CLIP-001/float16, clip_grad_norm_(foreach={foreach}): clipped gradients")
    print(f"input:   g0 = {G['g0']}, g1 = {G['g1']}, g2 = {G['g2']} (float16), "
          f"max_norm = {MAX_NORM}, norm_type 2")
    print(f"library: torch {VERSION}: clipped {got}; returned total_norm {total.item()!r} "
          f"({total.dtype}); element {worst}: {got[worst]!r}")
    print(f"true:    element {worst}: {mpmath.nstr(true[worst], 15)} "
          f"(norm {mpmath.nstr(norm, 15)}, coef {mpmath.nstr(coef, 15)})")
    print(f"bound:   {mpmath.nstr(bounds[worst], 6)} (atol {ATOL} + rtol {RTOL:.6g}·|true|)")
    print(f"error:   {mpmath.nstr(errs[worst], 6)}")
    bad.append(errs[worst] > bounds[worst])
    print(f"verdict: {'REPRODUCES: error > bound' if bad[-1] else 'does not reproduce'}")
    print()
    # FALSIFY-CLIP-002: ‖g'‖ (recomputed in float64 from the outputs, as the contract's
    # predicate does) equals min(‖g‖, max_norm·‖g‖/(‖g‖ + 1e-6)) within rtol.
    out_norm = mpmath.sqrt(sum(mpmath.mpf(v) ** 2 for v in got))
    err = abs(out_norm - true_clipped_norm)
    bound = 1.0e-30 + RTOL * true_clipped_norm
    print(f"case FALSIFY-CLIP-002/float16, clip_grad_norm_(foreach={foreach}): norm of the "
          "clipped gradients")
    print("input:   as above")
    print(f"library: torch {VERSION}: ||clipped|| = {mpmath.nstr(out_norm, 15)}")
    print(f"true:    min(||g||, max_norm·||g||/(||g|| + 1e-6)) = "
          f"{mpmath.nstr(true_clipped_norm, 15)}")
    print(f"bound:   {mpmath.nstr(bound, 6)} (rtol {RTOL:.6g}·|true|)")
    print(f"error:   {mpmath.nstr(err, 6)}")
    bad.append(err > bound)
    print(f"verdict: {'REPRODUCES: error > bound' if bad[-1] else 'does not reproduce'}")
    print()

print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
