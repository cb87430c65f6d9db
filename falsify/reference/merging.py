"""Model merging per tensor: linear, SLERP, magnitude trim, TIES (Yadav et al. 2023) and
DARE-linear (Yu et al. 2023), in float64 numpy. Clear over fast; every function takes the
tensors of one parameter (all models share its shape) and returns the merged tensor.

Signatures (the torch backend has the same):

- ``linear(thetas, weights)``: thetas [k, m, n] (k models), weights [k] > 0;
  θ = Σ_i w_i θ_i / Σ_i w_i (mergekit ``linear`` with ``normalize: true``).
- ``slerp(t, a, b)``: a, b [m, n], t ∈ [0, 1]. The angle comes from the normalised copies:
  dot = ⟨a/‖a‖, b/‖b‖⟩ clipped to [−1, 1] (a zero tensor is not normalised, so its dot is 0,
  as in mergekit); |dot| > DOT_THRESHOLD = 0.9995 falls back to (1−t)·a + t·b; otherwise
  θ₀ = arccos(dot), s0 = sin((1−t)θ₀)/sin θ₀, s1 = sin(tθ₀)/sin θ₀, result s0·a + s1·b of the
  unnormalised tensors. mergekit 0.1.5 skips normalising any tensor with ‖v‖ ≤ 1e-8; here
  only an exact zero is skipped (float64 normalises tiny tensors without trouble).
- ``trim(x, density)``: the k = n_kept(density, N) entries of largest |x| (N = x.size) are kept,
  the rest set to +0.0; returns (trimmed, keep) with keep ∈ {0, 1}. Ties go by flat
  (row-major) index: of equal magnitudes the lower index is kept first (a stable descending
  sort), so the mask is a function of |x| alone.
- ``ties(base, thetas, weights, density, lam)``: τ_i = θ_i − base; τ̃_i = trim(τ_i, density);
  elected sign γ = sign(Σ_i w_i τ̃_i) (by mass); model i agrees where τ̃_i ≠ 0 and
  sign(τ̃_i) = γ; disjoint mean δ = Σ_agree w_i τ̃_i / Σ_agree w_i (0 where none agrees, in
  particular where γ = 0); θ = base + lam·δ. (mergekit elects + where the mass is exactly 0;
  here nothing agrees there.)
- ``dare_linear(base, thetas, weights, p, seed)``: keep_i = (u_i ≥ p) for the uniforms
  u = dare_uniforms(seed, (k, m, n)); τ̃_i = keep_i·τ_i/(1 − p); θ = base + Σ_i w_i τ̃_i / Σ_i w_i
  (the linear merge of the DARE-sparsified models). E[θ] = linear(thetas, weights).

The DARE mask is drawn from numpy's PCG64 (``np.random.default_rng(seed).random(shape)``,
float64 uniforms in [0, 1), row-major over [k, m, n]) by this module's ``dare_uniforms``; the
torch backend draws its own from the same specification: one generator specified independently
of torch, the same on every device (torch's CPU and CUDA generators give different streams for
one seed), so the mask is a function of (seed, shape) and parity is exact. A whole-model merge
derives one seed per tensor.
"""

import math

import numpy as np

DOT_THRESHOLD = 0.9995


def _f64(name, label, x, ndim):
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != ndim:
        raise ValueError(f"{name}: {label} must have {ndim} dims, got shape {x.shape}")
    return x


def _models(name, thetas, weights, base=None):
    thetas = _f64(name, "thetas", thetas, 3)
    weights = _f64(name, "weights", weights, 1)
    if thetas.shape[0] == 0:
        raise ValueError(f"{name}: k = 0: no models to merge")
    if weights.shape != (thetas.shape[0],):
        raise ValueError(f"{name}: weights must be [k] = [{thetas.shape[0]}], got "
                         f"{weights.shape}")
    if base is not None:
        base = _f64(name, "base", base, 2)
        if base.shape != thetas.shape[1:]:
            raise ValueError(f"{name}: base {base.shape} and thetas {thetas.shape} disagree")
    return thetas, weights, base


def n_kept(density: float, size: int) -> int:
    """Entries a magnitude trim keeps: ⌊fl(density·N)⌋ (Python's int(density * N), as mergekit
    0.1.5), at least one of a nonempty tensor; density = 1 keeps all. density ∈ (0, 1]."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density = {density}: must be in (0, 1]")
    if size == 0:
        return 0
    return min(size, max(1, int(density * size)))


def linear(thetas, weights):
    thetas, weights, _ = _models("linear", thetas, weights)
    return np.sum(weights[:, None, None] * thetas, axis=0) / np.sum(weights)


def slerp_coefficients(t: float, a, b) -> tuple[float, float]:
    """(s0, s1) of slerp(t, a, b): (1 − t, t) on the linear fallback."""
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    ua = a / na if na > 0 else a
    ub = b / nb if nb > 0 else b
    dot = float(np.clip(np.sum(ua * ub), -1.0, 1.0))
    if abs(dot) > DOT_THRESHOLD:
        return 1.0 - t, t
    theta0 = math.acos(dot)
    sin0 = math.sin(theta0)
    return math.sin((1.0 - t) * theta0) / sin0, math.sin(t * theta0) / sin0


def slerp(t, a, b):
    a = _f64("slerp", "a", a, 2)
    b = _f64("slerp", "b", b, 2)
    if a.shape != b.shape:
        raise ValueError(f"slerp: a {a.shape} and b {b.shape} disagree")
    t = float(t)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"slerp: t = {t}: must be in [0, 1]")
    s0, s1 = slerp_coefficients(t, a, b)
    return s0 * a + s1 * b


def _keep_mask(x, density):
    flat = np.abs(x).reshape(-1)
    order = np.argsort(-flat, kind="stable")[: n_kept(density, flat.size)]
    keep = np.zeros(flat.size)
    keep[order] = 1.0
    return keep.reshape(x.shape)


def trim(x, density):
    x = _f64("trim", "x", x, 2)
    keep = _keep_mask(x, density)
    return np.where(keep > 0, x, 0.0), keep


def ties(base, thetas, weights, density, lam):
    thetas, weights, base = _models("ties", thetas, weights, base)
    n_kept(density, 1)  # validates density before any work
    tau = thetas - base[None]
    trimmed = np.stack([np.where(_keep_mask(t, density) > 0, t, 0.0) for t in tau])
    mass = np.zeros(base.shape)
    for w, t in zip(weights, trimmed):  # a fixed order: the elected sign is reproducible
        mass = mass + w * t
    elected = np.sign(mass)
    agree = (trimmed != 0) & (np.sign(trimmed) == elected[None])
    num = np.sum(np.where(agree, weights[:, None, None] * trimmed, 0.0), axis=0)
    den = np.sum(np.where(agree, weights[:, None, None], 0.0), axis=0)
    merged = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)
    return base + lam * merged


def dare_uniforms(seed: int, shape) -> np.ndarray:
    """The uniforms DARE's mask is drawn from: float64 in [0, 1), row-major over `shape`."""
    return np.random.default_rng(int(seed)).random(tuple(shape))


def dare_keep(seed: int, shape, p: float) -> np.ndarray:
    """Boolean keep mask: each entry kept with probability 1 − p (u ≥ p)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p = {p}: the drop probability must be in [0, 1)")
    return dare_uniforms(seed, shape) >= p


def dare_linear(base, thetas, weights, p, seed):
    thetas, weights, base = _models("dare_linear", thetas, weights, base)
    keep = dare_keep(seed, thetas.shape, p)
    tau = np.where(keep, thetas - base[None], 0.0) / (1.0 - p)
    return base + np.sum(weights[:, None, None] * tau, axis=0) / np.sum(weights)
