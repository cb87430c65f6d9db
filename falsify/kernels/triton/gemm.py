"""GEMM in Triton: C = α·op(A)·op(B) + β·C, forward and backward, fp32 accumulation.

One kernel serves every transpose combination: op(X) = Xᵀ is a stride swap, so the wrapper
passes the strides of op(A) [M, K] and op(B) [K, N] and the kernel never knows about transposes.
That is exactly where a classic bug lives (a stride baked from the wrong dimension), so
the strides are always taken from the tensors, never derived from M, N or K.

Grid: one program per BLOCK_M × BLOCK_N output tile; each walks cdiv(K, BLOCK_K) K-tiles, with
every load masked on m < M, n < N, k < K (masked lanes read nothing, so NaN margins around a
view never leak in) and accumulates with tl.dot into an fp32 accumulator. fp32 inputs use
input_precision="ieee": on a GPU the tl.dot default is TF32 (10-bit mantissa), which is not an
fp32 GEMM — and a tensor-core path can produce NaN at ~1e5 in backward GEMMs.

β = 0 is the BLAS rule: HAS_C is False and C is never loaded.

Backward (G = ∂L/∂C_out; derivation in falsify/reference/gemm.py), each term one more call of the
same
kernel with transpose flags, so the transposed backward GEMMs are the forward kernel:
    ∂L/∂A = α·G·op(B)ᵀ            (trans_a = False)      ∂L/∂A = α·op(B)·Gᵀ   (trans_a = True)
    ∂L/∂B = α·op(A)ᵀ·G            (trans_b = False)      ∂L/∂B = α·Gᵀ·op(A)   (trans_b = True)
    ∂L/∂C = β·G
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_clamped
from falsify.kernels.torch.gemm import check_args
from falsify.kernels.triton.autograd import once_differentiable

__all__ = ["gemm"]

# Triton computes offsets in int32: every element a kernel touches must sit below 2^31
# elements from its base pointer (falsify/proofs/gemm.py proves masked offsets stay below the
# view's extent, and the wrapper refuses views whose extent passes this bound).
MAX_EXTENT = 2**31 - 1


def launch_config(m, n, k):
    """Pure integer launch arithmetic, also run on z3 bit-vectors (falsify/proofs/gemm.py).
    Tiles are powers of two in [16, 64] (tl.dot needs ≥ 16 in every dimension; 64 keeps the
    sm_80/sm_90 shared-memory footprint small); K-tiles in [16, 32]."""
    bm = next_power_of_2_clamped(m, 16, 64)
    bn = next_power_of_2_clamped(n, 16, 64)
    bk = next_power_of_2_clamped(k, 16, 32)
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
            "grid_m": cdiv(m, bm), "grid_n": cdiv(n, bn), "k_tiles": cdiv(k, bk)}


def span(rows, cols, s_row, s_col):
    """Elements a non-empty [rows, cols] view with strides (s_row, s_col) reaches from its base:
    one past its largest offset. Pure integer arithmetic (run on z3 bit-vectors too)."""
    return 1 + (rows - 1) * s_row + (cols - 1) * s_col


def extent(shape, strides):
    """`span` of a 2-D view; 0 for an empty one."""
    if shape[0] == 0 or shape[1] == 0:
        return 0
    return span(shape[0], shape[1], strides[0], strides[1])


@triton.jit
def gemm_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K,
                stride_am, stride_ak, stride_bk, stride_bn,
                stride_cm, stride_cn, stride_om, stride_on,
                alpha, beta,
                HAS_C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        ks = kt * BLOCK_K + offs_k
        mask_k = ks < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        # Zero-filled tails contribute exact zeros to the fp32 sum.
        acc = tl.dot(a, b, acc, input_precision="ieee")
    acc = acc * alpha
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_C:
        c = tl.load(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                    mask=mask, other=0.0)
        acc += beta * c.to(tl.float32)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


def _op_strides(x: torch.Tensor, trans: bool) -> tuple[int, int]:
    s0, s1 = x.stride()
    return (s1, s0) if trans else (s0, s1)


def _check_extents(**tensors) -> None:
    for name, t in tensors.items():
        if t is not None and extent(t.shape, t.stride()) > MAX_EXTENT:
            raise ValueError(f"gemm: {name} spans {extent(t.shape, t.stride())} elements; the "
                             f"kernel's int32 offsets reach {MAX_EXTENT}")


def launch(a, b, c, alpha, beta, trans_a, trans_b, out, m, n, k, kernel=None):
    """Run the forward kernel into `out` ([M, N], any strides). `kernel` lets mutants swap
    the kernel while keeping the launch."""
    _check_extents(a=a, b=b, c=c, out=out)
    if m == 0 or n == 0:
        return out
    cfg = launch_config(m, n, k)
    has_c = beta != 0.0
    cc = c if has_c else out  # never dereferenced when HAS_C is False
    scm, scn = (c.stride() if has_c else (0, 0))
    sam, sak = _op_strides(a, trans_a)
    sbk, sbn = _op_strides(b, trans_b)
    (kernel or gemm_kernel)[(cfg["grid_m"], cfg["grid_n"])](
        a, b, cc, out, m, n, k, sam, sak, sbk, sbn, scm, scn, out.stride(0), out.stride(1),
        float(alpha), float(beta), HAS_C=has_c, BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"])
    return out


def _gemm_nograd(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None):
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out, triton_dtypes())
    if out is None:
        out = torch.empty((m, n), dtype=odt, device=a.device)
    return launch(a, b, c, alpha, beta, trans_a, trans_b, out, m, n, k)


def backward_terms(a, b, g, alpha, trans_a, trans_b, need_a, need_b, mm=_gemm_nograd):
    """(∂L/∂A, ∂L/∂B) from G, each one GEMM; `mm` is the GEMM used (mutants substitute)."""
    da = db = None
    if need_a:
        if trans_a:  # ∂L/∂A = α·op(B)·Gᵀ, [K, M]
            da = mm(b, g, alpha=alpha, trans_a=trans_b, trans_b=True)
        else:        # ∂L/∂A = α·G·op(B)ᵀ, [M, K]
            da = mm(g, b, alpha=alpha, trans_b=not trans_b)
    if need_b:
        if trans_b:  # ∂L/∂B = α·Gᵀ·op(A), [N, K]
            db = mm(g, a, alpha=alpha, trans_a=True, trans_b=trans_a)
        else:        # ∂L/∂B = α·op(A)ᵀ·G, [K, N]
            db = mm(a, g, alpha=alpha, trans_a=not trans_a)
    return da, db


class GemmTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c, alpha, beta, trans_a, trans_b):
        y = _gemm_nograd(a, b, c, alpha, beta, trans_a, trans_b)
        ctx.save_for_backward(a, b)
        ctx.cfg = (alpha, beta, trans_a, trans_b)
        return y

    @staticmethod
    @once_differentiable("gemm (Triton)")
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        alpha, beta, trans_a, trans_b = ctx.cfg
        g = g.to(a.dtype)
        da, db = backward_terms(a, b, g, alpha, trans_a, trans_b, ctx.needs_input_grad[0],
                                ctx.needs_input_grad[1])
        dc = beta * g if ctx.needs_input_grad[2] else None
        return da, db, dc, None, None, None, None


def gemm(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, alpha: float = 1.0,
         beta: float = 0.0, trans_a: bool = False, trans_b: bool = False,
         out: torch.Tensor | None = None) -> torch.Tensor:
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out, triton_dtypes())
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (a, b, c))
    if out is not None:
        if needs_grad:
            raise RuntimeError("gemm: out= does not support autograd (inputs require grad)")
        return launch(a, b, c, alpha, beta, trans_a, trans_b, out, m, n, k)
    # Always through the Function, even when nothing requires grad: forward-mode AD does not
    # set requires_grad (nor need grad mode), and a bare kernel launch would drop the inputs'
    # tangents silently; the Function refuses forward mode with a clear error instead.
    return GemmTriton.apply(a, b, c, alpha, beta, trans_a, trans_b)
