"""torch: AdamW(fused=True) on the CPU reads a noncontiguous gradient as if it were contiguous.

aten::_fused_adamw_ (CPU) walks p.grad's storage with the parameter's contiguous indexing, so
a gradient that is a strided view (here every other column of a wider buffer, stride (4, 2))
is read at the wrong offsets: the update uses the elements *between* the view's elements.
foreach=False and foreach=True read the view correctly. Gradients that are slices of a larger
buffer occur with gradient bucketing or views into a flat gradient buffer.

Backs FALSIFY-AW-027 (adamw-kernel-v1, layouts of adamw_run: the stepped view).
Run: python torch_fused_adamw_strided_grad.py (exit 1 = reproduces).
"""
import importlib.metadata
import math
import sys

import mpmath
import torch

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("torch")
EPS32 = 2.0 ** -23
LR, B1, B2, EPS, WD = 0.01, 0.9, 0.999, 1e-8, 0.1


def adamw_exact(theta, g, t=1, b1=B1, b2=B2):
    """One AdamW step from zero moments (Loshchilov & Hutter, decoupled weight decay)."""
    theta, g = mpmath.mpf(theta), mpmath.mpf(g)
    m = (1 - b1) * g
    v = (1 - b2) * g * g
    mh, vh = m / (1 - mpmath.mpf(b1) ** t), v / (1 - mpmath.mpf(b2) ** t)
    return theta * (1 - LR * WD) - LR * mh / (mpmath.sqrt(vh) + EPS), m


def step(base, theta, fused, b1=B1):
    p = torch.tensor(theta, dtype=torch.float32, requires_grad=True)
    p.grad = base[:, ::2]  # values base[0, 0], base[0, 2]; stride (4, 2)
    flags = {"fused": True} if fused else {"foreach": False}
    opt = torch.optim.AdamW([p], lr=LR, betas=(b1, B2), eps=EPS, weight_decay=WD, **flags)
    opt.step()
    return p.detach()[0].tolist(), opt.state[p]["exp_avg"][0].tolist()


bad = []
theta0 = [[0.5, -0.25]]

# Case 1, as the contract's stepped view: NaN between the view's elements (a poisoned
# margin a correct kernel never reads). FALSIFY-AW-027 compares with FALSIFY-AW-008's bound:
# atol 32·T·eps32, rtol 8·eps32, T = 1 step.
base = torch.tensor([[1.0, math.nan, 3.0, math.nan]])
got, _ = step(base, theta0, fused=True)
ref_loop, _ = step(base, theta0, fused=False)
true = [adamw_exact(th, g)[0] for th, g in zip(theta0[0], (1.0, 3.0))]
errs = [abs(mpmath.mpf(a) - b) if math.isfinite(a) else mpmath.inf for a, b in zip(got, true)]
bounds = [32 * EPS32 + 8 * EPS32 * abs(b) for b in true]
print("case FALSIFY-AW-027: parameter after one step, gradient a strided view")
print(f"input:   param = {theta0} (float32), p.grad = base[:, ::2] with base = "
      f"{base.tolist()} (grad values [[1.0, 3.0]], stride {base[:, ::2].stride()}); "
      f"lr {LR}, betas ({B1}, {B2}), eps {EPS}, weight_decay {WD}")
print(f"library: torch {VERSION}: AdamW(fused=True).step() -> param {got} "
      f"(AdamW(foreach=False): {ref_loop})")
print(f"true:    {[mpmath.nstr(b, 12) for b in true]}")
print(f"bound:   {[mpmath.nstr(b, 4) for b in bounds]}")
print(f"error:   {[mpmath.nstr(e, 4) for e in errs]}")
bad.append(any(e > b for e, b in zip(errs, bounds)))
print("verdict:", "REPRODUCES: NaN from outside the gradient view" if bad[-1]
      else "does not reproduce")
print()

# Case 2: what the kernel reads. β1 = 0 makes exp_avg the gradient itself, exactly.
# The moments' bound (FALSIFY-AW-009): atol 2·T·eps32, rtol 3·T·eps32.
base = torch.tensor([[1.0, 7.0, 3.0, 9.0]])
_, m_fused = step(base, theta0, fused=True, b1=0.0)
_, m_loop = step(base, theta0, fused=False, b1=0.0)
true_m = [adamw_exact(th, g, b1=0.0)[1] for th, g in zip(theta0[0], (1.0, 3.0))]
errs = [abs(mpmath.mpf(a) - b) for a, b in zip(m_fused, true_m)]
bounds = [2 * EPS32 + 3 * EPS32 * abs(b) for b in true_m]
print("case FALSIFY-AW-027: exp_avg with beta1 = 0 (= the gradient the kernel read)")
print(f"input:   param = {theta0}, p.grad = base[:, ::2] with base = {base.tolist()} "
      f"(grad values [[1.0, 3.0]]), betas (0.0, {B2})")
print(f"library: torch {VERSION}: AdamW(fused=True) exp_avg = {m_fused} "
      f"(AdamW(foreach=False): {m_loop})")
print(f"true:    {[mpmath.nstr(b, 12) for b in true_m]}")
print(f"bound:   {[mpmath.nstr(b, 4) for b in bounds]}")
print(f"error:   {[mpmath.nstr(e, 4) for e in errs]}")
bad.append(any(e > b for e, b in zip(errs, bounds)))
print("verdict:", "REPRODUCES: the kernel read base[0, 1] instead of base[0, 2]" if bad[-1]
      else "does not reproduce")
print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
