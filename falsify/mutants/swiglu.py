"""SwiGLU / SiLU mutants: the bugs the swiglu contract's checks must catch (same signatures as
the bindings they replace)."""

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.kernels.torch import swiglu as swg_torch
from falsify.kernels.triton import swiglu as swg_triton


def sigmoid_instead_of_silu(gate, up, out=None):
    """σ(gate)·up: the gate's activation without the factor gate (GLU, not SwiGLU)."""
    swg_torch.check_args(gate, up, out)
    y = (torch.sigmoid(gate.float()) * up.float()).to(gate.dtype)
    return out.copy_(y) if out is not None else y


class _WrongDerivative(torch.autograd.Function):
    """Correct forward; backward takes silu'(g) = σ(g), dropping g·σ·(1 − σ)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        g = gate.float()
        return (g * torch.sigmoid(g) * up.float()).to(gate.dtype)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        g, u, d = gate.float(), up.float(), dy.float()
        s = torch.sigmoid(g)
        return (d * u * s).to(gate.dtype), (d * g * s).to(up.dtype)


def wrong_derivative(gate, up, out=None):
    swg_torch.check_args(gate, up, out)
    y = _WrongDerivative.apply(gate, up)
    return out.copy_(y) if out is not None else y


def silu_sigmoid_sign_flipped(x, out=None):
    """x·σ(−x): unbounded below (→ x for x → −∞) instead of ≥ −0.2785."""
    xf = x.float()
    y = (xf * torch.sigmoid(-xf)).to(x.dtype)
    return out.copy_(y) if out is not None else y


@triton.jit
def _bwd_ordering_hazard_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n,
                                sg_r, sg_c, su_r, su_c, sd_r, sd_c, sdg_r, sdg_c, sdu_r, sdu_c,
                                GATED: tl.constexpr, BLOCK: tl.constexpr):
    """The in-place ordering hazard: d_up is stored into up's buffer *before* up is read for d_gate.
    Correct out of place; in place d_gate is computed from d_up instead of up."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + row * sg_r + offs * sg_c, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * sd_r + offs * sd_c, mask=mask, other=0.0).to(tl.float32)
    e = tl.exp(-tl.abs(g))
    s = tl.div_rn(tl.where(g >= 0, 1.0, e), 1.0 + e)
    tl.store(du_ptr + row * sdu_r + offs * sdu_c, (dy * g * s).to(du_ptr.dtype.element_ty),
             mask=mask)
    u = tl.load(u_ptr + row * su_r + offs * su_c, mask=mask, other=0.0).to(tl.float32)
    tl.store(dg_ptr + row * sdg_r + offs * sdg_c,
             (dy * u * s * (1.0 + g * (1.0 - s))).to(dg_ptr.dtype.element_ty), mask=mask)


def triton_inplace_ordering_hazard(gate, up, dy):
    swg_torch.check_inplace_args(gate, up, dy)
    return swg_triton.launch_backward(gate, up, dy, gate, up, kernel=_bwd_ordering_hazard_kernel)


def triton_inplace_no_alias_check(gate, up, dy):
    """The real in-place kernel, launched without the aliasing rule: overlapping buffers are
    accepted and silently produce garbage."""
    return swg_triton.launch_backward(gate, up, dy, gate, up)


class _SiLUBackwardSignFlipped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xf = x.float()
        return (xf * torch.sigmoid(xf)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        xf = x.float()
        s = torch.sigmoid(xf)
        return (dy.float() * s * (1.0 - xf * (1.0 - s))).to(x.dtype)


def silu_backward_sign_flipped(x, out=None):
    """Forward right; backward σ(x)·(1 − x·(1 − σ(x))): a sign error in silu′ that only a
    gradient check on `silu` itself can see (swiglu's backward is a separate Function)."""
    if out is not None:
        return out.copy_(_SiLUBackwardSignFlipped.apply(x))
    return _SiLUBackwardSignFlipped.apply(x)
