"""AdamW as one elementwise Triton kernel: read θ, g, m, v once, write θ', m', v' once.

Per element, in fp32 (the math and its derivation: falsify/reference/adamw.py):

    θ ← θ·(1 − ηλ)
    m ← lerp(m, g, 1 − β1)                  torch's lerp: m + w(g − m) for w < ½, else
                                             g − (g − m)(1 − w)
    v ← v·β2 + (1 − β2)·g²
    θ ← θ − (η/(1−β1^t)) · m / (√v / √(1−β2^t) + ε)

The step-dependent factors are Python floats computed on the host exactly as torch.optim.AdamW
computes them (float64, then rounded to fp32 as kernel arguments), and the kernel uses the
correctly rounded tl.sqrt_rn / tl.div_rn, so on a GPU it rounds like torch does (the default
`/` and tl.sqrt lower to approximate PTX instructions).

Layout: every tensor is viewed as 2-D [R, C] with explicit strides, and the launch is 1-D over
R·C elements (`launch_config`), so strided views — including the harness's poisoned views into
larger NaN buffers — are read and written exactly at their own elements.

Aliasing rule: an output may be the *same view* as its input (in-place update: each element is
loaded before it is stored, by the same program); any other overlap is rejected before launch.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split
import torch
import triton
import triton.language as tl

from falsify.arguments import check_hyperparameters
from falsify.kernels.dtypes import FP32, require, triton_dtypes
from falsify.kernels.launch import cdiv, next_power_of_2_capped
from falsify.kernels.torch.adamw import check_tensors, optimizer_run, step_scalars

# adamw_multi is the training loop's update on this backend (falsify/llm/ops.py): the bound
# adamw_run hands it to the AdamW optimizer class, which calls it on every step.
__all__ = ["adamw_step", "adamw_run", "adamw_multi"]

MAX_BLOCK = 1024  # elements per program: a power of two (tl.arange), 4 KiB of fp32 per operand


def launch_config(numel):
    """(BLOCK, grid) for `numel` ≥ 1 elements: BLOCK = min(next_pow2(numel), MAX_BLOCK) lanes,
    grid = ceil(numel / BLOCK) programs. z3 runs this on bit-vectors (falsify/proofs/adamw.py):
    the programs cover [0, numel) exactly once and the mask `offs < numel` drops the rest."""
    block = next_power_of_2_capped(numel, MAX_BLOCK)
    return block, cdiv(numel, block)


@triton.jit
def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, po_ptr, mo_ptr, vo_ptr,
                  numel, C,
                  s_p0, s_p1, s_g0, s_g1, s_m0, s_m1, s_v0, s_v1,
                  s_po0, s_po1, s_mo0, s_mo1, s_vo0, s_vo1,
                  decay, w1, beta2, one_minus_beta2, neg_step_size, bc2_sqrt, eps,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    r = offs // C
    c = offs % C
    p = tl.load(p_ptr + r * s_p0 + c * s_p1, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + r * s_g0 + c * s_g1, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + r * s_m0 + c * s_m1, mask=mask, other=0.0)
    v = tl.load(v_ptr + r * s_v0 + c * s_v1, mask=mask, other=0.0)

    # Every multiply-add is an explicit fma: left as a*b + c, the GPU compiler contracts it or
    # not per compiled variant (BLOCK differs between one row and a batch), and the same
    # element came out one ulp apart alone and mid-batch (AW-BIN-001, seen on an H200)
    p = p * decay
    # torch's lerp picks the form whose weight is < ½ (fewer cancellations); we match it
    m = tl.where(w1 < 0.5, tl.fma(w1, g - m, m), tl.fma(m - g, 1.0 - w1, g))
    v = tl.fma(v, beta2, one_minus_beta2 * g * g)
    denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
    p = tl.fma(neg_step_size, tl.div_rn(m, denom), p)

    tl.store(po_ptr + r * s_po0 + c * s_po1, p.to(po_ptr.dtype.element_ty), mask=mask)
    tl.store(mo_ptr + r * s_mo0 + c * s_mo1, m, mask=mask)
    tl.store(vo_ptr + r * s_vo0 + c * s_vo1, v, mask=mask)


def _as_2d(t: torch.Tensor, name: str) -> torch.Tensor:
    """A 2-D view [R, C] of t sharing its storage (writes through it land in t)."""
    if t.dim() == 0:
        return t.view(1, 1)
    if t.dim() == 1:
        return t.unsqueeze(0)
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name}: strides {tuple(t.stride())} of shape {tuple(t.shape)} cannot "
                         "be collapsed to 2-D without a copy; pass a 2-D view") from None


def _extent(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _check_alias(out: torch.Tensor, inp: torch.Tensor, names: str) -> None:
    same_view = (out.data_ptr() == inp.data_ptr() and out.stride() == inp.stride()
                 and out.dtype == inp.dtype)
    if same_view:
        return
    (a0, a1), (b0, b1) = _extent(out), _extent(inp)
    if a0 < b1 and b0 < a1:
        raise ValueError(f"{names} overlap without being the same view: an in-place update must "
                         "pass the input tensor itself as the output")


def _check_offsets(t2: torch.Tensor, name: str) -> None:
    # Offsets are computed in int32 inside the kernel.
    last = sum((n - 1) * s for n, s in zip(t2.shape, t2.stride()))
    if last >= 2 ** 31:
        raise ValueError(f"{name}: largest element offset {last} does not fit in int32")


def adamw_step(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay, out=None,
               m_out=None, v_out=None):
    """One AdamW step. Returns (param', m', v'), written into out / m_out / v_out when given
    (they may be the inputs themselves for an in-place update), else into new tensors."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    check_tensors(param, grad, m, v, triton_dtypes())
    if param.device != grad.device or param.device != m.device or param.device != v.device:
        raise ValueError("param, grad, m and v must be on one device")
    if out is None:
        out = torch.empty_like(param)
    if m_out is None:
        m_out = torch.empty_like(m)
    if v_out is None:
        v_out = torch.empty_like(v)
    for name, o, ref, dt in (("out", out, param, param.dtype), ("m_out", m_out, m, torch.float32),
                             ("v_out", v_out, v, torch.float32)):
        if not isinstance(o, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor")
        if o.shape != ref.shape or o.dtype != dt or o.device != ref.device:
            raise ValueError(f"{name}: expected shape {tuple(ref.shape)}, dtype {dt}, device "
                             f"{ref.device}; got {tuple(o.shape)}, {o.dtype}, {o.device}")
    ins = {"param": param, "grad": grad, "m": m, "v": v}
    outs = {"out": out, "m_out": m_out, "v_out": v_out}
    for oname, o in outs.items():
        for iname, i in ins.items():
            _check_alias(o, i, f"{oname} and {iname}")
    onames = list(outs)
    for a in range(3):
        for b in range(a + 1, 3):
            (x0, x1), (y0, y1) = _extent(outs[onames[a]]), _extent(outs[onames[b]])
            if x0 < y1 and y0 < x1:
                raise ValueError(f"{onames[a]} and {onames[b]} overlap")
    numel = param.numel()
    if numel == 0:
        return out, m_out, v_out
    if numel > 2 ** 31 - MAX_BLOCK:  # lane offsets are int32 (proved in falsify/proofs/adamw.py)
        raise ValueError(f"{numel} elements: the kernel handles at most 2^31 − {MAX_BLOCK}")
    views = {k: _as_2d(t, k) for k, t in {**ins, **outs}.items()}
    for k, t in views.items():
        _check_offsets(t, k)
    C = views["param"].shape[1]
    for k, t in views.items():
        if t.shape[1] != C:  # e.g. 0-d vs 1-element 1-d: same numel, same C = 1; guard anyway
            raise ValueError(f"{k}: 2-D view {tuple(t.shape)} disagrees with param's C={C}")
    decay, step_size, bc2_sqrt = step_scalars(step, lr, beta1, beta2, weight_decay)
    block, grid = launch_config(numel)
    s = [views[k].stride(d) for k in ("param", "grad", "m", "v", "out", "m_out", "v_out")
         for d in (0, 1)]
    _adamw_kernel[(grid,)](
        views["param"], views["grad"], views["m"], views["v"],
        views["out"], views["m_out"], views["v_out"],
        numel, C, *s,
        decay, 1.0 - beta1, beta2, 1.0 - beta2, -step_size, bc2_sqrt, eps,
        BLOCK=block)
    return out, m_out, v_out


def adamw_multi(params, grads, ms, vs, step, lr, beta1, beta2, eps, weight_decay):
    """In-place AdamW over lists of tensors: one kernel launch per tensor."""
    step = check_hyperparameters(step, lr, beta1, beta2, eps, weight_decay)
    if not (len(params) == len(grads) == len(ms) == len(vs)):
        raise ValueError(f"list lengths differ: params {len(params)}, grads {len(grads)}, "
                         f"ms {len(ms)}, vs {len(vs)}")
    for p, g, m, v in zip(params, grads, ms, vs):
        check_tensors(p, g, m, v, triton_dtypes())
    with torch.no_grad():
        for p, g, m, v in zip(params, grads, ms, vs):
            adamw_step(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay, out=p,
                       m_out=m, v_out=v)


def adamw_run(param, grads, lr, beta1, beta2, eps, weight_decay):
    """len(grads) steps from zero state; returns the final (param, m, v). Runs the training
    loop's path: the `AdamW` optimizer class driving this module's `adamw_multi`, which launches
    `adamw_step` in place once per tensor."""
    check_hyperparameters(1, lr, beta1, beta2, eps, weight_decay)
    require("adamw_run (triton)", FP32, param=param, grads=grads)  # its contract runs float32
    return optimizer_run(param, grads, lr, beta1, beta2, eps, weight_decay, "triton",
                         adamw_multi)
