"""GELU mutants: the bugs the gelu contract's checks must catch (same signatures as the
bindings they replace)."""

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch

from falsify.kernels.torch import gelu as gelu_torch
from falsify.kernels.triton import gelu as gelu_triton


def tanh_form_for_exact(x, approximate, out=None):
    """approximate='none' silently served by the tanh formula (up to 4.7e-4 off)."""
    return gelu_torch.gelu(x, "tanh", out=out)


def triton_erf_missing_sqrt2(x, approximate, out=None):
    """Exact form as ½·x·(1 + erf(x)): the 1/√2 scaling of the argument dropped."""
    gelu_triton.check_args(x, approximate, out)
    if approximate == "tanh":
        return gelu_triton.gelu(x, approximate, out=out)
    with torch.no_grad():
        return gelu_triton.launch_forward(x, "none", out, consts=(1.0, 0.0, 0.0))


def sigmoid_approx_gap(x):
    """The 'tanh' form replaced by the sigmoid approximation x·σ(1.702·x) (another common
    'fast GELU'): its gap to the exact form is ~0.02, forty times the stated bound."""
    with torch.no_grad():
        xf = x.float()
        fast = (xf * torch.sigmoid(1.702 * xf)).to(x.dtype).float()
        return fast - gelu_torch.gelu(x, "none").float()


class _MissingPdfTerm(torch.autograd.Function):
    """Correct forward; exact-form backward = Φ(x) only, dropping x·φ(x)."""

    @staticmethod
    def forward(ctx, x, approximate):
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        return gelu_torch._forward(x.float(), approximate).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        xf = x.float()
        if ctx.approximate == "none":
            d = 0.5 * (1.0 + torch.erf(xf * gelu_torch.INV_SQRT_2))
        else:
            d = gelu_torch._derivative(xf, ctx.approximate)
        return (dy.float() * d).to(x.dtype), None


def derivative_missing_pdf_term(x, approximate, out=None):
    gelu_torch.check_args(x, approximate, out)
    y = _MissingPdfTerm.apply(x, approximate)
    return out.copy_(y) if out is not None else y


# ---------------------------------------------------------------- forward mode
class _JvpMissingPdfTerm(gelu_torch._GELUFunction):
    """The real forward and backward; a forward-mode derivative of t·Φ(x) only."""

    @staticmethod
    def jvp(ctx, x_t, _approximate_t):
        (x,) = ctx.saved_tensors
        phi = 0.5 * (1.0 + torch.erf(x.float() * gelu_torch.INV_SQRT_2))
        return (x_t.float() * phi).to(x.dtype)


def jvp_missing_pdf_term(x, approximate, out=None):
    gelu_torch.check_args(x, approximate, out)
    y = _JvpMissingPdfTerm.apply(x, approximate)
    return out.copy_(y) if out is not None else y


def flatten_with_view(x, approximate, out=None):
    """The elementwise form run on x.view(-1): right for every contiguous tensor, a RuntimeError
    for any transposed or stepped view (.view cannot merge dims whose strides do not chain;
    .reshape copies instead)."""
    gelu_torch.check_args(x, approximate, out)
    flat = x.view(-1)
    y = gelu_torch._GELUFunction.apply(flat, approximate).view(x.shape)
    return out.copy_(y) if out is not None else y
