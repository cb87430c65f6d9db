"""Facts behind the AdamW contract: z3 claims (reals, IEEE floats, launch bit-vectors) and the
loop-level runs that compare our update with torch.optim.AdamW / torch.optim.Adam.

The runs resolve the implementation by module attribute at call time, so a harness that swaps a
binding by patching the module is seen here too.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import torch
import z3

from falsify.proofs.bitvec import U

F32_EPS = float(np.finfo(np.float32).eps)
HYPERPARAMETERS = ("lr", "beta1", "beta2", "eps", "weight_decay")


# --------------------------------------------------------------------------- z3: reals
def bias_correction_real_claims():
    """Over the reals, for β ∈ (0, 1) and p_t = β^t (t ≥ 1), by induction on t:

    1. 0 < p_t < 1 (base p_1 = β; step p_{t+1} = β·p_t), hence 1/(1 − p_t) > 1: bias correction
       always enlarges the raw moment;
    2. for a constant gradient g and m_0 = 0, m_t = g·(1 − p_t) (step: β·g(1 − p_t) + (1 − β)·g
       = g(1 − p_{t+1})), so m̂_t = m_t / (1 − p_t) = g exactly: the correction removes the
       zero-initialisation bias. The same algebra with g² covers v.

    z3 has no exponentiation over the reals, so p_t is a real variable and the claims are the
    induction base and step."""
    beta, p, g, m = z3.Reals("beta p g m")
    unit = z3.And(beta > 0, beta < 1)
    base = z3.Implies(unit, z3.And(beta > 0, beta < 1))
    step_range = z3.Implies(z3.And(unit, p > 0, p < 1), z3.And(beta * p > 0, beta * p < 1))
    factor = z3.Implies(z3.And(p > 0, p < 1), 1 / (1 - p) > 1)
    m1 = beta * 0 + (1 - beta) * g
    base_m = z3.Implies(unit, m1 == g * (1 - beta))
    step_m = z3.Implies(z3.And(unit, m == g * (1 - p)),
                        beta * m + (1 - beta) * g == g * (1 - beta * p))
    unbiased = z3.Implies(z3.And(p > 0, p < 1, m == g * (1 - p)), m / (1 - p) == g)
    return z3.And(base, step_range, factor, base_m, step_m, unbiased)


# --------------------------------------------------------------------------- z3: IEEE floats
def _one_minus_rounds_to_one(sort, threshold):
    x = z3.FP("x", sort)
    one, zero = z3.FPVal(1.0, sort), z3.FPVal(0.0, sort)
    d = z3.fpSub(z3.RNE(), one, x)
    unit = z3.And(z3.fpGT(x, zero), z3.fpLT(x, one))
    exact_one = z3.Implies(unit, (d == one) == z3.fpLEQ(x, z3.FPVal(threshold, sort)))
    still_above = z3.Implies(z3.And(unit, z3.fpLT(d, one)),
                             z3.fpGT(z3.fpDiv(z3.RNE(), one, d), one))
    return z3.And(exact_one, still_above)


def bias_correction_f32_claims():
    """The factor 1/(1 − β^t) evaluated in binary32 with round-to-nearest-even, for any float
    x = fl(β^t) in (0, 1):

      fl(1 − x) = 1 exactly  ⟺  x ≤ 2^-25,

    and whenever fl(1 − x) < 1 the factor fl(1/fl(1 − x)) is still > 1. So in f32 the
    correction is exactly 1 from the first t with fl(β^t) ≤ 2^-25 (β = 0.9: t ≈ 165; β = 0.999:
    t ≈ 17,000) and > 1 before it. The pv contract's AW-003 ("> 1 for t ∈ [1, 10000]") is false
    in f32 for β = 0.9; it holds over the reals (bias_correction_real_claims). The threshold is
    2^-25 = half an ulp below 1, not 2^-24: a tie at 2^-25 rounds to even, which is 1.0."""
    return _one_minus_rounds_to_one(z3.Float32(), 2.0 ** -25)


def bias_correction_f64_claims():
    """The same fact in binary64, where our backends (like torch) compute 1 − β^t on the host:
    fl(1 − x) = 1 ⟺ x ≤ 2^-54, so the host-side correction stays > 1 far longer than any
    training run; only its product η/(1 − β1^t) is later rounded to an fp32 kernel argument."""
    return _one_minus_rounds_to_one(z3.Float64(), 2.0 ** -54)


# --------------------------------------------------------------------------- z3: launch
def launch_claims():
    """For 1 ≤ numel ≤ 2^31 − MAX_BLOCK (the wrapper rejects larger tensors), on 64-bit vectors
    running the kernel's own `launch_config(numel)`: BLOCK is a power of two in [1, MAX_BLOCK],
    and BLOCK ≥ numel whenever numel ≤ MAX_BLOCK (one program for small tensors); the grid covers
    every element (grid·BLOCK ≥ numel) with no empty program ((grid − 1)·BLOCK < numel); element
    i < numel belongs to program i // BLOCK < grid; and every lane offset, masked or not, is
    < 2^31, so the kernel's int32 `offs` never wraps into a negative value that `offs < numel`
    would let through.

    Bit-vector multiplication is hard for z3, so the claims are split over the eleven possible
    block sizes (first proved to be the only ones); each case multiplies by a constant."""
    from falsify.impl.triton.adamw import MAX_BLOCK, launch_config

    n, i = z3.BitVec("numel", 64), z3.BitVec("i", 64)
    block, grid = (x.e for x in launch_config(U(n)))
    dom = z3.And(z3.UGE(n, 1), z3.ULE(n, 2 ** 31 - MAX_BLOCK))
    sizes = [2 ** k for k in range(MAX_BLOCK.bit_length())]

    def covers(b):
        g = z3.UDiv(n + b - 1, b)
        return z3.And(z3.UGE(g * b, n), z3.ULT((g - 1) * b, n), z3.ULE(g * b, 2 ** 31 - 1),
                      z3.Implies(z3.ULT(i, n), z3.ULT(z3.UDiv(i, b), g)))

    return z3.Implies(dom, z3.And(
        z3.Or([block == b for b in sizes]),
        z3.Implies(z3.ULE(n, MAX_BLOCK), z3.UGE(block, n)),
        grid == z3.UDiv(n + block - 1, block),
        *[z3.Implies(block == b, covers(b)) for b in sizes]))


# --------------------------------------------------------------------------- loop-level runs
SHAPES = ((7, 13), (64,), (1,), (3, 1, 5))  # non-power-of-2, size-1 and 3-d parameters


def _impl(backend: str):
    if backend not in ("torch", "triton"):
        raise ValueError(f"backend={backend!r}: this run compares torch or triton")
    return importlib.import_module(f"falsify.impl.{backend}.adamw")


def _grad_stream(steps: int, seed: int):
    """Seeded gradients whose scale sweeps 1e-3 … 1e3 (Adam is scale-invariant only up to ε),
    with an all-zero gradient on every 10th step for the first tensor."""
    gen = torch.Generator().manual_seed(seed)
    for t in range(1, steps + 1):
        scale = 10.0 ** ((t % 7) - 3)
        gs = [torch.randn(s, generator=gen) * scale for s in SHAPES]
        if t % 10 == 0:
            gs[0].zero_()
        yield gs


def vs_torch_adamw(backend, dtype, steps, lr, beta1, beta2, eps, weight_decay, seed):
    """Run `steps` updates of our adamw_multi (zero state from init_state) next to
    torch.optim.AdamW and next to torch.optim.Adam with coupled L2 decay, on the same gradients.

    Returns max_abs_err (ours vs AdamW, over every step and element), the scale of the run
    (largest |θ| and largest per-step |Δθ| seen in torch's AdamW trajectory) and l2_gap (final
    max |ours − Adam-L2|): a correct AdamW matches the first and is far from the second."""
    if dtype != "float32":
        raise ValueError("the torch.optim comparison runs fp32 parameters (optimizer states are "
                         "fp32 on every backend)")
    impl = _impl(backend)
    gen = torch.Generator().manual_seed(seed + 1)
    init = [torch.randn(s, generator=gen) for s in SHAPES]
    ref = [p.clone().requires_grad_(True) for p in init]
    l2 = [p.clone().requires_grad_(True) for p in init]
    ours = [p.clone() for p in init]
    opt = torch.optim.AdamW(ref, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay,
                            foreach=False)
    opt_l2 = torch.optim.Adam(l2, lr=lr, betas=(beta1, beta2), eps=eps,
                              weight_decay=weight_decay, foreach=False)
    ms, vs = impl.init_state(ours)
    max_err = max_param = max_update = 0.0
    for t, gs in enumerate(_grad_stream(steps, seed), start=1):
        before = [p.detach().clone() for p in ref]
        for p, q, g in zip(ref, l2, gs):
            p.grad = g.clone()
            q.grad = g.clone()
        opt.step()
        opt_l2.step()
        impl.adamw_multi(ours, [g.clone() for g in gs], ms, vs, t, lr, beta1, beta2, eps,
                         weight_decay)
        for p, b, o in zip(ref, before, ours):
            p = p.detach()
            max_err = max(max_err, (o - p).abs().max().item())
            max_param = max(max_param, p.abs().max().item())
            max_update = max(max_update, (p - b).abs().max().item())
    l2_gap = max((o - q.detach()).abs().max().item() for o, q in zip(ours, l2))
    return {"max_abs_err": max_err, "max_abs_param": max_param, "max_abs_update": max_update,
            "l2_gap": l2_gap, "steps": steps, "f32_eps": F32_EPS,
            "all_finite": all(bool(torch.isfinite(o).all()) for o in ours),
            "v_min": min(v.min().item() for v in vs)}


def hyperparameter_contract(backend, dtype):
    """No hyperparameter has a default and invalid values are rejected, on every public entry
    point of the backend; the AdamW optimizer class keeps the configured values.

    Returns: defaulted (names of hyperparameters that have a default anywhere: must be empty),
    missing_raises (omitting beta2 raises TypeError everywhere), invalid_tried /
    invalid_rejected (out-of-domain values raising ValueError), configured (the optimizer's
    param_groups after construction with β2 = 0.95, λ = 0.1)."""
    impl = _impl(backend)
    defaulted = []
    fns = [impl.adamw_step, impl.adamw_multi, impl.adamw_run]
    for fn in fns:
        sig = inspect.signature(fn)
        for name in HYPERPARAMETERS:
            prm = sig.parameters.get(name)
            if prm is None or prm.default is not inspect.Parameter.empty:
                defaulted.append(f"{fn.__name__}.{name}")
    p = torch.randn(5, 3, dtype=getattr(torch, dtype))
    g = torch.randn(5, 3, dtype=getattr(torch, dtype))
    m, v = torch.zeros(5, 3), torch.zeros(5, 3)
    good = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    missing_raises = True
    try:
        impl.adamw_step(p, g, m, v, 1, lr=1e-3, beta1=0.9, eps=1e-8, weight_decay=0.1)
        missing_raises = False
    except TypeError:
        pass
    bad = [dict(step=0), dict(step=1.5), dict(lr=-1e-3), dict(beta1=1.0), dict(beta2=1.0),
           dict(beta2=-0.1), dict(eps=0.0), dict(weight_decay=-0.1), dict(beta1=float("nan")),
           dict(lr=float("inf"))]
    rejected = 0
    for b in bad:
        kw = {"step": 1, **good, **b}
        try:
            impl.adamw_step(p, g, m, v, **kw)
        except ValueError:
            rejected += 1
    from falsify.impl.torch.adamw import AdamW

    w = torch.nn.Parameter(torch.randn(4, dtype=torch.float32))
    opt = AdamW([w], lr=3e-4, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1,
                backend=backend)
    group = opt.hyperparameters(0)
    class_defaults = [k for k, prm in inspect.signature(AdamW.__init__).parameters.items()
                      if k in HYPERPARAMETERS and prm.default is not inspect.Parameter.empty]
    return {"defaulted": defaulted + [f"AdamW.{k}" for k in class_defaults],
            "missing_raises": missing_raises, "invalid_tried": len(bad),
            "invalid_rejected": rejected, "configured": group}
