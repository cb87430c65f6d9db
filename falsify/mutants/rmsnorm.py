"""RMSNorm mutants: the bugs the rmsnorm contract's checks must catch.

Each has the signature of the binding it replaces (rmsnorm(x, w, eps, out=None))."""

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import itertools

import torch
import triton
import triton.language as tl

from falsify.kernels.torch import rmsnorm as rmsnorm_torch
from falsify.kernels.triton import rmsnorm as tri


def eps_outside_sqrt(x, w, eps, out=None):
    """x / (sqrt(mean(x²)) + eps): the pv qa_gate's "eps placement" bug. Invisible while
    mean(x²) ≫ eps; a relative error of ~eps/(2·rms) when rows are small."""
    xf = x.float()
    y = (xf / (xf.pow(2).mean(dim=-1, keepdim=True).sqrt() + eps) * w.float()).to(x.dtype)
    return out.copy_(y) if out is not None else y


def mean_over_wrong_axis(x, w, eps, out=None):
    """mean(x²) over the rows (dim 0) instead of the hidden dimension."""
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(dim=0, keepdim=True) + eps)
    y = (xf * inv * w.float()).to(x.dtype)
    return out.copy_(y) if out is not None else y


class _SavesNormed(torch.autograd.Function):
    """Correct values, but the forward keeps `normed` (B·S·H fp32) alive for the backward —
    the 384 MB per 24 layers that saving only inv_var removes."""

    @staticmethod
    def forward(ctx, x, w, eps):
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        normed = xf * inv
        ctx.save_for_backward(normed, w, inv)
        return (normed * w.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        normed, w, inv = ctx.saved_tensors
        g = dy.float() * w.float()
        dx = inv * (g - normed * (g * normed).mean(dim=-1, keepdim=True))
        dw = (dy.float() * normed).reshape(-1, normed.shape[-1]).sum(dim=0)
        return dx.to(dy.dtype), dw.to(w.dtype), None


def saves_normed(x, w, eps, out=None):
    y = _SavesNormed.apply(x, w, float(eps))
    return out.copy_(y) if out is not None else y


class _DetachedNormalizer(torch.autograd.Function):
    """Backward as if inv_rms were a constant (e.g. computed under no_grad / .detach()):
    dx = r·g, dropping −r·x̂·mean(g ⊙ x̂). Forward values are correct."""

    @staticmethod
    def forward(ctx, x, w, eps):
        xf = x.float()
        inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, inv)
        return (xf * inv * w.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, w, inv = ctx.saved_tensors
        dx = inv * dy.float() * w.float()
        dw = (dy.float() * x.float() * inv).reshape(-1, x.shape[-1]).sum(dim=0)
        return dx.to(x.dtype), dw.to(w.dtype), None


def detached_normalizer(x, w, eps, out=None):
    y = _DetachedNormalizer.apply(x, w, float(eps))
    return out.copy_(y) if out is not None else y


@triton.jit
def _bwd_seed_formula_kernel(x_ptr, w_ptr, inv_ptr, dy_ptr, dw_ptr, dx_ptr, n,
                             sx_row, sx_col, sw, sdy_row, sdy_col, sdx_row, sdx_col,
                             BLOCK: tl.constexpr):
    """A published backward: d_input = (grad_output·W − normed·d_weight_sum)·inv,
    i.e. the column sum dw where the per-row mean of g·x̂ belongs."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * sx_row + offs * sx_col, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * sdy_row + offs * sdy_col, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs * sw, mask=mask, other=0.0).to(tl.float32)
    dw = tl.load(dw_ptr + offs, mask=mask, other=0.0)
    inv = tl.load(inv_ptr + row)
    xhat = x * inv
    dx = (dy * w - xhat * dw) * inv
    tl.store(dx_ptr + row * sdx_row + offs * sdx_col, dx.to(dx_ptr.dtype.element_ty), mask=mask)


class _TritonSeedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, eps):
        y, inv = tri.launch_forward(x, w, eps)
        ctx.save_for_backward(x, w, inv)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, inv = ctx.saved_tensors
        n = x.shape[-1]
        _, dw = tri.launch_backward(x, w, inv, dy)  # the correct dw, summed over rows
        x2, dy2 = x.reshape(-1, n), dy.reshape(-1, n)
        dx = torch.empty(x2.shape, dtype=x.dtype)
        _bwd_seed_formula_kernel[(x2.shape[0],)](
            x2, w, inv.reshape(-1), dy2, dw.float().contiguous(), dx, n,
            x2.stride(0), x2.stride(1), w.stride(0), dy2.stride(0), dy2.stride(1),
            dx.stride(0), dx.stride(1), BLOCK=tri.launch_config(x2.shape[0], n)["BLOCK"])
        return dx.view(x.shape), dw, None


def triton_backward_seed_formula(x, w, eps, out=None):
    tri.check_args(x, w, eps, out)
    if out is not None:
        return tri.rmsnorm(x, w, eps, out=out)
    return _TritonSeedBackward.apply(x, w, float(eps))


def inv_rms_with_graph(x, w, eps, out=None):
    """rmsnorm_forward whose inv_rms comes back with an autograd graph: the backward still takes
    no gradient for it, so a loss built on inv_rms silently loses that part of its gradient."""
    from falsify.kernels.torch import rmsnorm as tr

    class _WithGraph(tr._RMSNormFunction):
        @staticmethod
        def forward(ctx, x, w, eps):
            y, inv_rms = tr._RMSNormFunction.forward(ctx, x, w, eps)
            return y, inv_rms.clone()  # the clone is an unmarked output: differentiable

    tr.check_args(x, w, eps, out)
    y, inv_rms = _WithGraph.apply(x, w, float(eps))
    if out is not None:
        out.copy_(y)
        y = out
    return y, inv_rms


# ---------------------------------------------------------------- determinism, batch invariance
_CALLS = itertools.count()


def _row_sum(sq: torch.Tensor, sequential: bool) -> torch.Tensor:
    """Σ over the last dim, vectorised (torch's sum) or sequential (a running sum): equally
    accurate, rounded differently in ~40 % of rows of random data."""
    return sq.cumsum(-1)[..., -1] if sequential else sq.sum(-1)


class _RowSumOrder(rmsnorm_torch._RMSNormFunction):
    """The real RMSNorm (same saved tensors, same backward) with the row sum taken in the
    order `sequential` says: each mutant below only chooses that order."""

    @staticmethod
    def forward(ctx, x, w, eps, sequential):
        xf = x.float()
        inv_rms = torch.rsqrt(_row_sum(xf * xf, sequential).div_(x.shape[-1]).add_(eps))
        y = (xf * inv_rms.unsqueeze(-1)).mul_(w.float()).to(x.dtype)
        ctx.save_for_backward(x, w, inv_rms)
        ctx.mark_non_differentiable(inv_rms)
        return y, inv_rms

    @staticmethod
    def backward(ctx, dy, d_inv_rms):
        return (*rmsnorm_torch._RMSNormFunction.backward(ctx, dy, d_inv_rms), None)


def _with_order(x, w, eps, out, sequential: bool):
    rmsnorm_torch.check_args(x, w, eps, out)
    y = _RowSumOrder.apply(x, w, float(eps), sequential)[0]
    return out.copy_(y) if out is not None else y


def order_from_call_count(x, w, eps, out=None):
    """The row's sum accumulated in an order that alternates from call to call, as atomics
    combine partial sums in whatever order the scheduler finishes the blocks: every result is
    as accurate as the contract's tolerance allows, but two runs on the same input differ in
    the last bits."""
    return _with_order(x, w, eps, out, next(_CALLS) % 2 == 0)


def split_from_batch_size(x, w, eps, out=None):
    """The reduction's path chosen from the batch size (a split-K picked to fill the grid):
    one summation order for a lone row, another when rows share the call. Deterministic and
    accurate, but a row's result depends on how many rows came with it."""
    return _with_order(x, w, eps, out, x.reshape(-1, x.shape[-1]).shape[0] > 1)


def computes_float64_in_float32(x, w, eps, out=None):
    """The wrapper as it was before dtypes were declared: it takes any floating tensor, so a
    float64 input is computed by the float32 kernel and handed back as float64, with float32
    accuracy nobody checked (and bfloat16 runs a path no check vetted). Correct on every dtype
    the contract declares."""
    if x.dtype in (torch.float32, torch.float16) and w.dtype == x.dtype:
        return rmsnorm_torch.rmsnorm(x, w, eps, out)
    if not (x.is_floating_point() and w.is_floating_point()):
        raise TypeError(f"rmsnorm: x and w must be floating point, got {x.dtype}, {w.dtype}")
    y = rmsnorm_torch.rmsnorm(x.float(), w.float(), eps).to(x.dtype)
    return out.copy_(y) if out is not None else y


# ---------------------------------------------------------------- second order
class _SecondOrderOnSavedStatistic(rmsnorm_torch._RMSNormFunction):
    """The real forward; a backward with the same formula, out of place (so it can be
    differentiated again) but on the saved inv_rms, which the forward marks
    non-differentiable: to autograd r is a constant, so dx and dw are exact while the double
    backward drops every term through ∂r/∂x."""

    @staticmethod
    def backward(ctx, dy, _d_inv_rms):
        x, w, inv_rms = ctx.saved_tensors
        r = inv_rms.unsqueeze(-1)
        xhat = x.float() * r
        dyf = dy.float()
        g = dyf * w.float()
        c = torch.linalg.vecdot(g, xhat).div(x.shape[-1]).unsqueeze(-1)
        dx = ((g - xhat * c) * r).to(x.dtype)
        dw = (xhat * dyf).reshape(-1, x.shape[-1]).sum(dim=0).to(w.dtype)
        return dx, dw, None


def second_order_through_saved_inv_rms(x, w, eps, out=None):
    rmsnorm_torch.check_args(x, w, eps, out)
    y = _SecondOrderOnSavedStatistic.apply(x, w, float(eps))[0]
    return out.copy_(y) if out is not None else y
