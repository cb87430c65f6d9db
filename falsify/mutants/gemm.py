"""GEMM mutants: the bugs the gemm contract's checks must catch. Same signature as the bound
`gemm`; the Triton ones launch the real kernel with a wrong argument, or a buggy copy of it."""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.torch.gemm import check_args
from falsify.kernels.triton import gemm as tg


def triton_nk_swapped_ldc(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                          out=None):
    """n and k swapped: the kernel was built as tiled_unrolled(m, k, n) and baked K
    where N belonged, so output rows are written K elements apart instead of N. The rows land in
    the [M, N] buffer and spill past its end into the neighbouring allocation (`spill`)."""
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out)
    res = out if out is not None else torch.empty((m, n), dtype=odt)
    buf = torch.zeros(m * max(n, k, 1) + n, dtype=odt)  # C followed by its neighbour
    rows_k_apart = buf.as_strided((m, n), (k, 1))
    tg.launch(a, b, c, alpha, beta, trans_a, trans_b, rows_k_apart, m, n, k)
    with torch.no_grad():
        res.copy_(buf[: m * n].view(m, n))
    return res


def triton_beta_ignored(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                        out=None):
    """β·C dropped: the kernel is launched as if β were 0 (HAS_C False)."""
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out)
    res = out if out is not None else torch.empty((m, n), dtype=odt)
    return tg.launch(a, b, None, alpha, 0.0, trans_a, trans_b, res, m, n, k)


@triton.jit
def gemm_kernel_lowp_acc(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K,
                         stride_am, stride_ak, stride_bk, stride_bn,
                         stride_cm, stride_cn, stride_om, stride_on,
                         alpha, beta,
                         HAS_C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """The accumulator lives in the input dtype: each K-tile's sum is rounded to fp16 (and
    overflows at 65504). For fp32 inputs this is the correct kernel."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=a_ptr.dtype.element_ty)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        ks = kt * BLOCK_K + offs_k
        mask_k = ks < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = (acc + tl.dot(a, b, input_precision="ieee")).to(a_ptr.dtype.element_ty)
    res = acc.to(tl.float32) * alpha
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_C:
        c = tl.load(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                    mask=mask, other=0.0)
        res += beta * c.to(tl.float32)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             res.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemm_kernel_no_k_tail(a_ptr, b_ptr, c_ptr, out_ptr, M, N, K,
                          stride_am, stride_ak, stride_bk, stride_bn,
                          stride_cm, stride_cn, stride_om, stride_on,
                          alpha, beta,
                          HAS_C: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    """The K loop runs K // BLOCK_K full tiles with no `k < K` mask: the K mod BLOCK_K tail
    terms are never accumulated (the masked-tail tile is missing)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, K // BLOCK_K):
        ks = kt * BLOCK_K + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=mask_m[:, None], other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    acc = acc * alpha
    mask = mask_m[:, None] & mask_n[None, :]
    if HAS_C:
        c = tl.load(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn,
                    mask=mask, other=0.0)
        acc += beta * c.to(tl.float32)
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=mask)


def _with_kernel(kernel, a, b, c, alpha, beta, trans_a, trans_b, out):
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out)
    res = out if out is not None else torch.empty((m, n), dtype=odt)
    return tg.launch(a, b, c, alpha, beta, trans_a, trans_b, res, m, n, k, kernel=kernel)


def triton_fp16_accumulator(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                            out=None):
    return _with_kernel(gemm_kernel_lowp_acc, a, b, c, alpha, beta, trans_a, trans_b, out)


def triton_no_k_tail(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                     out=None):
    return _with_kernel(gemm_kernel_no_k_tail, a, b, c, alpha, beta, trans_a, trans_b, out)


class _ReshapeBackward(tg.GemmTriton):
    """∂L/∂A for trans_a computed as α·G·op(B)ᵀ (shape [M, K]) and then *reshaped* to [K, M]
    instead of transposed: the shapes agree, the values are scrambled."""

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        alpha, beta, trans_a, trans_b = ctx.cfg
        g = g.to(a.dtype)
        da, db = tg.backward_terms(a, b, g, alpha, trans_a, trans_b, ctx.needs_input_grad[0],
                                   ctx.needs_input_grad[1])
        if da is not None and trans_a:
            d_opa = tg.backward_terms(a, b, g, alpha, False, trans_b, True, False)[0]  # [M, K]
            da = d_opa.reshape(a.shape)
        dc = beta * g if ctx.needs_input_grad[2] else None
        return da, db, dc, None, None, None, None


def triton_backward_reshape(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                            out=None):
    check_args(a, b, c, alpha, beta, trans_a, trans_b, out)
    if out is not None or not torch.is_grad_enabled():
        return tg.gemm(a, b, c, alpha, beta, trans_a, trans_b, out)
    return _ReshapeBackward.apply(a, b, c, float(alpha), float(beta), bool(trans_a),
                                  bool(trans_b))


class _HalfBackward(torch.autograd.Function):
    """The backward GEMMs (all of which have a transposed operand) run on an fp16 tensor-core
    algorithm: operands are rounded to fp16, so gradients at ~1e5 become inf − inf = NaN (as with
    cuBLAS's CUBLAS_GEMM_DEFAULT_TENSOR_OP) and ordinary ones lose fp32 precision."""

    @staticmethod
    def forward(ctx, a, b, c, alpha, beta, trans_a, trans_b):
        from falsify.kernels.torch.gemm import gemm

        ctx.save_for_backward(a, b)
        ctx.cfg = (alpha, beta, trans_a, trans_b)
        return gemm(a, b, c, alpha, beta, trans_a, trans_b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        alpha, beta, trans_a, trans_b = ctx.cfg
        opa = (a.t() if trans_a else a).half()
        opb = (b.t() if trans_b else b).half()
        gh = g.half()
        d_opa = (gh @ opb.t()).float() * alpha
        d_opb = (opa.t() @ gh).float() * alpha
        da = (d_opa.t() if trans_a else d_opa).to(a.dtype)
        db = (d_opb.t() if trans_b else d_opb).to(b.dtype)
        dc = beta * g if ctx.needs_input_grad[2] else None
        return da, db, dc, None, None, None, None


def torch_backward_fp16_tensor_cores(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False,
                                     trans_b=False, out=None):
    from falsify.kernels.torch.gemm import gemm

    check_args(a, b, c, alpha, beta, trans_a, trans_b, out)
    if out is not None or not torch.is_grad_enabled():
        return gemm(a, b, c, alpha, beta, trans_a, trans_b, out)
    return _HalfBackward.apply(a, b, c, float(alpha), float(beta), bool(trans_a),
                               bool(trans_b))


def torch_beta0_reads_c(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                        out=None):
    """β·C added even when β = 0: 0·NaN = NaN leaks an uninitialised C into the result."""
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, out)
    opa = a.t() if trans_a else a
    opb = b.t() if trans_b else b
    y = alpha * torch.matmul(opa.float(), opb.float())
    if c is not None:
        y = y + beta * c.float()
    y = y.to(odt)
    if out is not None:
        out.copy_(y)
        return out
    return y


def triton_no_out_check(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False,
                        out=None):
    """Trusts the caller's `out`: no shape/dtype check, rows addressed with out's own row
    stride, M×N elements written wherever that leads (no buffer-size check)."""
    m, n, k, alpha, beta, trans_a, trans_b, odt = check_args(a, b, c, alpha, beta, trans_a,
                                                             trans_b, None)
    if out is None:
        out = torch.empty((m, n), dtype=odt)
    view = out if out.dim() == 2 else out.as_strided((m, n), (n, 1))
    tg.launch(a, b, c, alpha, beta, trans_a, trans_b, view, m, n, k)
    return out
