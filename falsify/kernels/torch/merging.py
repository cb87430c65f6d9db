"""Model merging per tensor (linear, SLERP, magnitude trim, TIES, DARE-linear) in torch; the
semantics, signatures and tie rules are falsify/reference/merging.py's.

Precision: every discrete decision is taken in float64 from the exact input values, in the
same order as the reference, so it agrees with the reference bit for bit — the trim's
magnitudes (|θ_i − base| of fp32/fp16 inputs), TIES' elected sign (a sequential float64 sum over
the models, as the reference's), SLERP's norms, dot and branch, and DARE's mask (drawn here from
numpy's PCG64 exactly as the contract specifies it, so parity with the reference tests that
draw). The elementwise arithmetic runs in float32 (fp16 inputs are widened exactly) and the
result is rounded once to the input dtype. Merging runs on frozen
weights under no_grad: nothing here has a backward.
"""

import math

import numpy as np
import torch

from falsify.kernels.dtypes import CHECKED, require
from falsify.reference.merging import DOT_THRESHOLD

__all__ = ["dare_linear", "linear", "slerp", "ties", "trim"]


def _tensor(name, label, x, ndim):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: {label} must be a tensor, got {type(x).__name__}")
    require(name, CHECKED, **{label: x})
    if x.dim() != ndim:
        raise ValueError(f"{name}: {label} must have {ndim} dims, got shape {tuple(x.shape)}")


def _models(name, thetas, weights, base=None):
    _tensor(name, "thetas", thetas, 3)
    _tensor(name, "weights", weights, 1)
    if base is not None:
        _tensor(name, "base", base, 2)
    k = thetas.shape[0]
    if k == 0:
        raise ValueError(f"{name}: k = 0: no models to merge")
    if tuple(weights.shape) != (k,):
        raise ValueError(f"{name}: weights must be [k] = [{k}], got {tuple(weights.shape)}")
    if base is not None and tuple(base.shape) != tuple(thetas.shape[1:]):
        raise ValueError(f"{name}: base {tuple(base.shape)} and thetas "
                         f"{tuple(thetas.shape)} disagree")


@torch.no_grad()
def linear(thetas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    _models("linear", thetas, weights)
    w = weights.float()
    acc = torch.zeros(thetas.shape[1:], dtype=torch.float32, device=thetas.device)
    total = torch.zeros((), dtype=torch.float32, device=thetas.device)
    for i in range(thetas.shape[0]):  # elementwise, in model order: no cross-row reduction
        acc = acc + w[i] * thetas[i].float()
        total = total + w[i]
    return (acc / total).to(thetas.dtype)


def _coefficients(t: float, a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    a64, b64 = a.double(), b.double()
    na = float(torch.linalg.vector_norm(a64))
    nb = float(torch.linalg.vector_norm(b64))
    ua = a64 / na if na > 0 else a64
    ub = b64 / nb if nb > 0 else b64
    dot = min(1.0, max(-1.0, float((ua * ub).sum())))
    if abs(dot) > DOT_THRESHOLD:
        return 1.0 - t, t
    theta0 = math.acos(dot)
    sin0 = math.sin(theta0)
    return math.sin((1.0 - t) * theta0) / sin0, math.sin(t * theta0) / sin0


@torch.no_grad()
def slerp(t: float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    _tensor("slerp", "a", a, 2)
    _tensor("slerp", "b", b, 2)
    if a.shape != b.shape:
        raise ValueError(f"slerp: a {tuple(a.shape)} and b {tuple(b.shape)} disagree")
    t = float(t)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"slerp: t = {t}: must be in [0, 1]")
    s0, s1 = _coefficients(t, a, b)
    return (s0 * a.float() + s1 * b.float()).to(a.dtype)


def n_kept(density: float, size: int) -> int:
    """Entries a magnitude trim keeps: int(density·N) (as mergekit 0.1.5), at least one of a
    nonempty tensor; density ∈ (0, 1]. The backend's own count: the reference computes its
    own, so a wrong count shows up as a mask that disagrees."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density = {density}: must be in (0, 1]")
    if size == 0:
        return 0
    return min(size, max(1, int(density * size)))


def _keep_mask(x: torch.Tensor, density: float) -> torch.Tensor:
    """Boolean mask of the n_kept entries of largest |x| (x float64; ties: lower flat index)."""
    flat = x.abs().reshape(-1)
    order = torch.argsort(-flat, stable=True)[: n_kept(density, flat.numel())]
    keep = torch.zeros(flat.numel(), dtype=torch.bool, device=x.device)
    keep[order] = True
    return keep.reshape(x.shape)


@torch.no_grad()
def trim(x: torch.Tensor, density: float):
    _tensor("trim", "x", x, 2)
    keep = _keep_mask(x.double(), density)
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)), \
        keep.to(x.dtype)


@torch.no_grad()
def ties(base: torch.Tensor, thetas: torch.Tensor, weights: torch.Tensor, density: float,
         lam: float) -> torch.Tensor:
    _models("ties", thetas, weights, base)
    n_kept(density, 1)  # validates density before any work
    base64, w64 = base.double(), weights.double()
    kept, mass = [], torch.zeros(base.shape, dtype=torch.float64, device=base.device)
    for i in range(thetas.shape[0]):
        tau64 = thetas[i].double() - base64
        keep = _keep_mask(tau64, density)
        kept.append((keep, torch.sign(tau64)))
        mass = mass + w64[i] * torch.where(keep, tau64, 0.0)
    elected = torch.sign(mass)
    w = weights.float()
    base32 = base.float()
    num = torch.zeros(base.shape, dtype=torch.float32, device=base.device)
    den = torch.zeros(base.shape, dtype=torch.float32, device=base.device)
    for i, (keep, sign) in enumerate(kept):
        agree = keep & (sign != 0) & (sign == elected)
        num = num + torch.where(agree, w[i] * (thetas[i].float() - base32), 0.0)
        den = den + torch.where(agree, w[i], 0.0)
    merged = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
    return (base32 + float(lam) * merged).to(base.dtype)


def dare_keep(seed: int, shape, p: float) -> torch.Tensor:
    """DARE's keep mask on the CPU: u = PCG64(seed).random(shape), float64 uniforms in [0, 1),
    row-major; entry kept where u ≥ p (so p = 0 keeps all). Numpy's generator rather than
    torch's: its stream is specified independently of torch and the same for every device
    (torch's CPU and CUDA generators give different streams for one seed), so the mask is a
    function of (seed, shape) alone."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p = {p}: the drop probability must be in [0, 1)")
    return torch.from_numpy(np.random.default_rng(int(seed)).random(tuple(shape)) >= p)


@torch.no_grad()
def dare_linear(base: torch.Tensor, thetas: torch.Tensor, weights: torch.Tensor, p: float,
                seed: int) -> torch.Tensor:
    _models("dare_linear", thetas, weights, base)
    keep = dare_keep(seed, tuple(thetas.shape), float(p)).to(thetas.device)
    scale = 1.0 / (1.0 - float(p))
    w = weights.float()
    base32 = base.float()
    acc = torch.zeros(base.shape, dtype=torch.float32, device=base.device)
    total = torch.zeros((), dtype=torch.float32, device=base.device)
    for i in range(thetas.shape[0]):
        tau = torch.where(keep[i], thetas[i].float() - base32, 0.0) * scale
        acc = acc + w[i] * tau
        total = total + w[i]
    return (base32 + acc / total).to(base.dtype)
