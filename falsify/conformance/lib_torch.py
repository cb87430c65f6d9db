"""PyTorch's own kernels (torch 2.13, CPU build) bound to the library contracts.

What is bound, one binding per torch entry point (or code path) judged:

- `torch.softmax` (dim = -1) to softmax-kernel-v1;
- `F.rms_norm` to rmsnorm-kernel-v1 (`rmsnorm`, its gradients through autograd);
- `F.scaled_dot_product_attention` to attention-kernel-v1, once as dispatched and once forced
  onto the math backend (`sdpa_kernel(SDPBackend.MATH)`), which on the CPU is a different
  kernel from the default fused flash-attention-for-CPU path;
- `F.cross_entropy` to cross-entropy-kernel-v1 (see its adapter: torch has no z-loss);
- `F.silu` and `F.silu(gate) * up` to swiglu-kernel-v1;
- `F.gelu` (both its `approximate` modes) to gelu-kernel-v1;
- `torch.optim.AdamW`, for-loop, foreach and fused, to adamw-kernel-v1;
- `torch.nn.utils.clip_grad_norm_`, for-loop and foreach, to grad-clip-kernel-v1;
- `F.embedding` to embedding-kernel-v1;
- `torch.addmm` to gemm-kernel-v1, and `torch.baddbmm` (a batch of one), `F.linear` and
  `torch.matmul` (these two have no α, β: they follow the contract's `unscaled` variant,
  α = β = 1 with C as F.linear's bias, and `product` variant, α = 1 with no C);
- `SequentialLR(LinearLR, CosineAnnealingLR)` and `SequentialLR(LinearLR,
  CosineAnnealingWarmRestarts)` to lr-schedule-kernel-v1: torch's warmup-then-cosine
  compositions, stepped as in training and read off the optimizer;
- `F.scaled_dot_product_attention` given the causal mask as a boolean `attn_mask`, to
  attention-kernel-v1 (the masked branch of the CPU kernel);
- `F.softmax(dtype=torch.float32)` to softmax-kernel-v1 (the cast-then-softmax call).

Not bound: `OneCycleLR` (its warmup follows the anneal function, cosine by default, from
max_lr/div_factor, not the contract's linear ramp from 0, and `anneal_strategy="linear"`
makes the decay linear too), `CosineAnnealingLR` alone (no warmup: a cell of refusals for
every W > 0) and `LambdaLR` with a lambda of ours (the schedule would be our arithmetic; the
transformers schedules are LambdaLRs with the library's own lambdas, bound there).

Everything runs on the CPU; torch's CUDA kernels are other code, which these bindings do not
judge. The contracts' `out=` (a preallocated result) is served by torch's own `out=` where the
function has one, else by copying the result into it.
"""

from __future__ import annotations

from falsify.conformance.registry import Binding, Finding, Library, into

M = "falsify.conformance.lib_torch"


_into = into  # the shared out= helper (registry.into)


# ---------------------------------------------------------------- softmax-kernel-v1
def softmax(x):
    """torch.softmax over the last dimension, in the input's dtype (no `dtype=` upcast asked:
    the CPU kernel accumulates half precision in fp32 on its own)."""
    import torch

    return torch.softmax(x, dim=-1)


# ---------------------------------------------------------------- rmsnorm-kernel-v1
def rms_norm(x, w, eps, out=None):
    """F.rms_norm over the last dimension with weight `w`, eps as given."""
    import torch.nn.functional as F

    return _into(out, F.rms_norm(x, (x.shape[-1],), w, eps))


# ---------------------------------------------------------------- attention-kernel-v1
def sdpa_attention(q, k, v, causal=True, scale=None, out=None):
    """F.scaled_dot_product_attention, as dispatched on the CPU.

    The contract's layout is torch's: q [b, hkv·g, s, d], k and v [b, hkv, s, d], query head h
    reading key/value head h // g, which SDPA calls `enable_gqa=True`; `causal` is its
    `is_causal` (top-left aligned, s_q = s_k here); `scale=None` is 1/√d in both.
    """
    import torch.nn.functional as F

    y = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=scale,
                                       enable_gqa=True)
    return _into(out, y)


def sdpa_attention_math(q, k, v, causal=True, scale=None, out=None):
    """The same call restricted to SDPA's math backend (the composite reference implementation
    of aten::_scaled_dot_product_attention_math) instead of the fused CPU flash kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return sdpa_attention(q, k, v, causal, scale, out)


# ---------------------------------------------------------------- cross-entropy-kernel-v1
def cross_entropy(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                  label_smoothing=0.0):
    """F.cross_entropy with the contract's ignore_index, reduction and label smoothing.

    torch has no z-loss term (ζ·lse²): the binding follows the contract's `no-z-loss` variant
    (every check at ζ = 0); a call with z_loss ≠ 0 is still refused rather than served by
    arithmetic of our own.
    """
    import torch.nn.functional as F

    if z_loss != 0.0:
        raise NotImplementedError(f"F.cross_entropy has no z-loss term (z_loss={z_loss!r})")
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=float(label_smoothing))


def cross_entropy_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                       label_smoothing=0.0):
    """∂(reduced loss)/∂logits through F.cross_entropy's autograd backward, dy = 1 (ones for
    "none"): the contract's `cross_entropy_grad` equation."""
    import torch

    z = logits.detach().requires_grad_(True)
    loss = cross_entropy(z, labels, ignore_index, reduction, z_loss, label_smoothing)
    (g,) = torch.autograd.grad(loss, [z], grad_outputs=torch.ones_like(loss))
    return g


# ---------------------------------------------------------------- swiglu-kernel-v1
def silu(x, out=None):
    """F.silu."""
    import torch.nn.functional as F

    return _into(out, F.silu(x))


def swiglu(gate, up, out=None):
    """F.silu(gate) * up: torch's SwiGLU is the product of its two ops, each rounded to the
    input dtype (there is no fused torch op)."""
    import torch.nn.functional as F

    return _into(out, F.silu(gate) * up)


# ---------------------------------------------------------------- gelu-kernel-v1
def gelu(x, approximate, out=None):
    """F.gelu with the contract's `approximate` ('none': erf form, 'tanh': the tanh form)."""
    import torch.nn.functional as F

    return _into(out, F.gelu(x, approximate=approximate))


# ---------------------------------------------------------------- adamw-kernel-v1
def _adamw(params, variant, lr, beta1, beta2, eps, weight_decay):
    import torch

    flags = {"foreach": {"foreach": True}, "fused": {"fused": True},
             "for-loop": {"foreach": False}}[variant]
    return torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps,
                             weight_decay=weight_decay, **flags)


def _adamw_step(variant, param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """One torch.optim.AdamW step from the contract's state (m, v, step − 1 steps taken) on a
    copy of `param`; returns the new (param, m, v), the inputs untouched (the contract's step
    is functional, the optimizer's in place: the copies are the optimizer's state)."""
    import torch

    p = param.detach().clone()
    p.grad = grad.detach().clone()
    opt = _adamw([p], variant, lr, beta1, beta2, eps, weight_decay)
    # the optimizer's own state layout: exp_avg, exp_avg_sq and a float32 step count on p's
    # device, which its step() increments to `step` before the bias corrections
    opt.state[p] = {"step": torch.tensor(float(step - 1), dtype=torch.float32),
                    "exp_avg": m.detach().clone(), "exp_avg_sq": v.detach().clone()}
    opt.step()
    st = opt.state[p]
    return p, st["exp_avg"], st["exp_avg_sq"]


def _adamw_run(variant, param, grads, lr, beta1, beta2, eps, weight_decay):
    """len(grads) torch.optim.AdamW steps from its own zero state; the final (param, m, v)."""
    import torch

    p = param.detach().clone()
    opt = _adamw([p], variant, lr, beta1, beta2, eps, weight_decay)
    for g in grads:
        p.grad = g.detach()
        opt.step()
    if p not in opt.state:
        # no step taken (T = 0): the optimizer creates its state lazily, on the first step, as
        # torch.zeros_like(p, memory_format=torch.preserve_format) (AdamW._init_group)
        return (p, torch.zeros_like(p, memory_format=torch.preserve_format),
                torch.zeros_like(p, memory_format=torch.preserve_format))
    st = opt.state[p]
    return p, st["exp_avg"], st["exp_avg_sq"]


def adamw_step(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW(foreach=False): the single-tensor for-loop implementation."""
    return _adamw_step("for-loop", param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay)


def adamw_step_foreach(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW(foreach=True): the multi-tensor _foreach_* implementation."""
    return _adamw_step("foreach", param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay)


def adamw_step_fused(param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW(fused=True): the fused aten::_fused_adamw_ kernel (CPU build)."""
    return _adamw_step("fused", param, grad, m, v, step, lr, beta1, beta2, eps, weight_decay)


def adamw_run(param, grads, lr, beta1, beta2, eps, weight_decay):
    return _adamw_run("for-loop", param, grads, lr, beta1, beta2, eps, weight_decay)


def adamw_run_foreach(param, grads, lr, beta1, beta2, eps, weight_decay):
    return _adamw_run("foreach", param, grads, lr, beta1, beta2, eps, weight_decay)


def adamw_run_fused(param, grads, lr, beta1, beta2, eps, weight_decay):
    return _adamw_run("fused", param, grads, lr, beta1, beta2, eps, weight_decay)


# ---------------------------------------------------------------- grad-clip-kernel-v1
# torch's clip coefficient is max_norm / (total_norm + 1e-6), the 1e-6 fixed in the function
TORCH_CLIP_EPS = 1e-6


def _clip(foreach, g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """torch.nn.utils.clip_grad_norm_ (norm_type 2) on copies of the three gradients, held as
    the `.grad` of three stand-in parameters; returns (g0', g1', g2', total_norm)."""
    import torch

    if eps != TORCH_CLIP_EPS:
        raise ValueError(f"clip_grad_norm_ adds a fixed {TORCH_CLIP_EPS} to the norm, not {eps}")
    params = []
    for g in (g0, g1, g2):
        p = torch.empty_like(g)
        p.grad = g.detach().clone()
        params.append(p)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0,
                                          error_if_nonfinite=bool(error_if_nonfinite),
                                          foreach=foreach)
    return params[0].grad, params[1].grad, params[2].grad, norm


def clip_grad_norm(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """clip_grad_norm_(foreach=False): per-tensor norms and scaling in a Python loop."""
    return _clip(False, g0, g1, g2, max_norm, eps, error_if_nonfinite)


def clip_grad_norm_foreach(g0, g1, g2, max_norm, eps, error_if_nonfinite):
    """clip_grad_norm_(foreach=True): torch._foreach_norm and torch._foreach_mul_."""
    return _clip(True, g0, g1, g2, max_norm, eps, error_if_nonfinite)


# ---------------------------------------------------------------- embedding-kernel-v1
def embedding(ids, table, out=None):
    """F.embedding(ids, table): row ids[p] of the table for every position."""
    import torch.nn.functional as F

    return _into(out, F.embedding(ids, table))


# ---------------------------------------------------------------- gemm-kernel-v1
def gemm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None):
    """torch.addmm(c, op(a), op(b), beta=β, alpha=α), op a transposed view.

    addmm's β = 0 ignores `c` (NaN and inf in it are not propagated), the contract's rule. With
    no `c` at all the contract's result is α·op(a)·op(b), which is addmm with β = 0 and any
    `c`: the output itself, uninitialised, serves (it is never read).
    """
    import torch

    opa = a.t() if trans_a else a
    opb = b.t() if trans_b else b
    if c is None:
        beta = 0.0
        c = torch.empty((opa.shape[0], opb.shape[1]), dtype=a.dtype, device=a.device)
    if out is not None:
        return torch.addmm(c, opa, opb, beta=beta, alpha=alpha, out=out)
    return torch.addmm(c, opa, opb, beta=beta, alpha=alpha)


def _no_alpha_beta(name, c, alpha, beta):
    """F.linear and torch.matmul have no α or β: anything but α = 1 (and β = 1 for a given C)
    is refused, not composed from further torch ops of our own."""
    if alpha != 1.0:
        raise NotImplementedError(f"{name} has no alpha (alpha={alpha!r})")
    if c is not None and beta not in (0.0, 1.0):
        raise NotImplementedError(f"{name} has no beta (beta={beta!r})")


def linear(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None):
    """F.linear(op(a), W, bias) = op(a)·Wᵀ (+ bias), W = op(b)ᵀ: a `b` stored [N, K]
    (trans_b) is a Linear layer's own weight layout, passed as it is. β = 1 passes C as the
    bias (F.linear takes it through addmm, which broadcasts an [M, N] bias as it does [N]);
    β = 0 passes none, so C is not read."""
    import torch.nn.functional as F

    _no_alpha_beta("F.linear", c, alpha, beta)
    opa = a.t() if trans_a else a
    weight = b if trans_b else b.t()
    bias = c if (c is not None and beta == 1.0) else None
    return _into(out, F.linear(opa, weight, bias))


def matmul(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None):
    """torch.matmul(op(a), op(b)) (its own out=); a C with β ≠ 0 is refused: matmul does not
    add one."""
    import torch

    _no_alpha_beta("torch.matmul", None, alpha, beta)
    if c is not None and beta != 0.0:
        raise NotImplementedError(f"torch.matmul adds no C (beta={beta!r})")
    opa = a.t() if trans_a else a
    opb = b.t() if trans_b else b
    if out is not None:
        return torch.matmul(opa, opb, out=out)
    return torch.matmul(opa, opb)


def baddbmm(a, b, c=None, alpha=1.0, beta=0.0, trans_a=False, trans_b=False, out=None):
    """torch.baddbmm(C, op(A), op(B), beta=β, alpha=α) on a batch of one ([1, ·, ·] views):
    the batched kernel, with the same β = 0 rule as addmm (C not read); with no C an
    uninitialised one serves, as for torch.addmm above."""
    import torch

    opa = (a.t() if trans_a else a).unsqueeze(0)
    opb = (b.t() if trans_b else b).unsqueeze(0)
    if c is None:
        beta = 0.0
        c = torch.empty((opa.shape[1], opb.shape[2]), dtype=a.dtype, device=a.device)
    if out is not None:
        torch.baddbmm(c.unsqueeze(0), opa, opb, beta=beta, alpha=alpha, out=out.unsqueeze(0))
        return out
    return torch.baddbmm(c.unsqueeze(0), opa, opb, beta=beta, alpha=alpha)[0]


# ---------------------------------------------------------------- lr-schedule-kernel-v1
# LinearLR refuses start_factor = 0 ("expected to be greater than 0"): the warmup starts at
# this factor of lr_max instead of at 0 (below the contract's parity bound of 8·eps·lr_max)
LINEAR_LR_START = 1e-16


def scheduled_rates(make, step, lr_max):
    """The rates a torch scheduler gives the contract's integer steps: an SGD optimizer at
    lr = lr_max on a stand-in parameter, `make(optimizer)` the scheduler, and lr at step s read
    from param_groups after s calls of scheduler.step() (each after optimizer.step(), the order
    torch asks for; no parameter has a gradient, so the optimizer changes nothing)."""
    import torch

    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=lr_max)
    sched = make(opt)
    wanted = step.reshape(-1).tolist()
    rates = []
    for _ in range(max(wanted) + 1 if wanted else 0):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return torch.tensor([rates[s] for s in wanted], dtype=torch.float64).reshape(step.shape)


def sequential_linear_cosine(step, warmup, total, lr_max, lr_min):
    """SequentialLR(LinearLR(start_factor, 1, warmup), CosineAnnealingLR(T_max=total − warmup,
    eta_min=lr_min), milestones=[warmup]): torch's own warmup-then-cosine composition, stepped
    (the chainable form: each rate is computed from the previous one)."""
    from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

    def make(opt):
        return SequentialLR(opt, [LinearLR(opt, start_factor=LINEAR_LR_START, end_factor=1.0,
                                           total_iters=max(warmup, 1)),
                                  CosineAnnealingLR(opt, T_max=total - warmup, eta_min=lr_min)],
                            milestones=[warmup])

    return scheduled_rates(make, step, lr_max)


def sequential_linear_cosine_restarts(step, warmup, total, lr_max, lr_min):
    """SequentialLR(LinearLR, CosineAnnealingWarmRestarts(T_0=total − warmup, eta_min=lr_min)):
    the decay computed in closed form from T_cur at every step (SGDR, first period)."""
    from torch.optim.lr_scheduler import CosineAnnealingWarmRestarts, LinearLR, SequentialLR

    def make(opt):
        return SequentialLR(opt, [LinearLR(opt, start_factor=LINEAR_LR_START, end_factor=1.0,
                                           total_iters=max(warmup, 1)),
                                  CosineAnnealingWarmRestarts(opt, T_0=total - warmup,
                                                              eta_min=lr_min)],
                            milestones=[warmup])

    return scheduled_rates(make, step, lr_max)


# ---------------------------------------------------------------- attention-kernel-v1 (more)
def sdpa_attention_masked(q, k, v, causal=True, scale=None, out=None):
    """F.scaled_dot_product_attention given the causal mask as a boolean `attn_mask` (True =
    attend, lower triangle of [s_q, s_k]) instead of `is_causal`, as a model with its own mask
    calls it: on the CPU the masked branch of the kernel, not the causal one."""
    import torch
    import torch.nn.functional as F

    mask = None
    if causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return _into(out, y)


# ---------------------------------------------------------------- softmax-kernel-v1 (more)
def softmax_fp32(x):
    """F.softmax(x, dim=-1, dtype=torch.float32): torch casts x to float32 before the kernel
    and returns the float32 result (the mixed-precision call: attention probabilities kept in
    fp32), so a float16 x gives a float32 result, not one rounded back."""
    import torch
    import torch.nn.functional as F

    return F.softmax(x, dim=-1, dtype=torch.float32)


# ---------------------------------------------------------------- declarations
# Shared reasons and evidence. Every dtype declared below was called and returned a result of
# that dtype (float64 computed in float64 by torch's CPU kernels, bfloat16 through its fp32
# opmath); every size-0 rule was called too.
FLOAT_EXTRA = ("float64", "bfloat16")
# torch refuses integer tensors in its kernels: NotImplementedError ("... not implemented for
# 'Long'") or RuntimeError ("expected scalar type Float but found Long"), naming the dtype
# the for-loop and foreach AdamW step a float16 parameter too (state in its dtype)
ADAMW_DTYPES = FLOAT_EXTRA + ("float16",)
SDPA_INT = ("int64 q, k, v are refused, but from inside the op, with RuntimeError \"expected m1 "
            "and m2 to have the same dtype, but got: float != long int\" (the scaled q is "
            "float, k is not): a refusal that names no dtype and comes after work has "
            "started; SDPA validates no dtype up front")
INT_REFUSAL = ("NotImplementedError", "RuntimeError")
GRAD_LEAF = ("the gradient is taken through an autograd leaf, and torch refuses an integer "
             "leaf with RuntimeError \"only Tensors of floating point dtype can require "
             "gradients\", which names no dtype; F.cross_entropy itself refuses integer logits "
             "with NotImplementedError naming it (FALSIFY-CE-022)")
JVP = ("torch implements forward-mode AD for this op (derivatives.yaml: a jvp formula or "
       "auto_element_wise), so torch.func.jvp answers; it makes no promise to refuse it")


ADAMW_FP16 = Finding(
    kind="variant", variant="optimizer state in the parameter's dtype",
    evidence="the contract steps a float16 parameter with float32 moments m, v; "
             "torch.optim.AdamW keeps exp_avg/exp_avg_sq in the parameter's dtype "
             "(_init_group: torch.zeros_like(p, memory_format=torch.preserve_format)) and "
             "refuses mixed state: for-loop and foreach raise RuntimeError \"expected dtype "
             "float for `end` but got dtype c10::Half\" (exp_avg.lerp_(grad, 1 − β1)), fused "
             "raises \"expected scalar type Half but found Float\" (_fused_adamw_). Every "
             "float16 case of the step equation raises; float32 passes every check.")
ADAMW_FINDINGS = {f"FALSIFY-AW-{n}/float16": ADAMW_FP16
                  for n in ("001", "002", "003", "005", "007", "019", "021")}
ADAMW_STEP_STATE = ("adamw_step's state is fp32 by the contract's signature; torch requires "
                      "state in the parameter's dtype, so float64/bfloat16 parameters with fp32 "
                      "moments are refused with RuntimeError (\"expected dtype float for `end`\")")
ADAMW_NOT_CLAIMED = {"FALSIFY-AW-022": ADAMW_STEP_STATE}
ADAMW_FUSED_NOT_CLAIMED = {
    "FALSIFY-AW-022": ADAMW_STEP_STATE,
    "FALSIFY-AW-023": "fused=True refuses integer parameters with RuntimeError \"`fused=True` "
                      "requires all the params to be floating point Tensors\", which names no "
                      "dtype",
}


def _clip_findings(variant_name):
    return {
        "FALSIFY-CLIP-001/float16": Finding(
            kind="deviation",
            repro="torch_clip_grad_norm_fp16.py",
            evidence="the norm and the coefficient are computed in the gradients' dtype: "
                     "torch._foreach_norm / linalg.vector_norm of float16 grads return a "
                     "float16 norm (clip_grad._get_total_norm), and clip_coef = max_norm / "
                     "(total_norm + 1e-6) is a float16 tensor, so each clipped element carries "
                     "the fp16 norm's rounding and a second rounding of the product; the "
                     "contract accumulates in fp32 and rounds once. Example r=c=n=k=1: got "
                     "0.027679443359375, reference 0.027652865220394, |err| 2.66e-05 > "
                     "atol 3e-08 + rtol 4.89e-4·|ref|."),
        "FALSIFY-CLIP-002/float16": Finding(
            kind="deviation",
            repro="torch_clip_grad_norm_fp16.py",
            evidence="as FALSIFY-CLIP-001/float16: a float16 norm and float16 clip coefficient "
                     "put the clipped norm off min(‖g‖, max_norm·‖g‖/(‖g‖ + 1e-6)) by more "
                     "than the contract's rtol for one fp32-accumulated rounding."),
        "FALSIFY-CLIP-004": Finding(
            kind="deviation",
            repro="torch_clip_grad_norm_overflow.py",
            evidence="the fp32 norm overflows: with |g| up to 1e35, g² = 1e70 exceeds fp32's "
                     "range and torch._foreach_norm / linalg.vector_norm return +inf (no "
                     "scaling by max|g|), so clip_coef = 1/(inf + 1e-6) = 0 and every gradient "
                     "becomes ±0. Example r=c=n=k=1: g0' = -0.0 where the reference clips "
                     "g0 to -0.52402507; the true norm (6.39e34) is finite in fp32."),
        "FALSIFY-CLIP-005": Finding(
            kind="deviation",
            repro="torch_clip_grad_norm_overflow.py",
            evidence="as FALSIFY-CLIP-004: the reported norm is +inf (not finite) for "
                     "gradients of magnitude 1e35, whose norm is representable in fp32; the "
                     "gradients are zeroed instead of clipped onto the ball."),
        "FALSIFY-CLIP-006": Finding(
            kind="variant", variant=variant_name,
            evidence="with an inf gradient and error_if_nonfinite=False, clip_grad_norm_ "
                     "returns norm +inf and multiplies every gradient by clamp(max_norm / "
                     "(inf + 1e-6), max=1) = 0 (inf·0 = NaN where the inf was); its docstring: "
                     "\"set error_if_nonfinite=False\" to \"scale the gradients by the "
                     "non-finite norm anyway\". The contract leaves them unchanged."),
        "FALSIFY-CLIP-007": Finding(
            kind="variant", variant=variant_name,
            evidence="with a NaN gradient the norm is NaN and clip_coef = clamp(NaN, max=1) = "
                     "NaN multiplies every gradient: all three tensors become NaN, where the "
                     "contract leaves them unchanged (documented: the gradients are scaled by "
                     "the non-finite norm anyway)."),
        "FALSIFY-CLIP-008": Finding(
            kind="variant", variant=variant_name,
            evidence="error_if_nonfinite=True raises RuntimeError (\"The total norm of order "
                     "2.0 for gradients from `parameters` is non-finite, so it cannot be "
                     "clipped\"), torch's own exception, not the contract's NonFiniteGradNorm; "
                     "with False the gradients are scaled by the NaN/inf norm "
                     "(FALSIFY-CLIP-006/007)."),
    }


CLIP_VARIANT = "non-finite norm scales the gradients anyway"

GELU_TANH_D = ("torch's tanh-form derivatives are formed from t = tanh(inner) "
               "(GeluBackwardKernelImpl: left_derivative = 0.5·(1 + t), right_derivative = "
               "0.5·x·(1 − t²)·β·(1 + 3κx²), and their derivative in gelu_double_backward), "
               "where 1 ± t and 1 − t² cancel once |x| ≳ 2.5: the error is absolute, of order "
               "eps·|x|, not relative to the small result. Measured on a fp32 grid of [−4, 4] "
               "against the same autograd in float64: gelu″ off by up to 3.2e-07 absolute "
               "(x = −3.6534, value −0.0052344, ~60 ulps of it), 2.1e-5 relative at x = 3.5; "
               "the contract's own kernel (σ(2u) form, σ(−z) computed directly) stays within "
               "its bound.")

# lr-schedule-kernel-v1: torch's schedulers past T and at step 0
LRS_PERIODIC_NAME = "cosine continues past T_max (period 2·T_max)"
LRS_PERIODIC = ("CosineAnnealingLR has no floor: past T_max its recursion (the `(last_epoch − 1 − "
                "T_max) % (2·T_max) == 0` branch, then the cosine ratio) climbs back towards "
                "lr_max over the next T_max steps, as its documented η_t formula does for "
                "T_cur > T_max; the contract holds lr_min from T on")
LRS_RESTART_NAME = "warm restart at T (SGDR)"
LRS_RESTART = ("CosineAnnealingWarmRestarts restarts at T_0 = T − W: T_cur wraps to 0 and the "
               "rate jumps back to lr_max at step T (its documented SGDR schedule); the contract "
               "holds lr_min from T on")
LRS_START = ("LinearLR refuses start_factor = 0 (\"expected to be greater than 0\"), so the "
             "warmup starts at start_factor·lr_max (1e-16·lr_max, below the parity bound) "
             "rather than at 0")
LRS_LINEAR_DRIFT = (
    "LinearLR.get_lr computes each warmup rate from the previous one, lr·(1 + (end − start)/"
    "(total·start + (t − 1)·(end − start))), so the roundings of every step accumulate: W = "
    "2000, T = 5000, lr_max 3e-4: lr(43) got 6.4500000000000306e-06, true "
    "6.4499999999999994e-06, relative error 4.8e-15 = 21.7·eps > rtol 2·eps (the closed form "
    "lr_max·s/W, LinearLR._get_closed_form_lr, is one product and one division).")

TORCH_OUT_DTYPE = ("a wrong out= dtype is refused with RuntimeError (\"Expected out tensor to have "
                   "dtype float, but got double instead\"), not TypeError/ValueError")


# found with fresh seeds (FALSIFY_SEED=2533420250), not by the ci profile's fixed examples
GELU_ERF32 = Finding(
    kind="deviation", repro="torch_gelu_erf_cancellation.py",
    evidence="the exact (erf) form in float32 near x = -3.5: got -0.00083980185 vs the "
             "reference -0.00083880791, |err| 9.94e-7 > atol xmax·eps 9.54e-7 + 4·eps·|ref| "
             "(1 of 112 elements); arbiter (long double): torch off by 1.7e4 fp32 ulps, the "
             "reference by 4e-10. Over every float32 in [-3.6, -3.3] the worst is x = "
             "-3.4801347, |err| 1.05e-6 (0.12 % relative), while torch.erf itself is within "
             "0.1 ulp there: the kernel is ~20x less accurate than the 1 + erf(x/√2) "
             "cancellation with that erf allows. The ci profile's examples draw no x in the "
             "band.")

LIBRARY = Library(
    name="torch",
    distribution="torch",
    bindings=(
        Binding(name="torch.softmax", contract="softmax-kernel-v1",
                binds={"softmax": f"{M}:softmax"},
                dtypes=FLOAT_EXTRA, zero_size={"n": "empty"}, errors=("NotImplementedError",)),
        Binding(name="F.rms_norm", contract="rmsnorm-kernel-v1",
                binds={"rmsnorm": f"{M}:rms_norm"},
                dtypes=FLOAT_EXTRA, zero_size={"n": "empty"}, errors=("NotImplementedError",),
                not_claimed={
                    "FALSIFY-RN-008": "F.rms_norm on the CPU is composed of aten ops, whose "
                                      "autograd keeps their own intermediates (490 extra fp32 "
                                      "elements for 5×96 in fp32, 1450 in fp16) rather than one "
                                      "inv_rms per row: a memory property torch does not claim",
                    "FALSIFY-RN-021": JVP}),
        Binding(name="F.scaled_dot_product_attention", contract="attention-kernel-v1",
                binds={"attention": f"{M}:sdpa_attention"},
                dtypes=FLOAT_EXTRA, zero_size={"hkv": "empty", "d": "empty"},
                errors=INT_REFUSAL, not_claimed={"FALSIFY-ATT-025": SDPA_INT}),
        Binding(name="F.scaled_dot_product_attention[math]", contract="attention-kernel-v1",
                binds={"attention": f"{M}:sdpa_attention_math"},
                dtypes=FLOAT_EXTRA, zero_size={"hkv": "empty", "d": "empty"},
                errors=INT_REFUSAL,
                not_claimed={
                    "FALSIFY-ATT-025": SDPA_INT,
                    "FALSIFY-ATT-013": "the math backend is the reference composition "
                                       "softmax(QKᵀ)·V and materialises the [B, H, S, S] scores "
                                       "by design (peak 54.5 MB at S = 1024, 13× that at S = "
                                       "256); linear memory is the fused kernels' promise, not "
                                       "this backend's",
                    "FALSIFY-ATT-030": "composed of differentiable aten ops, the math backend "
                                       "is twice differentiable and answers a double backward; "
                                       "it makes no promise to refuse one",
                    "FALSIFY-ATT-033": JVP}),
        Binding(name="F.cross_entropy", contract="cross-entropy-kernel-v1",
                binds={"cross_entropy": f"{M}:cross_entropy",
                       "cross_entropy_grad": f"{M}:cross_entropy_grad"},
                variant="no-z-loss",  # torch has no z-loss term: judged at ζ = 0
                dtypes=FLOAT_EXTRA, errors=("NotImplementedError",),
                not_claimed={
                    "FALSIFY-CE-023": GRAD_LEAF,
                    "FALSIFY-CE-027": JVP,
                    "FALSIFY-CE-028": "size 0: T = 0 gives the reference result (empty, 0, "
                                      "NaN), but V = 0 is refused with IndexError \"Target 0 is "
                                      "out of bounds\" (nll_loss) when a label is counted and "
                                      "answered (0, or NaN for mean) when every label is "
                                      "ignore_index: neither the error type nor the rule the "
                                      "contract states"},
                findings={
                    "FALSIFY-CE-002/float16": Finding(
                        kind="deviation",
                        repro="torch_cross_entropy_label_smoothing_fp16.py",
                        evidence="with label smoothing in float16 the loss overflows to inf "
                                 "for a large vocabulary. "
                                 "cross_entropy_loss_label_smoothing (aten LossNLL.cpp) takes "
                                 "log_softmax in the input dtype and forms smooth_loss = "
                                 "−Σ_j log p_j in float16: for V = 32000 and logits in "
                                 "[−30, 30] that sum is ~−1.9e6, beyond 65504, so every row's "
                                 "loss is inf (float64: 21.79, 59.59, 12.41). Also rounds "
                                 "log p, the sum and the combination separately."),
                    "FALSIFY-CE-001/float16": Finding(
                        kind="deviation",
                        repro="torch_cross_entropy_label_smoothing_fp16.py",
                        evidence="label smoothing in float16 (ε = 0.1, ζ = 0, T = 8, V = 128, "
                                 "reduction none): row 2 got 30.5625, reference 30.581169, "
                                 "|err| 0.0187 > atol 8.9e-5 + rtol 4.88e-4·|ref| = 0.0150 "
                                 "(1.2 fp16 ulps of 0.0156 at 30.6, where the contract allows "
                                 "one rounding): the several float16 roundings of "
                                 "cross_entropy_loss_label_smoothing, as FALSIFY-CE-009/float16."),
                    "FALSIFY-CE-009/float16": Finding(
                        kind="deviation",
                        repro="torch_cross_entropy_label_smoothing_fp16.py",
                        evidence="mean with label smoothing in float16 (T = 16, V = 3, "
                                 "ε = 0.1): got 10.8828125, reference 10.891616, |err| 0.0088 > "
                                 "atol 6.5e-4 + rtol 4.9e-4·|ref| (≈ 1.1 fp16 ulp at 10.9). "
                                 "cross_entropy_loss_label_smoothing computes log_softmax, the "
                                 "nll term, −Σ log p and (1 − ε)·nll + ε/V·smooth each in "
                                 "float16 (several roundings), where the contract allows one "
                                 "rounding of an fp32 accumulation."),
                    "FALSIFY-CE-010/float16": Finding(
                        kind="deviation",
                        repro="torch_cross_entropy_fp16_grad.py",
                        evidence="the float16 gradient is exp of the float16-rounded "
                                 "log-probabilities (log_softmax_backward: g = dy − exp(out)·"
                                 "Σdy, `out` the saved fp16 log_softmax): for logits all 0, "
                                 "V = 27, label 0, log(1/27) = −3.2958 is stored as −3.2949, "
                                 "so p = 0.037071 instead of 0.037037 (≈ |log p|·2⁻¹¹ relative) "
                                 "and the row sums to 0.00116 > tol 0.00105 (one rounding per "
                                 "entry)."),
                }),
        Binding(name="F.silu", contract="swiglu-kernel-v1",
                binds={"silu": f"{M}:silu", "swiglu": f"{M}:swiglu"},
                dtypes=FLOAT_EXTRA, errors=("NotImplementedError",),
                findings={
                    "FALSIFY-SWG-001/float16": Finding(
                        kind="deviation",
                        repro="torch_swiglu_fp16_double_rounding.py",
                        evidence="torch's SwiGLU is two ops, each rounded to float16: "
                                 "F.silu(gate) is rounded, then the product with up is rounded "
                                 "again, where the contract allows one rounding of an fp32 "
                                 "product. m = n = 1: got −3.6953125, reference −3.6929232, "
                                 "|err| 0.00239 > rtol 4.9e-4·|ref| (F.silu alone passes every "
                                 "float16 check)."),
                    "FALSIFY-SWG-002/float16": Finding(
                        kind="deviation",
                        repro="torch_swiglu_fp16_double_rounding.py",
                        evidence="as FALSIFY-SWG-001/float16 (two float16 roundings): gate "
                                 "−9.016, got −0.0017509460, reference −0.0017519465, relative "
                                 "error 5.7e-4 > rtol 4.95e-4."),
                    "FALSIFY-SWG-003/float16": Finding(
                        kind="deviation",
                        repro="torch_swiglu_fp16_double_rounding.py",
                        evidence="autograd of F.silu(gate)·up in float16 rounds dy·up to "
                                 "float16 before silu_backward and silu's derivative again: "
                                 "d/dgate at (1, 7) got −0.31201172, reference −0.31220365, "
                                 "|err| 1.9e-4 > rtol 4.9e-4·|ref| + atol 2.56e-5 (3 of 201)."),
                }),
        Binding(name="F.gelu", contract="gelu-kernel-v1",
                binds={"gelu": f"{M}:gelu"},
                dtypes=FLOAT_EXTRA, errors=("NotImplementedError",),
                findings={
                    "FALSIFY-GELU-001/float32": GELU_ERF32,
                    "FALSIFY-GELU-020": Finding(
                        kind="deviation",
                        repro="torch_gelu_tanh_derivative_cancellation.py",
                        evidence="tanh-form double backward: ∂S/∂x(0, 2) = 0.00246294192 vs the "
                                 "reference's 0.00246308346, |diff| 1.42e-07 > bound 7.36e-08 "
                                 "(eps·ref_max). " + GELU_TANH_D),
                    "FALSIFY-GELU-023": Finding(
                        kind="deviation",
                        repro="torch_gelu_tanh_derivative_cancellation.py",
                        evidence="tanh-form forward mode: Σ⟨dy, J·t⟩ = 0.0018456893 vs "
                                 "0.0018455702, |diff| 1.19e-07 > bound 7.35e-08 (32·eps·M); "
                                 "gelu's jvp is gelu_backward (auto_element_wise). "
                                 + GELU_TANH_D),
                }),
        Binding(name="AdamW(foreach=False)", contract="adamw-kernel-v1",
                binds={"adamw_step": f"{M}:adamw_step", "adamw_run": f"{M}:adamw_run"},
                dtypes=ADAMW_DTYPES, errors=INT_REFUSAL, not_claimed=ADAMW_NOT_CLAIMED,
                findings=ADAMW_FINDINGS),
        Binding(name="AdamW(foreach=True)", contract="adamw-kernel-v1",
                binds={"adamw_step": f"{M}:adamw_step_foreach",
                       "adamw_run": f"{M}:adamw_run_foreach"},
                dtypes=ADAMW_DTYPES, errors=INT_REFUSAL, not_claimed=ADAMW_NOT_CLAIMED,
                findings=ADAMW_FINDINGS),
        Binding(name="AdamW(fused=True)", contract="adamw-kernel-v1",
                binds={"adamw_step": f"{M}:adamw_step_fused",
                       "adamw_run": f"{M}:adamw_run_fused"},
                dtypes=FLOAT_EXTRA, errors=INT_REFUSAL, not_claimed=ADAMW_FUSED_NOT_CLAIMED,
                findings={**ADAMW_FINDINGS, "FALSIFY-AW-027": Finding(
                    kind="deviation",
                    repro="torch_fused_adamw_strided_grad.py",
                    evidence="the fused CPU kernel (aten::_fused_adamw_) reads a noncontiguous "
                             "gradient as if it were contiguous: for p.grad = base[:, ::2] with "
                             "base = [[1, 7, 3, 9]] (values 1, 3; stride (4, 2)) and β1 = 0, "
                             "fused=True stores exp_avg = [1, 7], the for-loop and foreach "
                             "paths [1, 3]. The contract's strided-views case (param stride "
                             "(4, 2), grads stride (4, 4, 2), r = 1, c = 2) gets NaN at (0, 1) "
                             "where the reference gives 0.0; contiguous gradients pass.")}),
        Binding(name="clip_grad_norm_(foreach=False)", contract="grad-clip-kernel-v1",
                binds={"clip_grad_norm": f"{M}:clip_grad_norm"},
                dtypes=FLOAT_EXTRA, errors=INT_REFUSAL,
                findings=_clip_findings(CLIP_VARIANT)),
        Binding(name="clip_grad_norm_(foreach=True)", contract="grad-clip-kernel-v1",
                binds={"clip_grad_norm": f"{M}:clip_grad_norm_foreach"},
                dtypes=FLOAT_EXTRA, errors=INT_REFUSAL,
                findings=_clip_findings(CLIP_VARIANT)),
        Binding(name="F.embedding", contract="embedding-kernel-v1",
                binds={"embedding": f"{M}:embedding"},
                # a gather: any table dtype, integers included, comes back as it is
                dtypes=("float64", "bfloat16", "int64", "int32"),
                not_claimed={
                    "FALSIFY-EMB-015": JVP,
                    "FALSIFY-EMB-017": "V = 0 is refused, but with RuntimeError "
                                       "\"index_select(): self indexing axis dim should be "
                                       "positive\" from inside the op, not a ValueError naming "
                                       "V = 0 before launch"},
                findings={
                    "FALSIFY-EMB-003/float16": Finding(
                        kind="deviation",
                        repro="torch_embedding_fp16_grad_accumulation.py",
                        evidence="the float16 table gradient is accumulated in float16: "
                                 "embedding_dense_backward_cpu index_add_s dy into a grad_weight "
                                 "of dy's dtype, rounding after every repeated id. b = 1, "
                                 "t = 33, V = 5, d = 97: d_table(0, 25) got −2.3828125, "
                                 "reference −2.384765625, |err| 0.00195 (max 0.00537) > atol "
                                 "7.8e-4 + rtol 4.9e-4·|ref|; 32 of 485 elements."),
                }),
        Binding(name="torch.addmm", contract="gemm-kernel-v1",
                binds={"gemm": f"{M}:gemm"},
                dtypes=("float64", "bfloat16", "int64", "int32"),
                not_claimed={
                    "FALSIFY-GEMM-007": "a wrong out= dtype is refused with RuntimeError "
                                        "(\"Expected out tensor to have dtype float, but got "
                                        "double instead\"), not TypeError/ValueError"},
                findings={
                    "FALSIFY-GEMM-005/float16": Finding(
                        kind="variant", variant="result in the inputs' dtype on the CPU",
                        evidence="the check multiplies float16 inputs near 65504 into a "
                                 "float32 out=; torch.addmm's out must have the inputs' dtype "
                                 "(RuntimeError \"Expected out tensor to have dtype c10::Half, "
                                 "but got float instead\"), and its out_dtype= overload "
                                 "(aten::addmm.dtype / dtype_out) has no CPU kernel "
                                 "(NotImplementedError)."),
                }),
        Binding(name="SequentialLR(LinearLR, CosineAnnealingLR)", contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{M}:sequential_linear_cosine"},
                findings={
                    "FALSIFY-LRS-001": Finding(
                        kind="deviation", repro="torch_sequentiallr_drift.py",
                        evidence="the stepped (chainable) rates drift: CosineAnnealingLR.get_lr "
                                 "multiplies the previous rate by (1 + cos(πt/T))/(1 + "
                                 "cos(π(t − 1)/T)) and LinearLR by 1 + (end − start)/(…) every "
                                 "step, so rounding accumulates with the step count: W = 375, "
                                 "T = 7500, lr_max 3e-4, lr_min 3e-5, lr(2518) got "
                                 "0.00024408591431924177, true 0.000244085914319233194, |err| "
                                 "8.6e-18 = 129·eps·lr_max > bound 8·eps·lr_max = 5.3e-19 (W = "
                                 "2000, T = 5000: 56.6·eps·lr_max at step 2905). The run's first "
                                 "failure is past T (" + LRS_PERIODIC + ")."),
                    "FALSIFY-LRS-002": Finding(
                        kind="variant", variant=LRS_PERIODIC_NAME,
                        evidence="W = 0, T = 1, lr_max 3e-4, lr_min 0, steps 0 … 6: got "
                                 "3e-4 at steps 2, 4, 6, reference 0 (3 of 7 beyond atol "
                                 "5.3e-19). " + LRS_PERIODIC + ". Inside [0, T] the sweep's "
                                 "schedules (T ≤ 300) stay within 5.7·eps·lr_max."),
                    "FALSIFY-LRS-004": Finding(
                        kind="deviation", repro="torch_sequentiallr_drift.py",
                        evidence=LRS_LINEAR_DRIFT),
                    "FALSIFY-LRS-005": Finding(
                        kind="variant", variant=LRS_PERIODIC_NAME,
                        evidence="W = 0, T = 1: y[T:] = [0, 3e-4, 0, 3e-4, …], not lr_min from T "
                                 "on (" + LRS_PERIODIC + "); and for W > 0, y[0] = 1e-16·lr_max "
                                 "≠ 0: " + LRS_START),
                    "FALSIFY-LRS-006": Finding(
                        kind="variant", variant=LRS_PERIODIC_NAME,
                        evidence="W = 500, T = 5016, lr_max 1, lr_min 0: y[W] = lr_max and both "
                                 "phases are monotone, but y[T + 1] = 1.2e-7 > 0 = lr_min: "
                                 + LRS_PERIODIC + "."),
                    "FALSIFY-LRS-013": Finding(
                        kind="variant", variant=LRS_PERIODIC_NAME,
                        evidence="the layouts check compares with the reference under "
                                 "FALSIFY-LRS-001's bound: W = 0, T = 1, step 86 (stepped view): "
                                 "got 3e-4, reference lr_min = 3e-5 (" + LRS_PERIODIC + "); "
                                 "contiguous, transposed, expanded views and n = 0 agree."),
                }),
        Binding(name="SequentialLR(LinearLR, CosineAnnealingWarmRestarts)",
                contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{M}:sequential_linear_cosine_restarts"},
                findings={
                    "FALSIFY-LRS-001": Finding(
                        kind="deviation", repro="torch_sequentiallr_drift.py",
                        evidence="the first failure is past T (W = 0, T = 1, step 86: got "
                                 "3e-4, reference 0; " + LRS_RESTART + "), but inside [0, T) "
                                 "the LinearLR warmup drifts too: W = 2000, T = 5000, lr_max "
                                 "3e-4: lr(1932) got 0.0002897999999999977, true 0.0002898, "
                                 "34·eps·lr_max > bound 8·eps·lr_max. " + LRS_LINEAR_DRIFT),
                    "FALSIFY-LRS-002": Finding(
                        kind="variant", variant=LRS_RESTART_NAME,
                        evidence="W = 0, T = 1, lr_max 3e-4, lr_min 0, steps 0 … 6: got 3e-4 at "
                                 "steps 1 … 6, reference 0 (6 of 7 beyond atol 5.3e-19): "
                                 + LRS_RESTART + ". The closed-form decay itself stays within "
                                 "the bound."),
                    "FALSIFY-LRS-004": Finding(
                        kind="deviation", repro="torch_sequentiallr_drift.py",
                        evidence=LRS_LINEAR_DRIFT),
                    "FALSIFY-LRS-005": Finding(
                        kind="variant", variant=LRS_RESTART_NAME,
                        evidence="W = 0, T = 1: y[T:] = lr_max at every step, not lr_min ("
                                 + LRS_RESTART + "); and for W > 0, y[0] = 1e-16·lr_max ≠ 0: "
                                 + LRS_START),
                    "FALSIFY-LRS-006": Finding(
                        kind="variant", variant=LRS_RESTART_NAME,
                        evidence="W = 500, T = 5016: y[T] = lr_max, the decay restarts instead "
                                 "of holding lr_min (" + LRS_RESTART + ")."),
                    "FALSIFY-LRS-008": Finding(
                        kind="variant", variant=LRS_RESTART_NAME,
                        evidence="the symmetry pairs lr(W + k) with lr(T − k), k = 0 … T − W, "
                                 "and lr(T) is the restart: W = 0, T = 1: y[0] + y[1] = 2·lr_max "
                                 "= 6e-4, expected lr_max + lr_min = 3e-4 (" + LRS_RESTART
                                 + "); for 0 < k < T − W the sums hold."),
                    "FALSIFY-LRS-013": Finding(
                        kind="variant", variant=LRS_RESTART_NAME,
                        evidence="stepped view, W = 0, T = 1, step 86: got 3e-4, reference "
                                 "lr_min = 3e-5 (" + LRS_RESTART + "); n = 0 and the other views "
                                 "agree."),
                }),
        Binding(name="F.linear", contract="gemm-kernel-v1",
                binds={"gemm": f"{M}:linear"},
                variant="unscaled",  # no α, β: judged at α = 1, β = 1 (the bias add)
                # integer inputs come back as integer products, as for torch.addmm
                dtypes=("float64", "bfloat16", "int64", "int32"),
                not_claimed={
                    "FALSIFY-GEMM-007": "F.linear has no out=: the adapter copies its result "
                                        "into the buffer, and a wrong-shaped one fails in that "
                                        "copy with RuntimeError (\"The size of tensor a (6) must "
                                        "match the size of tensor b (7)\"), a probe of the copy, "
                                        "not of F.linear"},
                findings={
                    "FALSIFY-GEMM-005/float16": Finding(
                        kind="variant", variant="result in the inputs' dtype",
                        evidence="F.linear returns the float16 result of the float16 inputs "
                                 "(m = 9, n = 96, k = 40, entries up to 6e4): the exact sums "
                                 "reach ~1e10, beyond 65504, so the float16 result is ±inf at "
                                 "864 of 864 positions before it is copied into the float32 "
                                 "out (F.linear has no out= and no out_dtype)."),
                }),
        Binding(name="torch.matmul", contract="gemm-kernel-v1",
                binds={"gemm": f"{M}:matmul"},
                variant="product",  # no α, β, C: judged at α = 1, β = 0
                dtypes=("float64", "bfloat16"),
                not_claimed={"FALSIFY-GEMM-007": TORCH_OUT_DTYPE},
                findings={
                    "FALSIFY-GEMM-005/float16": Finding(
                        kind="variant", variant="result in the inputs' dtype on the CPU",
                        evidence="the check multiplies float16 inputs near 65504 into a "
                                 "float32 out=; torch.matmul's out must have the inputs' dtype "
                                 "(RuntimeError \"Expected out tensor to have dtype c10::Half, "
                                 "but got float instead\")."),
                }),
        Binding(name="torch.baddbmm", contract="gemm-kernel-v1",
                binds={"gemm": f"{M}:baddbmm"},
                # called: int64 and int32 come back as integer results, as for torch.addmm
                dtypes=("float64", "bfloat16", "int64", "int32"),
                not_claimed={"FALSIFY-GEMM-007": TORCH_OUT_DTYPE},
                findings={
                    "FALSIFY-GEMM-005/float16": Finding(
                        kind="variant", variant="result in the inputs' dtype on the CPU",
                        evidence="float16 inputs near 65504 into a float32 out=: "
                                 "torch.baddbmm's out must have the inputs' dtype "
                                 "(RuntimeError \"Expected out tensor to have dtype c10::Half, "
                                 "but got float instead\")."),
                }),
        Binding(name="F.scaled_dot_product_attention(attn_mask)", contract="attention-kernel-v1",
                binds={"attention": f"{M}:sdpa_attention_masked"},
                # d = 0: the masked call returns the empty [b, h, s, 0] result (called), where
                # the is_causal call refuses it
                dtypes=FLOAT_EXTRA, zero_size={"hkv": "empty", "d": "empty"}, errors=INT_REFUSAL,
                not_claimed={
                    "FALSIFY-ATT-013": "an explicit mask is an [s_q, s_k] input, quadratic in S "
                                       "by construction (the adapter's bool mask alone is 1 MiB "
                                       "at S = 1024): the run's peak grows 6.66× from S = 256 "
                                       "(1.58 MB) to 1024 (10.5 MB), past the linear-memory "
                                       "bound of 6×, still under the 16.8 MB of the scores; "
                                       "linear memory is the is_causal path's promise",
                    "FALSIFY-ATT-025": "integer q, k, v are refused inside the op with "
                                       "RuntimeError \"expected m1 and m2 to have the same "
                                       "dtype, but got: float != long int\" (the masked call "
                                       "meets a float tensor), which does not name int64; torch "
                                       "makes no promise about the refusal's wording"}),
        Binding(name="F.softmax(dtype=float32)", contract="softmax-kernel-v1",
                binds={"softmax": f"{M}:softmax_fp32"},
                dtypes=FLOAT_EXTRA, zero_size={"n": "empty"}, errors=("NotImplementedError",),
                findings={
                    **dict.fromkeys(("FALSIFY-SM-005/float16", "FALSIFY-SM-006/float16"), Finding(
                        kind="variant", variant="result in the requested dtype (float32)",
                        evidence="float16 x (m = n = 1, x = 6.35; x = 1e4) gives a float32 "
                                 "result: `dtype=torch.float32` casts x before the kernel and "
                                 "returns the float32 softmax, where the equation keeps x's "
                                 "dtype. The values are the fp32 evaluation on the exact fp16 "
                                 "inputs (3 × 1000 fp16 logits of scale 30: max |err| 7.2e-8 "
                                 "against the float64 reference, below one fp16 rounding).")),
                    "FALSIFY-SM-012": Finding(
                        kind="variant", variant="integer input cast to the requested dtype",
                        evidence="int64 x is accepted and returned as float32 [4, 128]: "
                                 "`dtype=torch.float32` casts it before the kernel (x = [1, 2, 3] "
                                 "gives [0.0900, 0.2447, 0.6652], the float32 softmax), not "
                                 "refused with an error naming the dtype."),
                }),
    ),
)
