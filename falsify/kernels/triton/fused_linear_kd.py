"""Fused linear + knowledge distillation with Triton kernels, split as the fused linear
cross-entropy is (falsify/kernels/triton/fused_linear_cross_entropy.py): per chunk of C token rows
the
GEMMs stay in torch — z_c = x_c·Wᵀ, dx_c = G_c·W, dW += G_cᵀ·x_c — and one Triton kernel does the
per-row distillation math over the vocabulary and writes G_c = ∂L/∂z_c in place over z_c's fp32
buffer. The chunk loop, the forward-precomputed gradients and the memory bound are those of
falsify/kernels/torch/fused_linear_kd.py (its _FLKD Function); only the block differs.

`_kd_full_kernel`, one program per row, two passes over the vocabulary in BLOCK_V chunks:
  pass 1, online (running max m and rescaled sum d, exact: the online logsumexp of
  falsify/kernels/triton/cross_entropy.py) for three normalisers — lse(z), lse(z/T), lse(z_t/T) —
  and for
      a = Σ_j exp(z_t,j/T − m_t)·(z_t,j − z_j)/T   (rescaled by exp(m_t − m_t') like d_t),
  so that, with Σ_j p_t,j = 1,
      KL = Σ_j p_t,j (log p_t,j − log p_s,j) = a/d_t + lse(z/T) − lse(z_t/T),
      CE = lse(z) − z_y;
  pass 2 writes  G = s·[α·T·(exp(z/T − lse(z/T)) − exp(z_t/T − lse(z_t/T)))
                        + (1 − α)·(exp(z − lse(z)) − [j = y])]   over z,
  s = dy_ptr[t·stride] (stride 0: the one scalar 1/n) and 0 for an ignored row.
`_kd_topk_kernel`: pass 1 over the vocabulary for lse(z), lse(z/T); over the k cached entries
lse(v/T), p̃ = exp(v/T − lse(v/T)) and KL_k = Σ_K p̃·(log p̃ − z_i/T) + lse(z/T); pass 2 writes the
dense part s·[α·T·p_s + (1 − α)(p − e_y)], then (after a barrier: other threads of the program
wrote those entries) atomically adds −s·α·T·p̃ at the k indices — atomics, so repeated indices
add up as the reference's scatter-add does. A row is touched by its own program only, so the
result does not depend on scheduling.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import next_power_of_2_capped
from falsify.kernels.torch.fused_linear_kd import (
    _FLKD,
    _chunk,
    _rows_full,
    _rows_topk,
    check_args,
    check_teacher,
    check_topk,
    topk_stable,
)

__all__ = ["fused_linear_kd", "fused_linear_kd_topk", "fused_linear_kd_from_topk"]
# fused_linear_kd_topk: the application's entry point for a cached teacher, called by the
# contract's binding fused_linear_kd_from_topk on every top-k check.

MAX_BLOCK_V = 1024  # vocabulary chunk per loop iteration: a power of two
MAX_BLOCK_K = 256   # top-k chunk per loop iteration


def launch_config(C, V, K=1):
    """(grid, BLOCK_V, BLOCK_K): one program per row of the chunk; the loops
    `range(0, V, BLOCK_V)` and `range(0, K, BLOCK_K)` with masks `offs < V`, `offs < K` cover
    [0, V) and [0, K) once."""
    return C, next_power_of_2_capped(V, MAX_BLOCK_V), next_power_of_2_capped(K, MAX_BLOCK_K)


@triton.jit
def _kd_full_kernel(z_ptr, t_ptr, y_ptr, s_ptr, kl_ptr, ce_ptr, V, s_zr, s_zc, s_tr, s_tc, s_y,
                    s_s, ignore_index, temperature, alpha, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * s_zr
    t_row = t_ptr + row * s_tr
    inv_t = 1.0 / temperature
    m1 = tl.full((), float("-inf"), tl.float32)
    ms = tl.full((), float("-inf"), tl.float32)
    mt = tl.full((), float("-inf"), tl.float32)
    d1 = tl.zeros((), tl.float32)
    ds = tl.zeros((), tl.float32)
    dt = tl.zeros((), tl.float32)
    a = tl.zeros((), tl.float32)
    for c0 in range(0, V, BLOCK_V):
        offs = c0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        z = tl.load(z_row + offs * s_zc, mask=mask, other=float("-inf")).to(tl.float32)
        zt = tl.load(t_row + offs * s_tc, mask=mask, other=float("-inf")).to(tl.float32)
        m1n = tl.maximum(m1, tl.max(z, axis=0))
        d1 = d1 * tl.exp(m1 - m1n) + tl.sum(tl.exp(z - m1n), axis=0)
        m1 = m1n
        msn = tl.maximum(ms, tl.max(z * inv_t, axis=0))
        ds = ds * tl.exp(ms - msn) + tl.sum(tl.exp(z * inv_t - msn), axis=0)
        ms = msn
        mtn = tl.maximum(mt, tl.max(zt * inv_t, axis=0))
        e = tl.exp(zt * inv_t - mtn)
        r = tl.exp(mt - mtn)
        dt = dt * r + tl.sum(e, axis=0)
        # masked lanes: e = 0 and a zero difference (−inf − (−inf) would be NaN)
        diff = tl.where(mask, zt, 0.0) - tl.where(mask, z, 0.0)
        a = a * r + tl.sum(e * diff * inv_t, axis=0)
        mt = mtn
    lse1 = m1 + tl.log(d1)
    lses = ms + tl.log(ds)
    lset = mt + tl.log(dt)
    y = tl.load(y_ptr + row * s_y)
    valid = y != ignore_index
    safe_y = tl.where(valid, y, 0)
    zy = tl.load(z_row + safe_y * s_zc).to(tl.float32)
    tl.store(kl_ptr + row, tl.where(valid, a / dt + lses - lset, 0.0))
    tl.store(ce_ptr + row, tl.where(valid, lse1 - zy, 0.0))
    scale = tl.where(valid, tl.load(s_ptr + row * s_s), 0.0)
    for c0 in range(0, V, BLOCK_V):
        offs = c0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        z = tl.load(z_row + offs * s_zc, mask=mask, other=0.0).to(tl.float32)
        zt = tl.load(t_row + offs * s_tc, mask=mask, other=0.0).to(tl.float32)
        soft = alpha * temperature * (tl.exp(z * inv_t - lses) - tl.exp(zt * inv_t - lset))
        hard = tl.exp(z - lse1)
        hard = tl.where(offs == y, hard - 1.0, hard)
        g = (soft + (1.0 - alpha) * hard) * scale
        tl.store(z_row + offs * s_zc, g, mask=mask)


@triton.jit
def _kd_topk_kernel(z_ptr, v_ptr, i_ptr, y_ptr, s_ptr, kl_ptr, ce_ptr, V, K, s_zr, s_zc, s_vr,
                    s_vc, s_ir, s_ic, s_y, s_s, ignore_index, temperature, alpha,
                    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * s_zr
    v_row = v_ptr + row * s_vr
    i_row = i_ptr + row * s_ir
    inv_t = 1.0 / temperature
    m1 = tl.full((), float("-inf"), tl.float32)
    ms = tl.full((), float("-inf"), tl.float32)
    d1 = tl.zeros((), tl.float32)
    ds = tl.zeros((), tl.float32)
    for c0 in range(0, V, BLOCK_V):
        offs = c0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        z = tl.load(z_row + offs * s_zc, mask=mask, other=float("-inf")).to(tl.float32)
        m1n = tl.maximum(m1, tl.max(z, axis=0))
        d1 = d1 * tl.exp(m1 - m1n) + tl.sum(tl.exp(z - m1n), axis=0)
        m1 = m1n
        msn = tl.maximum(ms, tl.max(z * inv_t, axis=0))
        ds = ds * tl.exp(ms - msn) + tl.sum(tl.exp(z * inv_t - msn), axis=0)
        ms = msn
    lse1 = m1 + tl.log(d1)
    lses = ms + tl.log(ds)
    mk = tl.full((), float("-inf"), tl.float32)
    dk = tl.zeros((), tl.float32)
    for c0 in range(0, K, BLOCK_K):
        offs = c0 + tl.arange(0, BLOCK_K)
        v = tl.load(v_row + offs * s_vc, mask=offs < K, other=float("-inf")).to(tl.float32)
        mkn = tl.maximum(mk, tl.max(v * inv_t, axis=0))
        dk = dk * tl.exp(mk - mkn) + tl.sum(tl.exp(v * inv_t - mkn), axis=0)
        mk = mkn
    lsek = mk + tl.log(dk)
    kl = tl.zeros((), tl.float32)
    for c0 in range(0, K, BLOCK_K):
        offs = c0 + tl.arange(0, BLOCK_K)
        mask = offs < K
        v = tl.load(v_row + offs * s_vc, mask=mask, other=0.0).to(tl.float32)
        idx = tl.load(i_row + offs * s_ic, mask=mask, other=0)
        zk = tl.load(z_row + idx * s_zc, mask=mask, other=0.0).to(tl.float32)
        logp = v * inv_t - lsek
        kl += tl.sum(tl.where(mask, tl.exp(logp) * (logp - zk * inv_t), 0.0), axis=0)
    y = tl.load(y_ptr + row * s_y)
    valid = y != ignore_index
    safe_y = tl.where(valid, y, 0)
    zy = tl.load(z_row + safe_y * s_zc).to(tl.float32)
    tl.store(kl_ptr + row, tl.where(valid, kl + lses, 0.0))
    tl.store(ce_ptr + row, tl.where(valid, lse1 - zy, 0.0))
    scale = tl.where(valid, tl.load(s_ptr + row * s_s), 0.0)
    for c0 in range(0, V, BLOCK_V):
        offs = c0 + tl.arange(0, BLOCK_V)
        mask = offs < V
        z = tl.load(z_row + offs * s_zc, mask=mask, other=0.0).to(tl.float32)
        hard = tl.exp(z - lse1)
        hard = tl.where(offs == y, hard - 1.0, hard)
        g = (alpha * temperature * tl.exp(z * inv_t - lses) + (1.0 - alpha) * hard) * scale
        tl.store(z_row + offs * s_zc, g, mask=mask)
    tl.debug_barrier()  # the dense writes above come from other threads of this program
    for c0 in range(0, K, BLOCK_K):
        offs = c0 + tl.arange(0, BLOCK_K)
        mask = offs < K
        v = tl.load(v_row + offs * s_vc, mask=mask, other=0.0).to(tl.float32)
        idx = tl.load(i_row + offs * s_ic, mask=mask, other=0)
        p = tl.exp(v * inv_t - lsek)
        tl.atomic_add(z_row + idx * s_zc, -(alpha * temperature) * scale * p, mask=mask)


def _check_offsets(t: torch.Tensor, name: str) -> None:
    # column offsets `offs * stride` are int32 in the kernels (rows are int64)
    n = t.shape[1]
    if n > 2 ** 31 - 2 * MAX_BLOCK_V or (n + MAX_BLOCK_V) * abs(t.stride(1)) >= 2 ** 31:
        raise ValueError(f"{name}: {n} columns × column stride {t.stride(1)} exceed the "
                         "kernel's int32 column offsets")


def _out(z):
    kl = torch.empty(z.shape[0], dtype=torch.float32, device=z.device)
    return kl, torch.empty_like(kl)


def _block_full(z, zt, labels, scale, temperature, alpha, ignore_index):
    """Per-chunk KD against full teacher logits: (kl, ce) rows, G written over z (fp32)."""
    C, V = z.shape
    _check_offsets(z, "student logits")
    _check_offsets(zt, "teacher_logits")
    kl, ce = _out(z)
    if C:
        grid, block_v, _ = launch_config(C, V)
        _kd_full_kernel[(grid,)](z, zt, labels, scale, kl, ce, V, z.stride(0), z.stride(1),
                                 zt.stride(0), zt.stride(1), labels.stride(0), scale.stride(0),
                                 ignore_index, temperature, alpha, BLOCK_V=block_v)
    return kl, ce


def _block_topk(z, teacher, labels, scale, temperature, alpha, ignore_index):
    """Per-chunk KD against a cached top-k (values, indices) [C, k]."""
    vals, idx = teacher
    C, V = z.shape
    K = vals.shape[1]
    _check_offsets(z, "student logits")
    _check_offsets(vals, "topk_values")
    kl, ce = _out(z)
    if C:
        grid, block_v, block_k = launch_config(C, V, K)
        _kd_topk_kernel[(grid,)](z, vals, idx, labels, scale, kl, ce, V, K, z.stride(0),
                                 z.stride(1), vals.stride(0), vals.stride(1), idx.stride(0),
                                 idx.stride(1), labels.stride(0), scale.stride(0),
                                 ignore_index, temperature, alpha, BLOCK_V=block_v,
                                 BLOCK_K=block_k)
    return kl, ce


def fused_linear_kd(x, weight, teacher_logits, labels, temperature, alpha, ignore_index=-100,
                    chunk_size=None):
    check_args("fused_linear_kd", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size, triton_dtypes())
    check_teacher("fused_linear_kd", x, weight, teacher_logits, triton_dtypes())
    return _FLKD.apply(x, weight, teacher_logits.detach(), labels, float(temperature),
                       float(alpha), ignore_index, _chunk(chunk_size, x, weight), _block_full,
                       _rows_full)


def fused_linear_kd_topk(x, weight, topk_values, topk_indices, labels, temperature, alpha,
                         ignore_index=-100, chunk_size=None):
    check_args("fused_linear_kd_topk", x, weight, labels, temperature, alpha, ignore_index,
               chunk_size, triton_dtypes())
    check_topk("fused_linear_kd_topk", x, weight, topk_values, topk_indices, triton_dtypes())
    return _FLKD.apply(x, weight, (topk_values.detach(), topk_indices), labels,
                       float(temperature), float(alpha), ignore_index,
                       _chunk(chunk_size, x, weight), _block_topk, _rows_topk)


def fused_linear_kd_from_topk(x, weight, teacher_logits, labels, temperature, alpha, k,
                              ignore_index=-100, chunk_size=None):
    check_teacher("fused_linear_kd_topk", x, weight, teacher_logits, triton_dtypes())
    vals, idx = topk_stable(teacher_logits, k)
    return fused_linear_kd_topk(x, weight, vals, idx, labels, temperature, alpha, ignore_index,
                                chunk_size)
