"""Merging mutants: the bugs the merging contract's checks must catch."""

import math

import torch

from falsify.kernels.torch import merging as torch_merging
from falsify.reference.merging import dare_keep


def slerp_no_fallback(t: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """SLERP without the near-parallel fallback: parallel inputs give θ₀ = 0 and 0/0 = NaN,
    antiparallel ones sin θ₀ ≈ 1e-16 and coefficients ~1e16; just inside the threshold the
    slerp value, up to 5e-5 relative away from the linear interpolation the contract states."""
    a64, b64 = a.double(), b.double()
    na, nb = float(torch.linalg.vector_norm(a64)), float(torch.linalg.vector_norm(b64))
    ua = a64 / na if na > 0 else a64
    ub = b64 / nb if nb > 0 else b64
    dot = min(1.0, max(-1.0, float((ua * ub).sum())))
    theta0 = math.acos(dot)
    sin0 = math.sin(theta0)
    with torch.no_grad():
        s0 = math.sin((1.0 - t) * theta0) / sin0 if sin0 != 0 else math.nan
        s1 = math.sin(t * theta0) / sin0 if sin0 != 0 else math.nan
        return (s0 * a.float() + s1 * b.float()).to(a.dtype)


def slerp_swapped_weights(t: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """s0 and s1 exchanged: slerp(t) returns slerp(1 − t) (t = 0 gives b); still on the unit
    sphere for unit inputs, so only the endpoints and parity see it."""
    s0, s1 = torch_merging._coefficients(float(t), a, b)
    with torch.no_grad():
        return (s1 * a.float() + s0 * b.float()).to(a.dtype)


def _ties(base, thetas, weights, density, lam, *, by_count=False, all_models=False):
    base64, w64 = base.double(), weights.double()
    kept, mass = [], torch.zeros(base.shape, dtype=torch.float64)
    for i in range(thetas.shape[0]):
        tau64 = thetas[i].double() - base64
        keep = torch_merging._keep_mask(tau64, density)
        sign = torch.sign(tau64)
        kept.append((keep, sign))
        mass = mass + (torch.where(keep, sign, 0.0) if by_count
                       else w64[i] * torch.where(keep, tau64, 0.0))
    elected = torch.sign(mass)
    w = weights.float()
    num = torch.zeros(base.shape, dtype=torch.float32)
    den = torch.zeros(base.shape, dtype=torch.float32)
    for i, (keep, sign) in enumerate(kept):
        agree = keep & (sign != 0) & (sign == elected)
        num = num + torch.where(agree, w[i] * (thetas[i].float() - base.float()), 0.0)
        den = den + (w[i] if all_models else torch.where(agree, w[i], 0.0))
    merged = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
    return (base.float() + float(lam) * merged).to(base.dtype)


@torch.no_grad()
def ties_sign_by_count(base, thetas, weights, density, lam):
    """Sign elected by the number of positive vs negative trimmed entries (mergekit's
    'count' consensus) instead of their weighted mass: one large update loses to two small
    ones of the other sign."""
    return _ties(base, thetas, weights, density, lam, by_count=True)


@torch.no_grad()
def ties_mean_over_all_models(base, thetas, weights, density, lam):
    """Disjoint mean divided by the weight of every model instead of the agreeing ones: a
    model whose update is zero (or of the losing sign) dilutes the merge."""
    return _ties(base, thetas, weights, density, lam, all_models=True)


@torch.no_grad()
def dare_no_rescale(base, thetas, weights, p, seed):
    """DARE drops deltas without rescaling the survivors by 1/(1 − p): the merged update
    shrinks by (1 − p) on average (biased)."""
    keep = torch.from_numpy(dare_keep(seed, tuple(thetas.shape), float(p)))
    w = weights.float()
    acc = torch.zeros(base.shape, dtype=torch.float32)
    for i in range(thetas.shape[0]):
        acc = acc + w[i] * torch.where(keep[i], thetas[i].float() - base.float(), 0.0)
    return (base.float() + acc / w.sum()).to(base.dtype)


@torch.no_grad()
def dare_torch_generator(base, thetas, weights, p, seed):
    """DARE's mask drawn from torch's seeded generator instead of numpy's PCG64: deterministic
    and unbiased, so only parity with the specified draw tells it apart (and torch's stream
    differs between CPU and CUDA for one seed)."""
    gen = torch.Generator().manual_seed(int(seed))
    keep = torch.rand(tuple(thetas.shape), generator=gen, dtype=torch.float64) >= float(p)
    w = weights.float()
    acc = torch.zeros(base.shape, dtype=torch.float32)
    for i in range(thetas.shape[0]):
        tau = torch.where(keep[i], thetas[i].float() - base.float(), 0.0) / (1.0 - float(p))
        acc = acc + w[i] * tau
    return (base.float() + acc / w.sum()).to(base.dtype)
