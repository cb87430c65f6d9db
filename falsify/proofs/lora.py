"""Symbolic facts behind the lora contract (z3). (The init / frozen-base run is in
falsify/probes/lora.py.)

* `backward_claims`: the closed-form gradients dx = g·W + s·(g·B)·A, dA = s·(g·B)ᵀ·x,
  dB = s·gᵀ·(x·Aᵀ) are the adjoint of the forward's differential, as a polynomial identity over
  the reals for symbolic matrices (m=2, in=3, out=2, r=2, symbolic s). This proves the formulas
  the contract and the kernels implement, not the float code.
* `tiling_claims`: falsify/kernels/triton/lora.py's `launch_config` itself, run on z3 bit-vectors.
"""

from __future__ import annotations

import z3

from falsify.proofs.nf4 import in_range, var


def _mat(name, rows, cols):
    return [[z3.Real(f"{name}_{i}_{j}") for j in range(cols)] for i in range(rows)]


def _mm(p, q):
    return [[z3.Sum([p[i][k] * q[k][j] for k in range(len(q))]) for j in range(len(q[0]))]
            for i in range(len(p))]


def _t(p):
    return [list(col) for col in zip(*p)]


def _add(p, q):
    return [[a + b for a, b in zip(rp, rq)] for rp, rq in zip(p, q)]


def _scale(s, p):
    return [[s * a for a in row] for row in p]


def _inner(p, q):
    return z3.Sum([a * b for rp, rq in zip(p, q) for a, b in zip(rp, rq)])


def backward_claims(m=2, n_in=3, n_out=2, r=2):
    """⟨g, Dy[dx, dA, dB]⟩ = ⟨dx_formula, dx⟩ + ⟨dA_formula, dA⟩ + ⟨dB_formula, dB⟩ for all
    real x, W, A, B, g, s and directions (dx, dA, dB), where Dy is the derivative of
    y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ (exact: y is affine in each argument separately, so its first-order
    part is read off by expanding the product)."""
    x, w, a, b = _mat("x", m, n_in), _mat("w", n_out, n_in), _mat("a", r, n_in), _mat("b", n_out, r)
    g = _mat("g", m, n_out)
    dx, da, db = _mat("dx", m, n_in), _mat("da", r, n_in), _mat("db", n_out, r)
    s = z3.Real("s")
    # differential of y in direction (dx, dA, dB), W fixed
    dy = _add(_add(_mm(dx, _t(w)), _scale(s, _mm(_mm(dx, _t(a)), _t(b)))),
              _add(_scale(s, _mm(_mm(x, _t(da)), _t(b))), _scale(s, _mm(_mm(x, _t(a)), _t(db)))))
    u = _mm(g, b)
    gx = _add(_mm(g, w), _scale(s, _mm(u, a)))
    ga = _scale(s, _mm(_t(u), x))
    gb = _scale(s, _mm(_t(g), _mm(x, _t(a))))
    return _inner(g, dy) == _inner(gx, dx) + _inner(ga, da) + _inner(gb, db)


def init_claims(m=2, n_in=3, n_out=2, r=2):
    """With B = 0: the adapted output equals the base output and dA = s·(g·B)ᵀ·x = 0 for every
    x, W, A, g, s (the reason only B moves on the first step)."""
    x, w, a = _mat("x", m, n_in), _mat("w", n_out, n_in), _mat("a", r, n_in)
    g = _mat("g", m, n_out)
    b = [[z3.RealVal(0)] * r for _ in range(n_out)]
    s = z3.Real("s")
    y = _add(_mm(x, _t(w)), _scale(s, _mm(_mm(x, _t(a)), _t(b))))
    base = _mm(x, _t(w))
    da = _scale(s, _mm(_t(_mm(g, b)), x))
    return z3.And([z3.simplify(yy - bb) == 0 for ry, rb in zip(y, base) for yy, bb in zip(ry, rb)]
                  + [d == 0 for row in da for d in row])


def tiling_claims():
    """`launch_config` of falsify/kernels/triton/lora.py run on symbolic sizes 1 ≤ M, N, K < 2^31:
    every
    tile is a power of two in [16, 64] (tl.dot needs ≥ 16) and ≥ min(size, 64); the grid
    cdiv(size, tile) covers all rows / columns with no idle program; the K loop
    `range(0, K, BK)` visits each k < K exactly once (k0 = ⌊k/BK⌋·BK < K, lane k − k0 < BK)."""
    from falsify.kernels.triton.lora import BLOCK_K, MAX_TILE, MIN_TILE, launch_config

    m, n, k1, k2, k = var("m"), var("n"), var("k1"), var("k2"), var("k")
    cfg = launch_config(m, n, k1, k2)
    claims = []
    for size, tile, grid in ((m, cfg["BM"], cfg["grid"][0]), (n, cfg["BN"], cfg["grid"][1])):
        claims.append(z3.Implies(in_range(size), z3.And(
            tile >= MIN_TILE, tile <= MAX_TILE, (tile & (tile - 1)).eq(0),
            z3.Or(tile >= size, tile.eq(MAX_TILE)),
            grid * tile >= size, (grid - 1) * tile < size)))
    bk2 = cfg["BK2"]
    claims.append(z3.Implies(in_range(k2), z3.And(bk2 >= MIN_TILE, bk2 <= MAX_TILE,
                                                   (bk2 & (bk2 - 1)).eq(0))))
    k0 = (k // BLOCK_K) * BLOCK_K
    claims.append(z3.Implies(z3.And(in_range(k1), k < k1),
                             z3.And(k0 < k1, k - k0 < BLOCK_K, (k0 % BLOCK_K).eq(0))))
    return z3.And(claims)
