"""Facts behind the gradient-clipping contract: z3 claims and the torch.nn.utils comparison.

The training run looks the implementation up through the harness's binding resolution, so a
mutant (or `falsify run --bind`) swapped in for `clip_grad_norm` is what it runs.
"""

from __future__ import annotations

import numpy as np
import torch
import z3

from falsify.proofs.bitvec import U

F32_EPS = float(np.finfo(np.float32).eps)


def _max(a, b):
    return z3.If(a >= b, a, b)


def _abs(a):
    return z3.If(a >= 0, a, -a)


# --------------------------------------------------------------------------- z3: reals
def scaled_merge_claims():
    """The Triton partial/merge rule, with the kernels' zero guards, over the reals.

    Two partials of two elements each: m_k = max|x|, s_k = Σ (x/safe_k)², safe_k = m_k if
    m_k > 0 else 1. Merged M = max(m₁, m₂), S = s₁(m₁/safe_M)² + s₂(m₂/safe_M)². Claims:
    M²·S = Σ x² (so ‖g‖ = M·√S exactly), every scaled square (x/safe_k)² ≤ 1 (the fp32 sum
    cannot overflow: at most one per element), and the running merge of the norm kernel —
    S ← S·(M_old/M_new)² + chunk — is the same identity applied once more."""
    x = z3.Reals("x1 x2 x3 x4")
    m1 = _max(_abs(x[0]), _abs(x[1]))
    m2 = _max(_abs(x[2]), _abs(x[3]))
    safe1 = z3.If(m1 > 0, m1, 1)
    safe2 = z3.If(m2 > 0, m2, 1)
    s1 = (x[0] / safe1) ** 2 + (x[1] / safe1) ** 2
    s2 = (x[2] / safe2) ** 2 + (x[3] / safe2) ** 2
    big = _max(m1, m2)
    safe = z3.If(big > 0, big, 1)
    merged = s1 * (m1 / safe) ** 2 + s2 * (m2 / safe) ** 2
    total = sum(xi * xi for xi in x)
    exact = big * big * merged == total
    bounded = z3.And(*[(xi / safe1) ** 2 <= 1 for xi in x[:2]],
                     *[(xi / safe2) ** 2 <= 1 for xi in x[2:]])
    # running form: state (M_a, S_a) merged with a chunk (m_c, s_c), as in _norm_kernel
    ma, sa, mc, sc = z3.Reals("ma sa mc sc")
    new = _max(ma, mc)
    safe_n = z3.If(new > 0, new, 1)
    running = sa * (ma / safe_n) ** 2 + sc * (mc / safe_n) ** 2
    run_ok = z3.Implies(z3.And(ma >= 0, mc >= 0, sa >= 0, sc >= 0, z3.Or(ma > 0, sa == 0),
                               z3.Or(mc > 0, sc == 0)),
                        new * new * running == ma * ma * sa + mc * mc * sc)
    return z3.And(exact, bounded, run_ok)


def coefficient_claims():
    """coef = min(1, max_norm/(‖g‖ + eps)) for ‖g‖ ≥ 0, max_norm > 0, eps ≥ 0, ‖g‖ + eps > 0:
    0 < coef ≤ 1; the clipped norm coef·‖g‖ ≤ max_norm; below the threshold (‖g‖ + eps ≤
    max_norm) coef = 1 exactly (a no-op); above it coef·(‖g‖ + eps) = max_norm."""
    n, mx, e = z3.Reals("norm max_norm eps")
    ratio = mx / (n + e)
    coef = z3.If(ratio < 1, ratio, 1)
    dom = z3.And(n >= 0, mx > 0, e >= 0, n + e > 0)
    return z3.Implies(dom, z3.And(
        coef > 0, coef <= 1, coef * n <= mx,
        z3.Implies(n + e <= mx, coef == 1),
        z3.Implies(n + e > mx, coef * (n + e) == mx)))


def launch_claims():
    """For two tensors of 1 ≤ n₀, n₁ ≤ 2^31 − MAX_BLOCK elements, running the kernel's own
    `launch_config` on 64-bit vectors: each tensor's programs cover it (progs·BLOCK ≥ n >
    (progs − 1)·BLOCK, BLOCK a power of two ≤ MAX_BLOCK), lane offsets stay < 2^31, the second
    tensor's partials start right after the first's, and the total is progs₀ + progs₁ (so the
    partials buffer of 3·total floats is written exactly once per slot)."""
    from falsify.impl.triton.grad_clip import MAX_BLOCK, launch_config

    n0, n1 = z3.BitVec("n0", 64), z3.BitVec("n1", 64)
    plan, total = launch_config([U(n0), U(n1)])
    (b0, p0, f0), (b1, p1, f1) = ((b.e, p.e, f if isinstance(f, int) else f.e)
                                  for b, p, f in plan)
    sizes = [2 ** k for k in range(MAX_BLOCK.bit_length())]
    lim = 2 ** 31 - MAX_BLOCK
    dom = z3.And(z3.UGE(n0, 1), z3.ULE(n0, lim), z3.UGE(n1, 1), z3.ULE(n1, lim))

    def covers(n, block, progs):
        cases = []
        for b in sizes:
            g = z3.UDiv(n + b - 1, b)
            cases.append(z3.Implies(block == b, z3.And(
                progs == g, z3.UGE(g * b, n), z3.ULT((g - 1) * b, n),
                z3.ULE(g * b, 2 ** 31 - 1))))
        return z3.And(z3.Or([block == b for b in sizes]), *cases)

    return z3.Implies(dom, z3.And(covers(n0, b0, p0), covers(n1, b1, p1), f0 == 0, f1 == p0,
                                  total.e == p0 + p1))


# --------------------------------------------------------------------------- loop-level run
SHAPES = ((7, 13), (64,), (1,), (3, 1, 5), (33, 2))


def _bound_clip(backend: str):
    """The contract's `clip_grad_norm` binding for `backend`, through the harness (so mutant
    and --bind overrides apply)."""
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract("grad-clip-kernel-v1"), "clip_grad_norm", backend)


def vs_torch_clip(backend, dtype, max_norm, seed):
    """Our bound clip on 3-tensor groups vs torch.nn.utils.clip_grad_norm_ (eps = 1e-6,
    foreach=False) over gradient scales 1e-4 … 1e4. Returns the largest relative error of
    the clipped gradients and of the norm, and how many scenarios actually clipped."""
    if dtype != "float32":
        raise ValueError("the torch.nn.utils comparison runs in float32")
    fn = _bound_clip(backend)
    gen = torch.Generator().manual_seed(seed)
    max_rel_g = max_rel_n = 0.0
    clipped = scenarios = 0
    trios = ((0, 1, 2), (3, 4, 1), (2, 0, 4))
    for scale in (1e-4, 1e-2, 1.0, 1e2, 1e4):
        for trio in trios:
            gs = [torch.randn(SHAPES[i], generator=gen) * scale for i in trio]
            params = [torch.zeros(g.shape, requires_grad=True) for g in gs]
            for p, g in zip(params, gs):
                p.grad = g.clone()
            want_norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0,
                                                       error_if_nonfinite=True, foreach=False)
            out = fn(gs[0], gs[1], gs[2], max_norm, 1e-6, True)
            scenarios += 1
            clipped += int(float(want_norm) > max_norm)
            max_rel_n = max(max_rel_n, abs(float(out[3]) - float(want_norm)) / float(want_norm))
            for o, p in zip(out[:3], params):
                w = p.grad
                max_rel_g = max(max_rel_g, float(((o - w).abs() / w.abs().clamp_min(
                    torch.finfo(torch.float32).tiny)).max()))
    n_total = max(sum(int(np.prod(SHAPES[i])) for i in trio) for trio in trios)
    return {"max_rel_grad": max_rel_g, "max_rel_norm": max_rel_n, "clipped": clipped,
            "scenarios": scenarios, "n": n_total, "f32_eps": F32_EPS}


def nonfinite_raises(backend, dtype):
    """error_if_nonfinite=True raises NonFiniteGradNorm for an inf and for a NaN gradient and
    leaves the inputs untouched; False returns the NaN/inf norm with the gradients unchanged."""
    from falsify.reference.grad_clip import NonFiniteGradNorm

    fn = _bound_clip(backend)
    tdt = getattr(torch, dtype)
    res = {}
    for label, bad in (("inf", float("inf")), ("nan", float("nan"))):
        gs = [torch.randn(4, 5).to(tdt), torch.randn(9).to(tdt), torch.randn(2, 3).to(tdt)]
        gs[1][3] = bad
        before = [g.clone() for g in gs]
        try:
            fn(gs[0], gs[1], gs[2], 1.0, 1e-6, True)
            res[f"{label}_raised"] = False
        except NonFiniteGradNorm:
            res[f"{label}_raised"] = True
        out = fn(gs[0], gs[1], gs[2], 1.0, 1e-6, False)
        res[f"{label}_norm"] = float(out[3])
        res[f"{label}_inputs_untouched"] = all(torch.equal(a, b) or (
            torch.isnan(a).equal(torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num()))
            for a, b in zip(gs, before))
        res[f"{label}_outputs_unchanged"] = all(
            torch.equal(o.nan_to_num(), b.nan_to_num()) and torch.isnan(o).equal(torch.isnan(b))
            for o, b in zip(out[:3], before))
    return res
