"""Hugging Face transformers (PyPI `transformers`, 5.x): the Llama building blocks and the
activations every model file shares, against the kernel contracts they implement.

Bound:
- `LlamaRMSNorm.forward` -> rmsnorm-kernel-v1 (`rmsnorm`), the contract's `w` as its weight;
- `GemmaRMSNorm.forward` -> rmsnorm-kernel-v1's `one-plus-w` variant (y = x̂ ⊙ (1 + w), all in
  fp32, one rounding), judged against that variant's own reference;
- `LlamaRotaryEmbedding.forward` (the cos/sin table) + `apply_rotary_pos_emb` -> rope-kernel-v1
  (`rope`, `rope_grouping`). Both use the rotate-half layout (x1 = x[..., :D/2]) the contract
  states, so no permutation is needed; the contract's x is [B, S, H, D], which
  `apply_rotary_pos_emb` reads with `unsqueeze_dim=2`;
- `eager_attention_forward` (Llama's) and `integrations.sdpa_attention.sdpa_attention_forward`
  -> attention-kernel-v1 (`attention`). Both take [B, H, S, D] and return [B, S, H, D]; the
  adapters transpose back. Eager attention takes the causal mask as an additive tensor, built by
  transformers' own `masking_utils.eager_mask` (0 / finfo(dtype).min), as a Llama model does;
- `ACT2FN["silu"]` -> swiglu-kernel-v1 (`silu`), and LlamaMLP's gate `act_fn(gate) * up` (its
  own `forward`, with the projections as identities) -> `swiglu`;
- `ACT2FN["gelu"]` (exact) with `ACT2FN["gelu_pytorch_tanh"]` or `ACT2FN["gelu_new"]` (tanh)
  -> gelu-kernel-v1 (`gelu`), two bindings; and `ACT2FN["gelu_fast"]` (the tanh form with
  √(2/π) cut to 0.7978845608 and x factored out) paired with `ACT2FN["gelu"]`, and
  `ACT2FN["gelu_python"]` (the erf form in torch ops) paired with `ACT2FN["gelu_pytorch_tanh"]`,
  so that each binding judges one new form;
- `T5LayerNorm` and `Olmo2RMSNorm` -> rmsnorm-kernel-v1, the two RMSNorm forwards whose
  arithmetic differs from LlamaRMSNorm's (T5: x scaled in its own dtype promoted by the fp32
  rsqrt, cast to the weight's dtype only for fp16/bf16 weights; Olmo2: the weight product in
  fp32, one cast at the end). `Qwen2RMSNorm`, `MistralRMSNorm` and `Qwen3RMSNorm` are not bound:
  their `forward` is LlamaRMSNorm's verbatim (the same AST), as is that of 136 other
  `*RMSNorm` classes generated from it;
- `loss_utils.ForCausalLMLoss` (what `LlamaForCausalLM.loss_function` is) ->
  cross-entropy-kernel-v1 (`cross_entropy`, and `cross_entropy_grad` through autograd), at the
  contract's `plain-mean` variant (ζ = 0, ε = 0, mean: all it computes; checks whose inputs fix
  another reduction are outside it, n/a); its `shift_labels=` aligns the contract's labels
  with the rows (see the adapter);
- the cosine schedules of `transformers.optimization` -> lr-schedule-kernel-v1 (`lr_at`):
  `get_cosine_schedule_with_warmup`, `get_cosine_with_min_lr_schedule_with_warmup`,
  `get_cosine_with_min_lr_schedule_with_warmup_lr_rate`,
  `get_cosine_with_hard_restarts_schedule_with_warmup(num_cycles=1)` and `get_wsd_schedule`
  with no stable phase and `decay_type="cosine"`, each stepped as in training (torch's
  LambdaLR on an optimizer at lr = lr_max).

LlamaRMSNorm, LlamaRotaryEmbedding and LlamaMLP run as their own (unbound) `forward` on a small
object holding the attributes it reads (`_Self`), so no module or Parameter is built per call,
which torch.compile and torch.func cannot trace; the arithmetic is the forward's, line for line.

Not bound: `gelu_gap` and the in-place SwiGLU backward have no transformers counterpart (their
checks keep running our own functions); `ACT2FN["quick_gelu"]` (x·σ(1.702x)) and
`ACT2FN["gelu_10"]` (GELU clipped to [−10, 10]) are other functions than gelu-kernel-v1's, not
forms of it; `ACT2FN["gelu_accurate"]` and `ACT2FN["gelu_python_tanh"]` evaluate gelu_new's
formula with the same operations (bound as gelu_new), and `ACT2FN["swish"]` is torch's
nn.SiLU (torch's F.silu binding); `get_linear_schedule_with_warmup` and the other decay
shapes are not the contract's cosine.
"""

from __future__ import annotations

import torch

from falsify.conformance.lib_torch import GELU_ERF32
from falsify.conformance.registry import Binding, Finding, Library, into


class _Self:
    """Stands in for a module instance: holds the attributes its `forward` reads. A plain
    class (not types.SimpleNamespace, which Dynamo cannot trace) so torch.compile sees through."""

    def __init__(self, **attrs):
        for name, value in attrs.items():
            setattr(self, name, value)


_into = into  # the shared out= helper (registry.into)


# ---------------------------------------------------------------- rmsnorm-kernel-v1
def llama_rmsnorm(x, w, eps, out=None):
    """LlamaRMSNorm.forward run on the contract's (w, eps) as the module's (weight,
    variance_epsilon): the module's own code, without building a module (and a Parameter) per
    call, which torch.compile and torch.func cannot trace."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    module = _Self(weight=w, variance_epsilon=eps)
    return _into(out, LlamaRMSNorm.forward(module, x))


def gemma_rmsnorm(x, w, eps, out=None):
    """GemmaRMSNorm.forward on the contract's (w, eps) as the module's (weight, eps): it
    normalizes in fp32, scales by (1 + weight) in fp32 and rounds once to x's dtype — the
    contract's `one-plus-w` variant. Its `_norm` is read off the class, as the module would."""
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

    module = _Self(weight=w, eps=eps)
    module._norm = lambda t: GemmaRMSNorm._norm(module, t)
    return _into(out, GemmaRMSNorm.forward(module, x))


# ---------------------------------------------------------------- rope-kernel-v1
def llama_rope_table(x, pos, theta):
    """(cos, sin) [1, S, D] in x's dtype as LlamaRotaryEmbedding builds them for positions pos:
    its `compute_default_rope_parameters` (inv_freq = 1/theta^(2k/D) in fp32) and its
    `forward` (fp32 angles pos·inv_freq, cos/sin, cast to x's dtype), run on namespaces holding
    what they read rather than on a LlamaConfig and a module built per call."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _Self(rope_parameters={"rope_type": "default",
                                                    "rope_theta": float(theta)},
                                   head_dim=x.shape[-1], hidden_size=x.shape[-1],
                                   num_attention_heads=1)
    inv_freq, scaling = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    module = _Self(rope_type="default", inv_freq=inv_freq,
                                   attention_scaling=scaling)
    return LlamaRotaryEmbedding.forward(module, x, pos[None])


def llama_rope(x, pos, theta, out=None):
    """apply_rotary_pos_emb(x, ·, cos, sin, unsqueeze_dim=2) with (cos, sin) from
    LlamaRotaryEmbedding(x, position_ids=pos[None]): the table a Llama model builds."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    cos, sin = llama_rope_table(x, pos, theta)
    y, _ = apply_rotary_pos_emb(x, x[:, :, :1], cos, sin, unsqueeze_dim=2)  # k: one head, unused
    return _into(out, y)


def llama_rope_grouped_and_per_head(x, pos, theta):
    """(all heads in one call, one head per call), as rope-kernel-v1's grouping equation asks."""
    with torch.no_grad():
        grouped = llama_rope(x, pos, theta)
        per_head = torch.cat([llama_rope(x[:, :, h:h + 1], pos, theta) for h in range(x.shape[2])],
                             dim=2)
    return grouped, per_head


# ---------------------------------------------------------------- attention-kernel-v1
def _attention_module(q, k, causal):
    """What the attention functions read off a LlamaAttention module: the GQA group size,
    `training` (dropout is 0 either way) and `is_causal`."""
    return _Self(num_key_value_groups=q.shape[1] // k.shape[1] if k.shape[1] else 0,
                                 training=False, is_causal=bool(causal))


def eager_attention(q, k, v, causal=True, scale=None, out=None):
    """Llama's eager_attention_forward: matmul, additive causal mask, fp32 softmax rounded to
    q's dtype, matmul. `scale=None` is LlamaAttention's `head_dim**-0.5`."""
    from transformers.masking_utils import eager_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    mask = None
    if causal:
        mask = eager_mask(batch_size=q.shape[0], q_length=q.shape[2], kv_length=k.shape[2],
                          dtype=q.dtype, device=q.device)
    scaling = q.shape[-1] ** -0.5 if scale is None else scale
    y, _ = eager_attention_forward(_attention_module(q, k, causal), q, k, v, mask, scaling)
    return _into(out, y.transpose(1, 2))


def sdpa_attention(q, k, v, causal=True, scale=None, out=None):
    """transformers' sdpa_attention_forward (no mask: it passes `is_causal` to SDPA and picks
    `enable_gqa` or repeat_kv for grouped heads)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    y, _ = sdpa_attention_forward(_attention_module(q, k, causal), q, k, v, None, scaling=scale,
                                  is_causal=bool(causal))
    return _into(out, y.transpose(1, 2))


# ---------------------------------------------------------------- swiglu-kernel-v1
def act_silu(x, out=None):
    """ACT2FN["silu"] (SiLUActivation: nn.functional.silu)."""
    from transformers.activations import ACT2FN

    return _into(out, ACT2FN["silu"](x))


def llama_mlp_swiglu(gate, up, out=None):
    """LlamaMLP.forward, `down_proj(act_fn(gate_proj(x)) * up_proj(x))`, run on the pair
    (gate, up) with gate_proj / up_proj picking its halves and down_proj the identity: the
    product is the model's own line."""
    from transformers.activations import ACT2FN
    from transformers.models.llama.modeling_llama import LlamaMLP

    mlp = _Self(gate_proj=lambda p: p[0], up_proj=lambda p: p[1],
                                down_proj=lambda y: y, act_fn=ACT2FN["silu"])
    return _into(out, LlamaMLP.forward(mlp, (gate, up)))


# ---------------------------------------------------------------- gelu-kernel-v1
def _gelu(x, approximate, tanh_name, out):
    from transformers.activations import ACT2FN

    if approximate == "none":
        return _into(out, ACT2FN["gelu"](x))
    if approximate == "tanh":
        return _into(out, ACT2FN[tanh_name](x))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def act_gelu(x, approximate, out=None):
    """ACT2FN["gelu"] (nn.functional.gelu) / ACT2FN["gelu_pytorch_tanh"] (its tanh form)."""
    return _gelu(x, approximate, "gelu_pytorch_tanh", out)


def act_gelu_new(x, approximate, out=None):
    """ACT2FN["gelu"] / ACT2FN["gelu_new"]: GPT-2's tanh GELU written out in torch ops
    (0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))), evaluated in x's dtype."""
    return _gelu(x, approximate, "gelu_new", out)


def act_gelu_fast(x, approximate, out=None):
    """ACT2FN["gelu"] / ACT2FN["gelu_fast"] (FastGELUActivation: 0.5·x·(1 + tanh(x·0.7978845608·
    (1 + 0.044715·x²))), the tanh form with √(2/π) cut to 10 digits and x factored out)."""
    return _gelu(x, approximate, "gelu_fast", out)


def act_gelu_python(x, approximate, out=None):
    """ACT2FN["gelu_python"] (x·0.5·(1 + erf(x/√2)) in torch ops, the exact form) /
    ACT2FN["gelu_pytorch_tanh"] (torch's fused tanh form, bound above)."""
    from transformers.activations import ACT2FN

    if approximate == "none":
        return _into(out, ACT2FN["gelu_python"](x))
    return _gelu(x, approximate, "gelu_pytorch_tanh", out)


# ---------------------------------------------------------------- rmsnorm-kernel-v1 (more)
def t5_layer_norm(x, w, eps, out=None):
    """T5LayerNorm.forward (the contract's w, eps as weight, variance_epsilon): the variance in
    fp32 but x itself scaled in its own dtype promoted by the fp32 rsqrt, cast to the weight's
    dtype only when that is fp16/bf16, then the weight product."""
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    module = _Self(weight=w, variance_epsilon=eps)
    return _into(out, T5LayerNorm.forward(module, x))


def olmo2_rmsnorm(x, w, eps, out=None):
    """Olmo2RMSNorm.forward: normalized in fp32, multiplied by the weight in fp32 (the weight
    promoted), one cast back to x's dtype at the end."""
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    module = _Self(weight=w, variance_epsilon=eps)
    return _into(out, Olmo2RMSNorm.forward(module, x))


# ---------------------------------------------------------------- cross-entropy-kernel-v1
def causal_lm_loss(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                   label_smoothing=0.0):
    """loss_utils.ForCausalLMLoss (LlamaForCausalLM.loss_function) on the contract's rows.

    ForCausalLMLoss pairs logits row t with labels[t + 1] (it pads labels with ignore_index and
    drops the first); its `shift_labels=` argument takes labels already aligned with the rows,
    as the Trainer's context-parallel path passes them, so the contract's (row, label) pairs
    reach F.cross_entropy unchanged ([1, T, V] logits, as a model returns them). `mean` is its
    default; `sum` is its gradient-accumulation path, Σ loss / num_items_in_batch, with
    num_items_in_batch = 1. It has no `none`, no z-loss and no label smoothing (its **kwargs
    swallow them): those calls are refused, not computed here.
    """
    from transformers.loss.loss_utils import ForCausalLMLoss

    if z_loss != 0.0:
        raise NotImplementedError(f"ForCausalLMLoss has no z-loss term (z_loss={z_loss!r})")
    if label_smoothing != 0.0:
        raise NotImplementedError(f"ForCausalLMLoss has no label smoothing ({label_smoothing!r})")
    if reduction not in ("mean", "sum"):
        raise NotImplementedError(f"ForCausalLMLoss reduces by mean or sum, not {reduction!r}")
    n = 1 if reduction == "sum" else None
    return ForCausalLMLoss(logits[None], None, vocab_size=logits.shape[-1], num_items_in_batch=n,
                           ignore_index=ignore_index, shift_labels=labels[None])


def causal_lm_loss_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                        label_smoothing=0.0):
    """∂(ForCausalLMLoss)/∂logits through its autograd backward (the fp32 upcast included)."""
    z = logits.detach().requires_grad_(True)
    loss = causal_lm_loss(z, labels, ignore_index, reduction, z_loss, label_smoothing)
    (g,) = torch.autograd.grad(loss, [z], grad_outputs=torch.ones_like(loss))
    return g


# ---------------------------------------------------------------- lr-schedule-kernel-v1
# each schedule is a torch LambdaLR; its rates are read off an optimizer stepped as in training
# (lib_torch.scheduled_rates)
def _schedule(make, step, lr_max):
    from falsify.conformance.lib_torch import scheduled_rates

    return scheduled_rates(make, step, lr_max)


def _decays_to_zero(name, lr_min):
    if lr_min != 0.0:
        raise NotImplementedError(f"{name} decays to 0: no lr_min (lr_min={lr_min!r})")


def cosine_schedule(step, warmup, total, lr_max, lr_min):
    """get_cosine_schedule_with_warmup(optimizer, warmup, total): the default num_cycles = 0.5
    is the contract's half cosine; it has no minimum (lr_min ≠ 0 is refused)."""
    from transformers.optimization import get_cosine_schedule_with_warmup

    _decays_to_zero("get_cosine_schedule_with_warmup", lr_min)
    return _schedule(lambda opt: get_cosine_schedule_with_warmup(opt, warmup, total), step,
                     lr_max)


def cosine_min_lr_schedule(step, warmup, total, lr_max, lr_min):
    """get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, total, min_lr=lr_min)."""
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup

    return _schedule(lambda opt: get_cosine_with_min_lr_schedule_with_warmup(
        opt, warmup, total, min_lr=lr_min), step, lr_max)


def cosine_min_lr_rate_schedule(step, warmup, total, lr_max, lr_min):
    """get_cosine_with_min_lr_schedule_with_warmup_lr_rate(optimizer, warmup, total,
    min_lr=lr_min), warmup_lr_rate left at its default."""
    from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup_lr_rate

    return _schedule(lambda opt: get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
        opt, warmup, total, min_lr=lr_min), step, lr_max)


def cosine_hard_restarts_schedule(step, warmup, total, lr_max, lr_min):
    """get_cosine_with_hard_restarts_schedule_with_warmup(optimizer, warmup, total,
    num_cycles=1): one cosine period, 0 from `total` on; no minimum (lr_min ≠ 0 refused)."""
    from transformers.optimization import get_cosine_with_hard_restarts_schedule_with_warmup

    _decays_to_zero("get_cosine_with_hard_restarts_schedule_with_warmup", lr_min)
    return _schedule(lambda opt: get_cosine_with_hard_restarts_schedule_with_warmup(
        opt, warmup, total, num_cycles=1), step, lr_max)


def wsd_schedule(step, warmup, total, lr_max, lr_min):
    """get_wsd_schedule with no stable phase: warmup W (linear), cosine decay over T − W steps
    (its defaults warmup_type="linear", decay_type="cosine"), min_lr_ratio = lr_min / lr_max
    (its parameter is the ratio)."""
    from transformers.optimization import get_wsd_schedule

    return _schedule(lambda opt: get_wsd_schedule(
        opt, warmup, total - warmup, num_stable_steps=0, min_lr_ratio=lr_min / lr_max), step,
        lr_max)


_M = "falsify.conformance.lib_transformers"

_JVP = ("built from plain torch operations, so torch.func.jvp computes a forward-mode derivative; "
        "transformers makes no promise to refuse forward-mode AD (our kernels refuse it because "
        "no check vets their jvp)")
_FLOAT_EXTRA = ("float64", "bfloat16")  # each called: a result of that dtype comes back
_INT_REFUSAL = ("torch refuses integer tensors inside its ops ({how}), not with a TypeError or "
                "ValueError naming the dtype; transformers makes no promise about the refusal")
_GRADGRAD = ("built from plain torch operations, so autograd differentiates the backward again; "
             "transformers makes no promise to refuse a double backward")

_LLAMA_RMSNORM_FP16 = (
    "LlamaRMSNorm.forward normalizes in fp32, rounds the normalized row to fp16 "
    "(`hidden_states.to(input_dtype)`), then multiplies by the fp16 weight, which rounds "
    "again: two roundings where the contract allows one after fp32 arithmetic. {what}: about "
    "1 fp16 ulp. In fp32 every parity and gradient check passes.")
_T5_FP16 = (
    "T5LayerNorm.forward scales x by the fp32 rsqrt of its variance, casts the normalized row "
    "to the fp16 weight's dtype (`hidden_states.to(self.weight.dtype)`) and multiplies by the "
    "weight, which rounds again: two roundings where the contract allows one after fp32 "
    "arithmetic (the arithmetic LlamaRMSNorm's is, in other code). {what}. In fp32 every "
    "parity and gradient check passes.")
_LLAMA_TABLE = (
    "LlamaRotaryEmbedding computes inv_freq = 1/theta^(2k/D) in fp32 "
    "(compute_default_rope_parameters) and the angles `position_ids.float() * inv_freq` in fp32 "
    "(forward), so an angle pos·f_k errs by up to pos·2^-24 rad; the contract's table is float64 "
    "angles rounded once. {what}")
_LLAMA_TABLE_FP16 = (
    " For fp16 x the table is also cast to fp16 (`cos.to(dtype=x.dtype)`) and "
    "`q * cos + rotate_half(q) * sin` runs in fp16, three roundings.")

# both tanh forms: torch's own tanh-GELU derivatives
_GELU_TANH_AD = {

    "FALSIFY-GELU-023": Finding(
        kind="deviation", repro="transformers_gelu_tanh_derivative_cancellation.py",
        evidence=(
        "torch's tanh-GELU derivative (the gelu_backward kernel behind "
        "nn.functional.gelu(approximate='tanh'), and autograd of GPT-2's formula, "
        "which agree to 2e-9) evaluates ½·(1 + tanh u) + …, which cancels for "
        "negative x: at x = -3.87, u ≈ -5.15 and 1 + tanh u ≈ 6.8e-5 carries a "
        "relative error of ~eps/6.8e-5. The contract's bound assumes the σ(2u) form "
        "its derivation prescribes. x = [1.0957, -1.8417, -3.6722, -3.8678]: "
        "Σ⟨dy, J·t⟩ = 0.00184569 vs 0.00184557, |diff| 1.19e-7 > 7.35e-8 "
        "(32·eps·Σ|g||t|). The exact form passes.")),
    "FALSIFY-GELU-020": Finding(
        kind="deviation", repro="transformers_gelu_tanh_derivative_cancellation.py",
        evidence=(
        "double backward of the tanh form: the same 1 + tanh u cancellation for "
        "negative x (see FALSIFY-GELU-023): ∂S/∂x(0, 3) 3.36591e-4 vs central "
        "difference 3.36493e-4, |diff| 9.74e-8 > 7.36e-8 + 1.06e-8. The exact form "
        "passes.")),
}

# ForCausalLMLoss computes the contract's `plain-mean` variant only
_CE_ONLY = "plain-mean"


# the transformers schedules past num_training_steps and at step 0
_LRS_RISES = "cosine continues past num_training_steps"
_LRS_RISES_WHY = (
    "the lambda is 0.5·(1 + cos(π·2·num_cycles·progress)) with progress = (s − W)/(T − W) "
    "unbounded: past T (progress > 1) the cosine rises again towards lr_max (no floor; the "
    "docstring describes the schedule up to num_training_steps only); the contract holds "
    "lr_min from T on")
_LRS_RATIO = "parametrized by min_lr_ratio (floor lr_max·ratio, warmup from it)"
_LRS_WSD = (
    "get_wsd_schedule takes the floor as a ratio of lr_max (min_lr_ratio, passed as lr_min / "
    "lr_max) and documents its warmup as rising \"from min_lr_ratio times the initial learning "
    "rate\": lr(0) = lr_max·ratio, not 0, and the floor lr_max·(lr_min/lr_max) = "
    "2.9999999999999997e-05 for lr_min = 3e-5 (one ulp below; the ratio is the API's only "
    "parameter)")
_LRS_ONE_BASED = "1-based steps (lr(s) is the contract's lr(s + 1))"
_LRS_ONE_BASED_WHY = (
    "with warmup_lr_rate unset the lambda is (s + 1)/W in the warmup (its docstring: "
    "warmup_lr_rate \"treated as float(1/num_warmup_steps)\") and progress = (s − W + 1)/"
    "(T − W) in the decay: every rate is the contract's rate one step later, the peak is at "
    "W − 1 and the floor at T − 1")

LIBRARY = Library(
    name="transformers",
    distribution="transformers",
    bindings=(
        Binding(
            name="LlamaRMSNorm",
            contract="rmsnorm-kernel-v1",
            binds={"rmsnorm": f"{_M}:llama_rmsnorm"},
            # float64 comes back float64, though LlamaRMSNorm normalizes it in fp32
            dtypes=_FLOAT_EXTRA,
            zero_size={"n": "empty"},  # a [2, 0] input returns a [2, 0] result
            not_claimed={
                "FALSIFY-RN-021": _JVP,
                "FALSIFY-RN-008": (
                    "saved-tensor probe: LlamaRMSNorm is a chain of torch ops and autograd keeps "
                    "what they need (the normalized rows for the weight product, and for fp16 "
                    "an fp32 copy of x); transformers promises no recomputing backward"),
            },
            findings={
                "FALSIFY-RN-015": Finding(
                    kind="deviation", repro="transformers_llama_rmsnorm_integer_input.py",
                    evidence=(
                    "integer x is accepted and rounded through the fp32 normalization: "
                    "LlamaRMSNorm.forward casts x to fp32, normalizes, casts back with "
                    "`.to(input_dtype)` (truncating |x̂| < 1 to 0) and multiplies by the weight; "
                    "x = [4, -3, 2, 0, -2] int64 with w = 1 gives [1, -1, 0, 0, 0].")),
                "FALSIFY-RN-001/float16": Finding(
                    kind="deviation", repro="transformers_llama_rmsnorm_fp16_double_rounding.py",
                    evidence=_LLAMA_RMSNORM_FP16.format(
                    what="got 0.6669921875 vs 0.66749877 at (0, 719), max |err| 1.81e-3 > "
                         "rtol 7.35e-4, 1.04 fp16 ulps off")),
                "FALSIFY-RN-002/float16": Finding(
                    kind="deviation", repro="transformers_llama_rmsnorm_fp16_double_rounding.py",
                    evidence=_LLAMA_RMSNORM_FP16.format(
                    what="got 1.62890625 vs 1.62984678 at (0, 7), max |err| 1.48e-3 > rtol "
                         "4.95e-4, 0.96 fp16 ulps off")),
                "FALSIFY-RN-006/float16": Finding(
                    kind="deviation", repro="transformers_llama_rmsnorm_fp16_double_rounding.py",
                    evidence=_LLAMA_RMSNORM_FP16.format(
                    what="d/dx (autograd through the same ops, fp16 intermediates): got "
                         "-1.7294921875 vs -1.73052444 at (0, 66), max |err| 1.03e-3 > rtol "
                         "4.88e-4, 1.06 fp16 ulps off")),
                "FALSIFY-RN-024/float16": Finding(
                    kind="deviation", repro="transformers_llama_rmsnorm_fp16_double_rounding.py",
                    evidence=(
                    "compiled vs eager d/dw differ: 0.5126953125 (compiled) vs 0.51171875 "
                    "(eager) at (16,), max |err| 3.91e-3 > atol 4.74e-4 + rtol 9.77e-4. Eager "
                    "autograd forms dw from the fp16-rounded normalized rows (`weight * "
                    "hidden_states.to(input_dtype)`) and reduces fp16 products; Inductor fuses "
                    "the cast and the reduction and keeps fp32, so the library's result depends "
                    "on whether it is compiled. fp32 passes.")),
            },
        ),
        Binding(
            name="GemmaRMSNorm",
            contract="rmsnorm-kernel-v1",
            binds={"rmsnorm": f"{_M}:gemma_rmsnorm"},
            variant="one-plus-w",  # y = x̂ ⊙ (1 + w): judged against that variant's reference
            dtypes=_FLOAT_EXTRA,
            zero_size={"n": "empty"},
            not_claimed={
                "FALSIFY-RN-021": _JVP,
                "FALSIFY-RN-008": (
                    "saved-tensor probe: GemmaRMSNorm is a chain of torch ops (an fp32 copy of x, "
                    "its normalized rows, 1 + w) whose autograd keeps what they need; "
                    "transformers promises no recomputing backward"),
            },
            findings={
                "FALSIFY-RN-015": Finding(
                    kind="deviation", repro="transformers_gemma_rmsnorm_integer_input.py",
                    evidence=(
                    "integer x is accepted and truncated: GemmaRMSNorm.forward normalizes "
                    "x.float(), scales by 1 + w and casts back with `type_as(x)`, so an int64 "
                    "[4, 128] comes back int64; x = [4, -3, 2, 0, -2] with w = 0 gives "
                    "[1, -1, 0, 0, 0] (x̂ = [1.56, -1.17, 0.78, 0, -0.78] truncated).")),
            },
        ),
        Binding(
            name="apply_rotary_pos_emb",
            contract="rope-kernel-v1",
            binds={"rope": f"{_M}:llama_rope",
                   "rope_grouping": f"{_M}:llama_rope_grouped_and_per_head"},
            dtypes=_FLOAT_EXTRA,  # float64 out (the table's values are fp32 cast up), bfloat16
            zero_size={"half": "empty"},  # D = 0: inv_freq is empty, the result [.., 0]
            not_claimed={"FALSIFY-ROPE-016": _JVP},
            findings={
                **dict.fromkeys(("FALSIFY-ROPE-011", "FALSIFY-ROPE-012"), Finding(
                    kind="deviation", repro="transformers_llama_rope_integer_input.py",
                    evidence=(
                    "integer x is accepted and returned as integers: LlamaRotaryEmbedding casts "
                    "cos/sin to x's dtype (`cos.to(dtype=x.dtype)`: values in [-1, 1] truncate to "
                    "0 or ±1) and `q * cos + rotate_half(q) * sin` runs in int64, so the "
                    "rotation is lost without an error."))),
                "FALSIFY-ROPE-001/float32": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="theta 5e5, pos up to 7583, D = 34: got -3.50091934 vs -3.50092783 at "
                         "(0, 0, 0, 1), max |err| 2.84e-4 > atol 1.97e-6.")),
                "FALSIFY-ROPE-002/float16": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=(
                    "norm preservation, |y|² = |x|² per rotated pair, fails at 1 position "
                    "((0, 1, 4, 15) of b = 1, s = 2, h = 6, half = 20; fresh seed 2533420250): "
                    "the rotation is applied with a table rounded like FALSIFY-ROPE-001's.")
                    + _LLAMA_TABLE_FP16),
                "FALSIFY-ROPE-001/float16": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="Same example as float32: got -0.67578125 vs -0.67647269 at "
                         "(0, 0, 0, 5), max |err| 4.19e-3 > rtol 4.88e-4.") + _LLAMA_TABLE_FP16),
                "FALSIFY-ROPE-005/float32": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="The gradient (autograd of the same ops) rotates dy by the same fp32 "
                         "angles: got 0.48819277 vs 0.48819413 at (0, 0, 0, 2), max |err| "
                         "9.38e-5 > atol 1.09e-6.")),
                "FALSIFY-ROPE-005/float16": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="d/dx got 0.20703125 vs 0.20733975, |err| 3.09e-4 > rtol 4.88e-4·|ref| "
                         "+ atol 7.5e-7.") + _LLAMA_TABLE_FP16),
                "FALSIFY-ROPE-003/float32": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="Relative position: with positions shifted by c = 851 the inner "
                         "products ⟨R_m q, R_n k⟩ change at 42 of the (s, t) pairs beyond the "
                         "bound, because the fp32 angle error grows with the absolute position "
                         "instead of depending on m − n only.")),
                "FALSIFY-ROPE-018/float32": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="The layout check compares each view's result with the reference "
                         "under FALSIFY-ROPE-001's bound; on an expanded view (x stride (36, 36, "
                         "36, 0)) the same table error shows: 0.73888314 vs 0.73888374 at "
                         "(0, 0, 0, 19), |err| 6.05e-7 > atol 5.54e-7 (size-0 dims pass).")),
                "FALSIFY-ROPE-014/float32": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_LLAMA_TABLE.format(
                    what="Double backward (∂S/∂dy: v rotated by the table): -1.43962169 vs "
                         "central difference -1.43962776, |diff| 6.08e-6 > 4.49e-6 + 3.89e-7.")),
            },
        ),
        Binding(
            name="eager_attention_forward",
            contract="attention-kernel-v1",
            binds={"attention": f"{_M}:eager_attention"},
            dtypes=_FLOAT_EXTRA,  # float64 in float64; bfloat16 via the fp32 softmax
            zero_size={"hkv": "empty"},  # no heads: repeat_kv and the matmuls return [b, 0, s, d]
            not_claimed={
                "FALSIFY-ATT-025": (
                    "integer q, k, v are refused by masking_utils.eager_mask with TypeError "
                    "'torch.finfo() requires a floating point input type', which does not name "
                    "the dtype; transformers makes no promise about the refusal"),
                "FALSIFY-ATT-033": _JVP,
                "FALSIFY-ATT-030": _GRADGRAD,
                "FALSIFY-ATT-013": (
                    "memory probe: eager attention materializes the [B, H, S, S] scores and "
                    "probabilities by design (it is transformers' reference path, the one that "
                    "can return attention weights); it promises no memory linear in S"),
            },
            findings={
                "FALSIFY-ATT-036": Finding(
                    kind="deviation", repro="transformers_llama_attention_head_dim_zero.py",
                    evidence=(
                    "d = 0 is not refused with a clear error: the scaling LlamaAttention uses, "
                    "`head_dim**-0.5`, raises ZeroDivisionError ('0.0 cannot be raised to a "
                    "negative power'); b, g, s = 0 return empty results as the contract asks.")),
                "FALSIFY-ATT-002/float16": Finding(
                    kind="deviation", repro="transformers_eager_attention_fp16_scores.py",
                    evidence=(
                    "large logits in fp16: eager_attention_forward computes `matmul(query, "
                    "key.T)` in fp16 and rounds the scores to fp16 before `* scaling`, then "
                    "rounds the fp32 softmax to fp16 (`.to(query.dtype)`) before the fp16 "
                    "matmul with V. With |s| ≫ 88 an fp16 score carries an absolute error of "
                    "2^-11·|s| (≈ 0.1 at |s| = 200), which moves the probabilities: got "
                    "-0.24267578 vs -0.24849802 at (0, 0, 4, 3), max |err| 2.12e-2 > atol "
                    "3.87e-3 (329 of 6400 elements). fp32 and ordinary logits pass.")),
            },
        ),
        Binding(
            name="sdpa_attention_forward",
            contract="attention-kernel-v1",
            binds={"attention": f"{_M}:sdpa_attention"},
            dtypes=_FLOAT_EXTRA,  # SDPA computes float64 in float64, bfloat16 in its opmath
            zero_size={"hkv": "empty"},  # returns [1, 0, s, d]
            not_claimed={"FALSIFY-ATT-025": _INT_REFUSAL.format(
                how="RuntimeError 'expected scalar type Float but found Long'")},
            findings={
                "FALSIFY-ATT-036": Finding(
                    kind="deviation", repro="transformers_sdpa_attention_empty_batch.py",
                    evidence=(
                    "b = 0 (and s = 0, d = 0) crash instead of returning the empty result: "
                    "sdpa_attention_forward ends with `attn_output.reshape(attn_output.shape[0], "
                    "-1, q_length, value.shape[-1])`, and -1 cannot be inferred from 0 elements "
                    "(RuntimeError 'cannot reshape tensor of 0 elements into shape [0, -1, 1, "
                    "1]'); torch's own SDPA returns the empty tensor.")),
            },
        ),
        Binding(
            name='ACT2FN["silu"]',
            contract="swiglu-kernel-v1",
            binds={"silu": f"{_M}:act_silu", "swiglu": f"{_M}:llama_mlp_swiglu"},
            dtypes=_FLOAT_EXTRA,  # nn.functional.silu and the product in float64 / bfloat16
            errors=("NotImplementedError",),  # "silu_cpu" not implemented for 'Long'
            findings={
                "FALSIFY-SWG-001/float16": Finding(
                    kind="deviation", repro="transformers_llama_mlp_swiglu_fp16_double_rounding.py",
                    evidence=(
                    "LlamaMLP's `act_fn(gate) * up` rounds silu(gate) to fp16 (F.silu returns "
                    "the input dtype) and rounds the product again: two roundings where the "
                    "contract allows one after fp32 arithmetic. got -3.6953125 vs -3.69292319 "
                    "at (0, 0), |err| 2.39e-3 > rtol 4.9e-4·|ref|. silu alone (FALSIFY-SWG-006) "
                    "and all fp32 checks pass.")),
                "FALSIFY-SWG-002/float16": Finding(
                    kind="deviation", repro="transformers_llama_mlp_swiglu_fp16_double_rounding.py",
                    evidence=(
                    "as FALSIFY-SWG-001/float16 (silu rounded to fp16, then the product): got "
                    "-0.00175094604 vs -0.00175194646 at (0, 14); max |err| over the example "
                    "0.468 at a large |gate|·|up| (|gate| up to 1e4), beyond rtol 4.95e-4.")),
                "FALSIFY-SWG-003/float16": Finding(
                    kind="deviation", repro="transformers_llama_mlp_swiglu_fp16_double_rounding.py",
                    evidence=(
                    "d/dgate through autograd of `act_fn(gate) * up`: dy·up is rounded to fp16, "
                    "then silu's backward rounds again in fp16: got -0.31201172 vs -0.31220365 "
                    "at (1, 7), max |err| 3.67e-3 > rtol 4.9e-4·|ref| + atol 2.56e-5.")),
            },
        ),
        Binding(
            name='ACT2FN["gelu"/"gelu_pytorch_tanh"]',
            contract="gelu-kernel-v1",
            binds={"gelu": f"{_M}:act_gelu"},
            dtypes=_FLOAT_EXTRA,  # nn.functional.gelu computes float64 in float64
            errors=("NotImplementedError",),  # "GeluKernelImpl" not implemented for 'Long'
            findings={**_GELU_TANH_AD, "FALSIFY-GELU-001/float32": GELU_ERF32},
        ),
        Binding(
            name='ACT2FN["gelu"/"gelu_new"]',
            contract="gelu-kernel-v1",
            binds={"gelu": f"{_M}:act_gelu_new"},
            dtypes=_FLOAT_EXTRA,  # the formula's torch ops in float64 / bfloat16
            # the dtypes check calls the exact form (ACT2FN["gelu"]): NotImplementedError
            errors=("NotImplementedError",),
            findings={
                **_GELU_TANH_AD,
                "FALSIFY-GELU-001/float32": GELU_ERF32,  # its exact half is ACT2FN["gelu"]
                "FALSIFY-GELU-003/float16": Finding(
                    kind="deviation", repro="transformers_gelu_new_fp16.py",
                    evidence=(
                    "NewGELUActivation evaluates 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) "
                    "op by op in x's dtype: for fp16 each of ~8 operations rounds to fp16, and "
                    "1 + tanh u cancels for negative x. got -0.00915527 vs -0.00945107 at "
                    "(0, 0), 3% off; max |err| 2.04e-3 > rtol 4.89e-4 (885 of 3300 elements). "
                    "fp32 passes; gelu_pytorch_tanh (fp32 internally) passes in fp16.")),
                "FALSIFY-GELU-004/float16": Finding(
                    kind="deviation", repro="transformers_gelu_new_fp16.py",
                    evidence=(
                    "as FALSIFY-GELU-003/float16 (fp16 op-by-op evaluation): got -0.01258850 "
                    "vs -0.01234416 at (1, 40), |err| 2.44e-4 > rtol 4.89e-4·|ref| + atol 3e-7.")),
                "FALSIFY-GELU-006/float16": Finding(
                    kind="deviation", repro="transformers_gelu_new_fp16.py",
                    evidence=(
                    "the gradient is autograd through the same fp16 operations: got "
                    "-0.00797272 vs -0.00823109 at (0, 0), max |err| 3.88e-3 > rtol 4.88e-4 "
                    "(1118 of 3300 elements).")),
            },
        ),
        Binding(
            name='ACT2FN["gelu"/"gelu_fast"]',
            contract="gelu-kernel-v1",
            binds={"gelu": f"{_M}:act_gelu_fast"},
            dtypes=_FLOAT_EXTRA,  # the formula's torch ops in float64 / bfloat16
            # the dtypes check calls the exact form (ACT2FN["gelu"]): NotImplementedError
            errors=("NotImplementedError",),
            findings={
                "FALSIFY-GELU-001/float32": GELU_ERF32,  # its exact half is ACT2FN["gelu"]
                "FALSIFY-GELU-003/float16": Finding("deviation", (
                    "FastGELUActivation evaluates 0.5·x·(1 + tanh(x·0.7978845608·(1 + "
                    "0.044715·x²))) op by op in x's dtype: in fp16 every operation rounds, and "
                    "1 + tanh u cancels for negative x. got -0.0091552734375 vs -0.00945107348 "
                    "at (0, 0) (x = -2.678), 3 % off; max |err| 2.04e-3 > rtol 4.89e-4 (901 of "
                    "3300 elements). fp32 passes."), repro="transformers_gelu_fast.py"),
                "FALSIFY-GELU-004/float16": Finding("deviation", (
                    "as FALSIFY-GELU-003/float16 (fp16 op-by-op evaluation): got "
                    "-0.0125885009765625 vs -0.0123441568 at (1, 40), |err| 2.44e-4 > rtol "
                    "4.89e-4·|ref| + atol 3e-7 (1 of 82)."), repro="transformers_gelu_fast.py"),
                "FALSIFY-GELU-006/float16": Finding("deviation", (
                    "the gradient is autograd through the same fp16 operations: got "
                    "-0.007965087890625 vs -0.0082310901 at (0, 0), max |err| 3.88e-3 > rtol "
                    "4.88e-4 (1115 of 3300 elements)."), repro="transformers_gelu_fast.py"),
                "FALSIFY-GELU-020": Finding("deviation", (
                    "double backward: autograd of the fast formula differentiates 1 + tanh u, "
                    "which cancels for negative x: ∂S/∂x(0, 3) 3.36591e-4 vs central difference "
                    "3.36493e-4, |diff| 9.75e-8 > 7.36e-8 + 1.06e-8 (x = [1.0957, -1.8417, "
                    "-3.6722, -3.8678]). The exact form passes."),
                    repro="transformers_gelu_fast.py"),
                "FALSIFY-GELU-023": Finding("deviation", (
                    "forward mode through the same 1 + tanh u: Σ⟨dy, J·t⟩ = 0.00184568751 vs "
                    "0.00184557021, |diff| 1.17e-7 > 7.35e-8 (32·eps·Σ|g||t|). The exact form "
                    "passes."), repro="transformers_gelu_fast.py"),
            },
        ),
        Binding(
            name='ACT2FN["gelu_python"/"gelu_pytorch_tanh"]',
            contract="gelu-kernel-v1",
            binds={"gelu": f"{_M}:act_gelu_python"},
            dtypes=_FLOAT_EXTRA,  # the erf formula's torch ops in float64 / bfloat16
            errors=("NotImplementedError",),
            findings={
                **_GELU_TANH_AD,  # its tanh half is gelu_pytorch_tanh, bound above
                "FALSIFY-GELU-001/float16": Finding("deviation", (
                    "GELUActivation._gelu_python evaluates x·0.5·(1 + erf(x/√2)) op by op in "
                    "x's dtype: in fp16 the division, erf, the sum and the products each round, "
                    "and 1 + erf cancels for negative x. got -0.00980377197 vs -0.00992394793 "
                    "at (0, 0) (x = -2.678), 1.2 % off (15.8 fp16 ulps); max |err| 1.87e-3 > "
                    "rtol 4.89e-4 (887 of 3300 elements). fp32 passes; ACT2FN[\"gelu\"] (fp32 "
                    "inside) passes in fp16."), repro="transformers_gelu_python_fp16.py"),
                "FALSIFY-GELU-005/float16": Finding("deviation", (
                    "the gradient is autograd through the same fp16 operations: got "
                    "-0.00823211670 vs -0.00822024774 at (0, 0), max |err| 2.42e-3 > rtol "
                    "4.88e-4 (784 of 3300 elements)."), repro="transformers_gelu_python_fp16.py"),
                "FALSIFY-GELU-002/float16": Finding("deviation", (
                    "the same fp16 erf formula at the wide input (fresh seed 2533420250): x = "
                    "-2, got -0.04541015625 vs -0.04550026390, |err| 9.0e-5 > rtol 4.89e-4·|ref| "
                    "+ atol 1.0e-6; arbiter (long double): 2.95 fp16 ulps off, the reference "
                    "6.5e-18."), repro="transformers_gelu_python_fp16.py"),
                "FALSIFY-GELU-015": Finding("variant", (
                    "int64 x is accepted and returned as float32 [4, 128]: x / math.sqrt(2.0) "
                    "promotes the integers to float32 and the erf form is evaluated there (x = "
                    "[1, -2, 3] gives [0.8413, -0.0455, 2.9960], the float32 GELU), not "
                    "refused with an error naming the dtype."),
                    variant="integer input promoted to float32"),
            },
        ),
        Binding(
            name="T5LayerNorm",
            contract="rmsnorm-kernel-v1",
            binds={"rmsnorm": f"{_M}:t5_layer_norm"},
            dtypes=_FLOAT_EXTRA,  # float64 comes back float64 (x promoted by the fp32 rsqrt)
            zero_size={"n": "empty"},
            not_claimed={
                "FALSIFY-RN-021": _JVP,
                "FALSIFY-RN-008": (
                    "saved-tensor probe: T5LayerNorm is a chain of torch ops and autograd keeps "
                    "what they need (490 extra elements for 5×96 in fp32, 970 in fp16); "
                    "transformers promises no recomputing backward"),
            },
            findings={
                "FALSIFY-RN-015": Finding("variant", (
                    "int64 x is accepted and returned as float32 [4, 128]: the fp32 rsqrt of "
                    "the variance promotes `hidden_states * rsqrt(...)` to float32 (x = [4, -3, "
                    "2, 0, -2], w = 1 gives [1.5570, -1.1677, 0.7785, 0, -0.7785], the float32 "
                    "normalization), not refused with an error naming the dtype."),
                    variant="integer input promoted to float32"),
                "FALSIFY-RN-001/float16": Finding("deviation", _T5_FP16.format(
                    what="got 0.6669921875 vs 0.66749877 at (0, 719), max |err| 1.81e-3 > rtol "
                         "7.35e-4 (51 of 12297 elements), 1.04 fp16 ulps off"),
                    repro="transformers_t5_layernorm_fp16.py"),
                "FALSIFY-RN-002/float16": Finding("deviation", _T5_FP16.format(
                    what="got 1.62890625 vs 1.62984678 at (0, 7), max |err| 1.48e-3 > rtol "
                         "4.95e-4 (19 of 194), 0.96 fp16 ulps off"),
                    repro="transformers_t5_layernorm_fp16.py"),
                "FALSIFY-RN-006/float16": Finding("deviation", _T5_FP16.format(
                    what="d/dx (autograd through the same ops): got 0.6611328125 vs 0.66156894 "
                         "at (0, 51), max |err| 1.03e-3 > atol 7.54e-5 + rtol 4.88e-4·|ref| (9 "
                         "of 201), 0.89 fp16 ulps off"),
                    repro="transformers_t5_layernorm_fp16.py"),
                "FALSIFY-RN-024/float16": Finding("deviation", (
                    "compiled vs eager d/dw differ: 0.5126953125 (compiled) vs 0.51171875 "
                    "(eager) at (16,), max |err| 3.91e-3 > atol 4.74e-4 + rtol 9.77e-4 (2 of "
                    "64). Eager autograd forms dw from the fp16-rounded normalized rows "
                    "(`self.weight * hidden_states.to(self.weight.dtype)`) and reduces fp16 "
                    "products; Inductor fuses the cast and the reduction and keeps fp32. fp32 "
                    "passes."), repro="transformers_t5_layernorm_compile.py"),
            },
        ),
        Binding(
            name="Olmo2RMSNorm",
            contract="rmsnorm-kernel-v1",
            binds={"rmsnorm": f"{_M}:olmo2_rmsnorm"},
            dtypes=_FLOAT_EXTRA,  # float64 comes back float64 (normalized in fp32)
            zero_size={"n": "empty"},
            not_claimed={
                "FALSIFY-RN-021": _JVP,
                "FALSIFY-RN-008": (
                    "saved-tensor probe: Olmo2RMSNorm is a chain of torch ops and autograd keeps "
                    "what they need (490 extra elements for 5×96 in fp32, 1450 in fp16: an fp32 "
                    "copy of x); transformers promises no recomputing backward"),
            },
            findings={
                "FALSIFY-RN-015": Finding("deviation", (
                    "integer x is accepted and returned truncated: Olmo2RMSNorm.forward casts x "
                    "to fp32, normalizes, multiplies by the weight and casts back with "
                    "`.to(input_dtype)`: x = [4, -3, 2, 0, -2] int64 with w = 1 gives [1, -1, "
                    "0, 0, 0] (int64 [4, 128] in the run), without an error."),
                    repro="transformers_olmo2_rmsnorm_integer.py"),
            },
        ),
        Binding(
            name="ForCausalLMLoss",
            contract="cross-entropy-kernel-v1",
            binds={"cross_entropy": f"{_M}:causal_lm_loss",
                   "cross_entropy_grad": f"{_M}:causal_lm_loss_grad"},
            variant="plain-mean",  # mean of plain CE: judged at ζ = 0, ε = 0, mean
            dtypes=_FLOAT_EXTRA,  # float64 logits: a float32 loss (`logits.float()`)
            errors=("NotImplementedError",),
            not_claimed={
                "FALSIFY-CE-027": _JVP,
                "FALSIFY-CE-028": (
                    "size 0: T = 0 and the strided and transposed views agree with the "
                    "reference, but V = 0 is refused with RuntimeError \"cannot reshape tensor "
                    "of 0 elements into shape [-1, 0]\" (`logits.view(-1, vocab_size)`), not "
                    "the ValueError naming V the contract's rule states"),
            },
            findings={
                "FALSIFY-CE-013": Finding("variant", (
                    "the probe compares with F.cross_entropy over its own 18 cases, every "
                    "reduction and ε ∈ {0, 0.1}; ForCausalLMLoss computes only the mean (or sum "
                    "/ num_items_in_batch) with no label smoothing (fixed_cross_entropy; its "
                    "**kwargs swallow the rest), so the first case, reduction 'none', is refused "
                    "(NotImplementedError from the adapter, which computes nothing itself)."),
                    variant=_CE_ONLY),
            },
        ),
        Binding(name="get_cosine_schedule_with_warmup", contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{_M}:cosine_schedule"},
                variant="to-zero",  # no lr_min: judged at lr_min = 0
                findings={
                    "FALSIFY-LRS-001": Finding("variant", (
                        "W = 0, T = 1, lr_min 0, step 86: got 3e-4, reference 0: "
                        + _LRS_RISES_WHY + "."), variant=_LRS_RISES),
                    "FALSIFY-LRS-006": Finding("variant", (
                        "W = 500, T = 5016, lr_max 1, lr_min 0: warmup and decay monotone, "
                        "y[W] = lr_max, but y[T + 1] > 0: " + _LRS_RISES_WHY + "."),
                        variant=_LRS_RISES),
                    **{c: Finding("variant", f"{first}: " + _LRS_RISES_WHY + ".",
                                  variant=_LRS_RISES) for c, first in (
                        ("FALSIFY-LRS-002", "W = 0, T = 1, lr_max 3e-4, steps 0 … 6: got 3e-4 "
                                            "at steps 2, 4, 6, reference 0"),
                        ("FALSIFY-LRS-005", "W = 0, T = 1, steps 0 … 6: y[T:] == lr_min = 0 "
                                            "fails, the cosine rises again past T"),
                        ("FALSIFY-LRS-013", "a strided step view [86] (W = 0, T = 1): got 3e-4, "
                                            "reference 0"))},
                }),
        Binding(name="get_cosine_with_min_lr_schedule_with_warmup",
                contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{_M}:cosine_min_lr_schedule"},
                findings={
                    "FALSIFY-LRS-001": Finding("variant", (
                        "W = 0, T = 1, lr_min 0, step 86: got 3e-4, reference 0: "
                        + _LRS_RISES_WHY + "."), variant=_LRS_RISES),
                    "FALSIFY-LRS-002": Finding("variant", (
                        "W = 0, T = 1, lr_min 0, steps 0 … 6: got 3e-4 at steps 2, 4, 6, "
                        "reference 0 (3 of 7): " + _LRS_RISES_WHY + "."), variant=_LRS_RISES),
                    "FALSIFY-LRS-005": Finding("variant", (
                        "W = 0, T = 1: y[T:] = [0, 3e-4, 0, …], not lr_min from T on: "
                        + _LRS_RISES_WHY + "."), variant=_LRS_RISES),
                    "FALSIFY-LRS-006": Finding("variant", (
                        "W = 500, T = 5016, lr_max 1, lr_min 0: y[T + 1] > 0 = lr_min: "
                        + _LRS_RISES_WHY + "."), variant=_LRS_RISES),
                    "FALSIFY-LRS-007": Finding("deviation", (
                        "W = 59, T = 60, lr 3e-4, min_lr 3e-5: lr(60) = 2.9999999999999997e-05 "
                        "< min_lr: the function converts min_lr to min_lr_rate = min_lr / lr "
                        "and the LambdaLR multiplies it back, lr·min_lr_rate, one ulp below "
                        "the \"minimum learning rate to reach\" it documents."),
                        repro="transformers_cosine_min_lr_floor.py"),
                    "FALSIFY-LRS-013": Finding("variant", (
                        "stepped view, W = 0, T = 1, step 86: got 3e-4, reference lr_min 3e-5: "
                        + _LRS_RISES_WHY + "; n = 0 and the other views agree."),
                        variant=_LRS_RISES),
                }),
        Binding(name="get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
                contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{_M}:cosine_min_lr_rate_schedule"},
                findings={
                    **{c: Finding("variant", f"{first}: " + _LRS_ONE_BASED_WHY + ".",
                                  variant=_LRS_ONE_BASED) for c, first in (
                        ("FALSIFY-LRS-001", "W = 0, T = 576, lr_min 0, step 575: got 0.0 "
                                            "(the floor), reference 2.23e-9"),
                        ("FALSIFY-LRS-002", "W = 0, T = 1, steps 0 … 6: got 0.0 at step 0, "
                                            "reference lr_max 3e-4 (4 of 7)"),
                        ("FALSIFY-LRS-003", "W = 0, T = 1: y[W] = 0, not lr_max"),
                        ("FALSIFY-LRS-004", "W = 2000, lr(43) = 3e-4·44/2000 = 6.6e-6, not "
                                            "6.45e-6"),
                        ("FALSIFY-LRS-005", "W = 0, T = 1: y[0] = 0 ≠ lr_max"),
                        ("FALSIFY-LRS-006", "W = 500, T = 5016: y[W] < lr_max (the peak is "
                                            "at W − 1)"),
                        ("FALSIFY-LRS-008", "W = 7, T = 97, lr_max 1: lr(W + k) + lr(T − k) "
                                            "≠ 1 at 89 positions (the pairs are one step "
                                            "off)"),
                        ("FALSIFY-LRS-013", "stepped view, W = 0, T = 1, step 0: got 3e-5 "
                                            "(the floor), reference 3e-4"))},
                    "FALSIFY-LRS-007": Finding("deviation", (
                        "W = 59, T = 60, lr 3e-4, min_lr 3e-5: lr(59) = 2.9999999999999997e-05 "
                        "< min_lr: min_lr_rate = min_lr / lr multiplied back by the LambdaLR, "
                        "one ulp below min_lr (as get_cosine_with_min_lr_schedule_with_warmup; "
                        "the floor comes a step early, " + _LRS_ONE_BASED + ")."),
                        repro="transformers_cosine_min_lr_floor.py"),
                }),
        Binding(name="get_cosine_with_hard_restarts_schedule_with_warmup(num_cycles=1)",
                contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{_M}:cosine_hard_restarts_schedule"},
                variant="to-zero"),  # no lr_min: judged at lr_min = 0
        Binding(name='get_wsd_schedule(decay_type="cosine")', contract="lr-schedule-kernel-v1",
                binds={"lr_at": f"{_M}:wsd_schedule"},
                findings={c: Finding("variant", f"{first}: " + _LRS_WSD + ".",
                                     variant=_LRS_RATIO) for c, first in (
                    ("FALSIFY-LRS-001", "W = 1, T = 2, lr_min 3e-5, step 0: got "
                                        "2.9999999999999997e-05, reference 0"),
                    ("FALSIFY-LRS-002", "W = 59, T = 60, lr_min 3e-5: 59 of 66 differ, "
                                        "lr(0) = 2.9999999999999997e-05 vs 0 (the warmup "
                                        "rises from the floor)"),
                    ("FALSIFY-LRS-004", "W = 2000, lr_min 3e-5: lr(43) = 3e-5 + (3e-4 − "
                                        "3e-5)·43/2000 = 3.58e-5, not 6.45e-6"),
                    ("FALSIFY-LRS-005", "W = 59, T = 60: y[0] = 3e-5·(1 − ε) ≠ 0"),
                    ("FALSIFY-LRS-006", "W = 0, T = 1, lr_min 3e-5: y[T:] = "
                                        "2.9999999999999997e-05 ≠ lr_min"),
                    ("FALSIFY-LRS-007", "W = 59, T = 60, lr_min 3e-5: y[T] = "
                                        "2.9999999999999997e-05 < lr_min"),
                    ("FALSIFY-LRS-013", "stepped view, W = 1, T = 2, step 0: got "
                                        "2.9999999999999997e-05, reference 0"))}),
    ),
)
