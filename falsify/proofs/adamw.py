"""Symbolic facts behind the AdamW contract: z3 claims over the reals, IEEE floats and the
launch bit-vectors. (The loop-level runs against torch.optim are in falsify/probes/adamw.py.)
"""

from __future__ import annotations

import z3

from falsify.proofs.bitvec import U


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
    from falsify.kernels.triton.adamw import MAX_BLOCK, launch_config

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
