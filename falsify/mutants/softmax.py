"""Softmax mutants: the bugs the softmax contract's checks must catch."""

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.launch import next_power_of_2
from falsify.kernels.torch import softmax as torch_softmax
from falsify.kernels.triton import softmax as tri_softmax


def no_max_subtraction(x: torch.Tensor) -> torch.Tensor:
    """exp(x) overflows to inf for x > 88 (fp32) / 11 (fp16): inf/inf = NaN."""
    e = torch.exp(x.float())
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def sum_over_wrong_axis(x: torch.Tensor) -> torch.Tensor:
    """Normalizer over the rows (dim 0) instead of the columns."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=0, keepdim=True)).to(x.dtype)


def half_precision_normalizer(x: torch.Tensor) -> torch.Tensor:
    """Row sum accumulated in fp16: ~1e-3 relative error, invisible to 'rows sum to 1'
    at a loose tolerance, caught by parity at the derived fp32 tolerance."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.half().sum(dim=-1, keepdim=True).float()).to(x.dtype)


def cuda_half_normalizer(x: torch.Tensor) -> torch.Tensor:
    """The real torch kernel on the CPU; on CUDA the row sum is accumulated in fp16 (a
    device-only fast path). Every CPU check passes it; only a run on the GPU can see it."""
    if not x.is_cuda:
        return torch_softmax.softmax(x)
    return half_precision_normalizer(x)


def _largest_power_of_2_at_most(n):
    return next_power_of_2(n + 1) >> 1


def triton_no_tail_mask(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The real Triton kernel launched with BLOCK = largest power of two ≤ n: lanes cover only
    the first BLOCK columns, so the row tail is neither read (missing from max and sum) nor
    written (left as whatever `out` held). Identical to the kernel when n is a power of two."""
    tri_softmax.check_args(x, out)
    return tri_softmax.launch(x, out, block_of=_largest_power_of_2_at_most)


@triton.jit
def _unit_column_stride_kernel(x_ptr, y_ptr, n, sx_row, sy_row, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * sx_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    y = tl.div_rn(e, tl.sum(e, axis=0))
    tl.store(y_ptr + row * sy_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def triton_assumes_unit_column_stride(x: torch.Tensor,
                                      out: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel given only the row strides, columns indexed contiguously: right for every
    tensor whose last stride is 1 (the poisoned-margin views included, whose rows are padded),
    wrong for a transposed or stepped view, whose columns are stride(-1) elements apart."""
    tri_softmax.check_args(x, out)
    n = x.shape[-1]
    x2 = x if x.dim() == 2 else x.reshape(-1, n)
    m = x2.shape[0]
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2 = y if y.dim() == 2 else y.view(-1, n)
    if m > 0:
        _unit_column_stride_kernel[(m,)](x2, y2, n, x2.stride(0), y2.stride(0),
                                         BLOCK=next_power_of_2(n))
    return y


def empty_rows_wrong_shape(x: torch.Tensor) -> torch.Tensor:
    """An early return for an empty input that forgets its shape: for m = 0 it hands back a
    1-D tensor of no elements, where a (0, n) result is due (the caller's reshape or
    concatenation then fails far from here). Every nonempty input gets the real softmax."""
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.numel() == 0 and x.shape[-1] > 0:
        return torch.empty(0, dtype=x.dtype, device=x.device)
    return torch_softmax.softmax(x)


def unstable_when_compiled(x: torch.Tensor) -> torch.Tensor:
    """The honest kernel eagerly; under torch.compile a "fused" path that drops the max
    subtraction on the belief that Inductor's softmax lowering stabilises it (it does not
    for a hand-written exp/sum): exp overflows for logits above 88 and the row becomes NaN.
    Every eager check passes; only compiled code takes the branch."""
    from falsify.kernels.torch.softmax import softmax

    if torch.compiler.is_compiling():
        e = torch.exp(x.float())
        return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)
    return softmax(x)


def rows_must_be_2d(x: torch.Tensor) -> torch.Tensor:
    """A guard written for the shape the kernel was tested at: anything but a 2-D batch of
    rows is refused, so one row passed as a 1-D tensor raises although its softmax is
    defined. Every 2-D input gets the real softmax."""
    if isinstance(x, torch.Tensor) and x.dim() < 2:
        raise ValueError(f"softmax: x must be 2-D (rows, n), got {tuple(x.shape)}")
    return torch_softmax.softmax(x)


def float32_result(x: torch.Tensor) -> torch.Tensor:
    """The fp32 accumulation of the real kernel without its final cast back to x's dtype:
    every value is at least as accurate as the honest result, only its dtype is wrong."""
    out = torch_softmax.softmax(x)
    return out.float() if out.is_floating_point() else out
