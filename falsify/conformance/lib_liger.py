"""Liger-Kernel (PyPI `liger-kernel`, 0.8.x): its Triton kernels and chunked losses against the
kernel contracts they implement. Without a GPU its Triton kernels run under the Triton
interpreter (falsify sets TRITON_INTERPRET=1), which is slow: keep examples few.

Bound:
- `LigerRMSNormFunction` -> rmsnorm-kernel-v1, twice: `casting_mode="llama"` (LigerRMSNorm's
  default for Llama: normalize in fp32, round to x's dtype, multiply by w) and
  `casting_mode="gemma"` with offset 0 (everything in fp32, one rounding). `in_place=False`:
  the default `True` writes dX over the upstream gradient dY, which the caller may still hold.
  Both need a GPU: under the interpreter the kernel's `eps.to(tl.float32)` fails on a Python
  float;
- `LigerRopeFunction` -> rope-kernel-v1 (`rope`). Liger ships no angle table (its
  `liger_rotary_pos_emb` replaces transformers' `apply_rotary_pos_emb` and takes the model's
  cos/sin): the binding takes transformers' `LlamaRotaryEmbedding` table, as in a patched
  Llama, so the table's findings are transformers' (our own table would put our arithmetic
  into the cell). Layout is rotate-half, as the contract; Liger reads q as
  [B, H, S, D], so the contract's [B, S, H, D] is passed transposed (a view, as a Llama
  attention passes q) and the result transposed back. Liger rotates that buffer in place;
- `LigerSiLUMulFunction` -> swiglu-kernel-v1 (`swiglu`; there is no standalone SiLU). Needs a
  GPU for the same interpreter reason (`gate_multiplier.to(tl.float32)`);
- `LigerCrossEntropyFunction` -> cross-entropy-kernel-v1 (`cross_entropy` and, through its
  backward, `cross_entropy_grad`); `lse_square_scale` is the contract's z-loss coefficient;
- `LigerFusedLinearCrossEntropyFunction` -> fused-linear-cross-entropy-kernel-v1; Liger picks
  its own chunking (the contract's `chunk_size` is not a parameter of it);
- `chunked_loss.LigerFusedLinearJSDFunction` with `beta=0` (its forward-KL case,
  KL(teacher ‖ student)) -> fused-linear-kd-kernel-v1 (`fused_linear_kd`). The contract's
  teacher is given as logits; Liger takes teacher hidden states and weight and multiplies them,
  so the adapter passes the logits with an identity weight (x·Iᵀ is exact: one nonzero
  product per sum). Liger's loss is `weight_hard_loss·CE + weight_soft_loss·KL` with no
  temperature factor, so the contract's (α, T) map to (1 − α, α·T²) (Hinton's T² is the
  caller's choice in Liger). `compiled=False`: Liger otherwise wraps each chunk in
  torch.compile, which only adds compile time here;
- `chunked_loss.LigerFusedLinearDPOFunction.preference_loss_fn` (loss_type "sigmoid") ->
  dpo-loss-kernel-v1: the loss on summed log-probs that Liger's fused DPO applies after its
  own linear layer and log-softmax (the public class takes hidden states, not log-probs);
- `chunked_loss.LigerFusedLinearGRPOFunction.ppo_loss_fn` (loss_type "dapo", token level) ->
  grpo-loss-kernel-v1 (`grpo_loss`): likewise the loss on per-token log-probs inside Liger's
  fused GRPO. The Triton `GrpoLossFunction` takes logits and completion ids and computes the
  log-probs itself, so it does not fit the contract's signature.

Not bound: GeGLU (`LigerGELUMulFunction`: gelu-kernel-v1 has no gated equation), the KL/JSD
ops on log-probs (kd-loss-kernel-v1 takes logits with a temperature and a CE term), and
group advantages (Liger has none).
"""

from __future__ import annotations

import torch

from falsify.conformance.registry import Binding, Finding, Library, into

_into = into  # the shared out= helper (registry.into)


def _grad_leaf(t):
    """A fresh leaf with t's values for torch.autograd.grad (the one copy an adapter makes)."""
    return t.detach().clone().requires_grad_(True)


# ---------------------------------------------------------------- rmsnorm-kernel-v1
def _rms_norm(x, w, eps, casting_mode):
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    return LigerRMSNormFunction.apply(x, w, eps, 0.0, casting_mode, False)


def rms_norm_llama(x, w, eps, out=None):
    """LigerRMSNormFunction(x, w, eps, offset=0, casting_mode="llama", in_place=False)."""
    return _into(out, _rms_norm(x, w, eps, "llama"))


def rms_norm_gemma(x, w, eps, out=None):
    """LigerRMSNormFunction(x, w, eps, offset=0, casting_mode="gemma", in_place=False)."""
    return _into(out, _rms_norm(x, w, eps, "gemma"))


# ---------------------------------------------------------------- rope-kernel-v1
def _liger_rope(x, cos, sin, rotary_dim=None):
    from liger_kernel.ops.rope import LigerRopeFunction

    q = x.transpose(1, 2)  # [B, H, S, D], a view of x, as a Llama attention passes q
    y, _ = LigerRopeFunction.apply(q, q[:, :1], cos, sin, None, 1, rotary_dim)  # k: unused
    return y.transpose(1, 2)


def rope(x, pos, theta, out=None):
    """LigerRopeFunction(q, k, cos, sin) on x [B, S, H, D] (passed as q [B, H, S, D]), with
    transformers' LlamaRotaryEmbedding table (fp32 angles, cos/sin in x's dtype): what a
    Liger-patched Llama computes."""
    from falsify.conformance.lib_transformers import llama_rope_table

    cos, sin = llama_rope_table(x, pos, theta)
    return _into(out, _liger_rope(x, cos, sin))


# ---------------------------------------------------------------- swiglu-kernel-v1
def swiglu(gate, up, out=None):
    """LigerSiLUMulFunction(gate, up): silu(gate)·up."""
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return _into(out, LigerSiLUMulFunction.apply(gate, up))


# ---------------------------------------------------------------- cross-entropy-kernel-v1
def cross_entropy(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                  label_smoothing=0.0):
    """LigerCrossEntropyFunction: no class weights, no softcap; the first of four results."""
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    loss, _z, _acc, _pred = LigerCrossEntropyFunction.apply(
        logits, labels, None, ignore_index, float(z_loss), float(label_smoothing), reduction,
        None, False, False, False)
    return loss


def cross_entropy_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                       label_smoothing=0.0):
    """∂(reduced loss)/∂logits through Liger's backward, dy = 1 (ones for "none")."""
    z = _grad_leaf(logits)
    loss = cross_entropy(z, labels, ignore_index, reduction, z_loss, label_smoothing)
    (g,) = torch.autograd.grad(loss, [z], grad_outputs=torch.ones_like(loss))
    return g


# ------------------------------------------------- fused-linear-cross-entropy-kernel-v1
def fused_linear_cross_entropy(x, weight, labels, ignore_index=-100, reduction="mean",
                               z_loss=0.0, label_smoothing=0.0, chunk_size=None):
    """LigerFusedLinearCrossEntropyFunction(x, W, labels): no bias, class weights or softcap;
    the first of its four results. `chunk_size` has no Liger counterpart (it sizes its own
    chunks from V and H) and is not passed."""
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    loss, _z, _acc, _pred = LigerFusedLinearCrossEntropyFunction.apply(
        x, weight, labels, None, None, ignore_index, float(z_loss), float(label_smoothing),
        reduction)
    return loss


# ---------------------------------------------------------------- fused-linear-kd-kernel-v1
def fused_linear_kd(x, weight, teacher_logits, labels, temperature, alpha, ignore_index=-100,
                    chunk_size=None):
    """LigerFusedLinearJSDFunction(beta=0): (loss, soft = mean KL, hard = mean CE), with the
    teacher's logits as teacher_input and an identity teacher weight."""
    from liger_kernel.chunked_loss.jsd_loss import LigerFusedLinearJSDFunction

    eye = torch.eye(teacher_logits.shape[-1], dtype=teacher_logits.dtype,
                    device=teacher_logits.device)
    loss, kl, ce = LigerFusedLinearJSDFunction.apply(
        x, weight, teacher_logits, eye, labels, None, None,
        1.0 - alpha, alpha * temperature ** 2, 0.0, ignore_index, temperature, False,
        1024 if chunk_size is None else chunk_size, True)
    return loss, kl, ce


# ---------------------------------------------------------------- dpo-loss-kernel-v1
def dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    """LigerFusedLinearDPOFunction.preference_loss_fn(..., loss_type="sigmoid"): (loss,
    chosen rewards, rejected rewards). Its `full_target` is the concatenated chosen + rejected
    batch, of which it reads only the length (2B: it divides by the number of pairs)."""
    from liger_kernel.chunked_loss.dpo_loss import LigerFusedLinearDPOFunction

    full_target = policy_chosen_logps.new_empty((2 * policy_chosen_logps.shape[0],))
    return LigerFusedLinearDPOFunction.preference_loss_fn(
        policy_chosen_logps, policy_rejected_logps, full_target, ref_chosen_logps,
        ref_rejected_logps, beta=beta, loss_type="sigmoid")


def dpo_grad(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
             beta):
    """(∂loss/∂π_c, ∂loss/∂π_r) through autograd of Liger's loss, dy = 1."""
    pc, pr = _grad_leaf(policy_chosen_logps), _grad_leaf(policy_rejected_logps)
    loss = dpo_loss(pc, pr, ref_chosen_logps, ref_rejected_logps, beta)[0]
    return torch.autograd.grad(loss, [pc, pr])


# ---------------------------------------------------------------- grpo-loss-kernel-v1
def grpo_loss(logp, old_logp, ref_logp, advantages, mask, clip_eps, beta):
    """LigerFusedLinearGRPOFunction.ppo_loss_fn(loss_type="dapo", token-level importance
    sampling, ε_low = ε_high = clip_eps): Σ mask·per-token loss / Σ mask on one process."""
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

    loss, _metrics = LigerFusedLinearGRPOFunction.ppo_loss_fn(
        logp, mask, advantages, mask, ref_per_token_logps=ref_logp, old_per_token_logps=old_logp,
        epsilon_low=clip_eps, epsilon_high=clip_eps, beta=beta, loss_type="dapo")
    return loss


_M = "falsify.conformance.lib_liger"

_NEEDS_GPU = ("under the Triton interpreter a Python-float kernel argument stays a Python float, "
              "so the kernel's `{arg}.to(tl.float32)` raises AttributeError; a GPU launch passes "
              "it as an fp32 scalar")
_COMPILE = ("torch.compile cannot trace a Triton kernel run by the interpreter (Dynamo fails on "
            "the interpreter's pointer arithmetic, KeyError(torch.uint64)); on a GPU it is a "
            "compiled Triton launch, which this check cannot reach without one")
_EMPTY_MEAN = Finding(
    "variant",
    "{where}: with no counted token Liger returns 0.0 where the contract (and torch) define "
    "the mean over nothing as NaN (0/0); got 0.0 vs NaN. {cause} A loop that skips NaN losses "
    "would take a zero-loss step instead.",
    variant="empty mean = 0 (normalizer clamped to ≥ 1)")


def _empty_mean(where, cause):
    return Finding(_EMPTY_MEAN.kind, _EMPTY_MEAN.evidence.format(where=where, cause=cause),
                   _EMPTY_MEAN.variant)


_IN_PLACE = (
    "LigerRopeFunction rotates q in place: rope_forward transposes q back to [B, S, H, D], "
    "`.contiguous()` is then a no-op for the [B, H, S, D] view of a [B, S, H, D] buffer (how a "
    "Llama attention passes q, and how the adapter passes x), and _triton_rope stores into it; "
    "the result is x's own storage. {what}")
_HF_TABLE = (
    "The table is transformers' LlamaRotaryEmbedding (fp32 angles pos·inv_freq, cast to x's "
    "dtype), which Liger's kernel takes as given; its rotation runs in the table's dtype (fp16 "
    "for fp16 x). Same values as the transformers apply_rotary_pos_emb binding: {what} With the "
    "contract's table (the fp32-table binding) this check passes.")
_ROPE_SHARED = {
    "FALSIFY-ROPE-009": Finding(
        kind="deviation", repro="liger_rope_in_place.py",
        evidence=_IN_PLACE.format(
        what="Run twice on the same tensor, the second call rotates the already rotated x: "
             "x = [0.846713, -3.414606], pos 668, theta 5e5 gives 2.79075837 then -3.07954597 "
             "(fp32; fp16 2.7910 then -3.0801).")),
    "FALSIFY-ROPE-003": Finding(
        kind="deviation", repro="liger_rope_in_place.py",
        evidence=_IN_PLACE.format(
        what="The relative-position check calls rope twice on x (positions pos and pos + c); "
             "the second call sees the rotated x, so ⟨R_m q, R_n k⟩ changes at 54-60 of the "
             "(s, t) pairs, fp32 and fp16.")),
    "FALSIFY-ROPE-014": Finding(
        kind="deviation", repro="liger_rope_double_backward.py",
        evidence=(
        "LigerRopeFunction.backward (not once_differentiable) rotates dq in place with the "
        "Triton kernel, so under create_graph the second derivative is not the rotation of v: "
        "∂S/∂dy(0, 0, 0, 0) 0.10169893 vs central difference 0.07811702 (|diff| 2.36e-2 > "
        "4.49e-6); a silent wrong value instead of a refusal.")),
}
_ROPE_SHARED.update({
    "FALSIFY-ROPE-018": Finding(
        kind="deviation", repro="liger_rope_zero_heads.py",
        evidence=(
        "h = 0 crashes instead of returning the empty result: rope_forward launches _triton_rope "
        "with pad_n_q_head = next_power_of_2(0) and `tl.arange(0, 0)` raises (InterpreterError "
        "ValueError \"arange's end argument must be greater than the start argument\"); b, s = 0 "
        "return empty results.")),
    "FALSIFY-ROPE-011": Finding(
        kind="deviation", repro="liger_rope_integer_input.py",
        evidence=(
        "integer x is accepted and returned as integers: the kernel loads x, rotates in the "
        "table's dtype and stores into x's own int64 buffer (truncating), with no error.")),
})
_FLOAT_EXTRA = ("float64", "bfloat16")  # each called: a result of that dtype comes back
_LEAF = ("the contract's gradient equation needs a leaf that requires grad, which autograd "
         "refuses for integer tensors (RuntimeError 'only Tensors of floating point dtype can "
         "require gradients') before Liger is called; Liger makes no dtype-refusal promise")

LIBRARY = Library(
    name="liger",
    distribution="liger-kernel",
    bindings=(
        Binding(
            name='LigerRMSNormFunction(casting_mode="llama")',
            contract="rmsnorm-kernel-v1",
            binds={"rmsnorm": f"{_M}:rms_norm_llama"},
            needs_gpu=_NEEDS_GPU.format(arg="eps"),
        ),
        Binding(
            name='LigerRMSNormFunction(casting_mode="gemma")',
            contract="rmsnorm-kernel-v1",
            binds={"rmsnorm": f"{_M}:rms_norm_gemma"},
            needs_gpu=_NEEDS_GPU.format(arg="eps"),
        ),
        Binding(
            name="LigerRopeFunction (transformers table)",
            contract="rope-kernel-v1",
            binds={"rope": f"{_M}:rope"},
            dtypes=_FLOAT_EXTRA,  # float64 / bfloat16 in, the same out
            not_claimed={"FALSIFY-ROPE-019": _COMPILE},
            findings={
                **_ROPE_SHARED,
                "FALSIFY-ROPE-001": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_HF_TABLE.format(
                    what="theta 5e5, pos up to 7583: fp32 -3.50091934 vs -3.50092783 (max "
                         "|err| 2.84e-4 > atol 1.97e-6), fp16 -0.67578125 vs -0.67647269 (max "
                         "|err| 4.19e-3).")),
                "FALSIFY-ROPE-005": Finding(
                    kind="deviation", repro="transformers_llama_rope_fp32_angles.py",
                    evidence=_HF_TABLE.format(
                    what="d/dx fp32 0.48819277 vs 0.48819413 (max |err| 9.38e-5 > atol "
                         "1.09e-6), fp16 0.20703125 vs 0.20733975.")),
            },
        ),
        Binding(
            name="LigerSiLUMulFunction",
            contract="swiglu-kernel-v1",
            binds={"swiglu": f"{_M}:swiglu"},
            needs_gpu=_NEEDS_GPU.format(arg="gate_multiplier"),
        ),
        Binding(
            name="LigerCrossEntropyFunction",
            contract="cross-entropy-kernel-v1",
            binds={"cross_entropy": f"{_M}:cross_entropy",
                   "cross_entropy_grad": f"{_M}:cross_entropy_grad"},
            dtypes=_FLOAT_EXTRA,  # float64 computed in float64 (interpreter); bfloat16 returned
            not_claimed={"FALSIFY-CE-029": _COMPILE, "FALSIFY-CE-023": _LEAF},
            findings={
                "FALSIFY-CE-028": Finding(
                    kind="deviation", repro="liger_cross_entropy_empty_batch.py",
                    evidence=(
                    "T = 0 crashes where the contract asks for an empty result: torch's "
                    "RuntimeError 'max(): Expected reduction dim to be specified for "
                    "input.numel() == 0', from a reduction over the empty batch in "
                    "cross_entropy_forward.")),
                "FALSIFY-CE-022": Finding(
                    kind="deviation", repro="liger_cross_entropy_integer_logits.py",
                    evidence=(
                    "integer logits are accepted and an integer loss comes back (int64 in, "
                    "int64 out): the Triton kernel computes and stores the loss into a buffer "
                    "of the logits' dtype, with no error.")),
                "FALSIFY-CE-002": _empty_mean(
                    "every label ignore_index, reduction 'mean' (T = 1, V = 5, ε = 0.1)",
                    "liger_cross_entropy divides by n_non_ignore clamped to ≥ 1."),
                "FALSIFY-CE-025": Finding(
                    kind="deviation", repro="liger_cross_entropy_double_backward.py",
                    evidence=(
                    "Liger computes ∂loss/∂logits in its forward and hands it back as a constant "
                    "(scaled by grad_output), so differentiating the backward again gives 0: "
                    "∂S/∂logits(2, 0) 0.0 vs central difference of the reference backward "
                    "-0.00658768 (T = 3, V = 7, reduction 'none', z-loss 1e-4, ε = 0.1); a "
                    "silent zero where the contract asks for the Hessian-vector product or a "
                    "refusal.")),
            },
        ),
        Binding(
            name="LigerFusedLinearCrossEntropyFunction",
            contract="fused-linear-cross-entropy-kernel-v1",
            binds={"fused_linear_cross_entropy": f"{_M}:fused_linear_cross_entropy"},
            not_claimed={"FALSIFY-FLCE-015": _COMPILE},
            findings={
                "FALSIFY-FLCE-014": Finding(
                    kind="deviation", repro="liger_fused_linear_cross_entropy_empty.py",
                    evidence=(
                    "T = 0 (and H = 0) crash with ZeroDivisionError where the contract asks for "
                    "an empty result: fused_linear_cross_entropy_forward sizes its chunks with "
                    "triton.cdiv(V, chunk_mem_const·H) and triton.cdiv(T, chunk_size), which "
                    "divide by zero.")),
                "FALSIFY-FLCE-002": _empty_mean(
                    "every label ignored, reduction 'mean' (T = 1, z-loss 1e-4, ε = 0.1)",
                    "The fused loss divides by the non-ignored count clamped to ≥ 1."),
                "FALSIFY-FLCE-008": Finding(
                    kind="deviation", repro="liger_fused_linear_cross_entropy_dtype.py",
                    evidence=(
                    "float64 x and W are accepted and the loss comes back float32 "
                    "(float32[37] for reduction 'none'): Liger allocates its per-token loss "
                    "buffer in fp32 whatever the input dtype, so float64 is neither refused nor "
                    "kept (fp16 input also returns an fp32 loss, where the contract states the "
                    "input dtype).")),
                "FALSIFY-FLCE-010": Finding(
                    kind="deviation", repro="liger_fused_linear_cross_entropy_double_backward.py",
                    evidence=(
                    "the gradients are computed in the forward and returned by the backward as "
                    "constants scaled by grad_output, without once_differentiable: under "
                    "create_graph=True they carry no graph, so every second derivative would "
                    "silently be zero instead of refused.")),
            },
        ),
        Binding(
            name="LigerFusedLinearJSDFunction(beta=0)",
            contract="fused-linear-kd-kernel-v1",
            binds={"fused_linear_kd": f"{_M}:fused_linear_kd"},
            not_claimed={
                "FALSIFY-FLKD-005": (
                    "memory probe: Liger's chunked distillation materialises each chunk's "
                    "student and teacher logits (torch.chunk into max(1, N // chunk_size) "
                    "chunks), and the contract's logits-form teacher costs this binding a V×V "
                    "identity teacher weight that a Liger user (teacher hidden states and "
                    "weight) does not have; the measured peak is not Liger's"),
                "FALSIFY-FLKD-024": (
                    "Liger's chunked losses compile their own per-chunk step (compiled=True) and "
                    "are not traceable from an enclosing torch.compile: Dynamo raises "
                    "AsPythonConstantNotImplementedError on `super().forward` in "
                    "LigerFusedLinearJSDFunction.forward (chunked_loss/jsd_loss.py)"),
            },
            findings={
                "FALSIFY-FLKD-001": _empty_mean(
                    "every label ignored (fp32 and fp16)",
                    "LigerFusedLinearDistillationBase._compute_loss divides both terms by "
                    "`num_valid_tokens.clamp_min(1)`."),
                "FALSIFY-FLKD-022": _empty_mean(
                    "N = 0 (no token at all)",
                    "The same clamp_min(1) in _compute_loss; the contract's size-0 rule is the "
                    "empty result, i.e. the NaN mean."),
                "FALSIFY-FLKD-002": Finding(
                    kind="deviation", repro="liger_fused_linear_jsd_logged_terms_grad.py",
                    evidence=(
                    "with return_soft_hard_loss=True the soft (KL) and hard (CE) losses are "
                    "outputs of the autograd Function and carry a graph, but its backward "
                    "ignores their upstream gradients (`backward(ctx, grad_output, *args)`): a "
                    "loss that uses the logged KL or CE silently gets no gradient from them.")),
                "FALSIFY-FLKD-004": Finding(
                    kind="deviation", repro="liger_fused_linear_jsd_logged_terms_grad.py",
                    evidence=(
                    "as FALSIFY-FLKD-002: graph_on_logged_terms = 4 (KL and CE, fp32 and fp16) "
                    "where the contract requires the logged terms without a graph; the teacher "
                    "gets no gradient and x, W get theirs (teacher_grads = 0, "
                    "student_without_grad = 0).")),
                "FALSIFY-FLKD-018": Finding(
                    kind="deviation", repro="liger_fused_linear_jsd_double_backward.py",
                    evidence=(
                    "the gradients are computed in the forward (torch.func.grad_and_value per "
                    "chunk) and the backward returns them times grad_output, without "
                    "once_differentiable: a double backward returns values (only the ∂/∂dy "
                    "part; the Hessian through x and W is silently 0) instead of refusing.")),
                "FALSIFY-FLKD-014": Finding(
                    kind="deviation", repro="liger_fused_linear_jsd_dtype.py",
                    evidence=(
                    "float64 x, W and teacher logits are accepted and (loss, KL, CE) come back "
                    "float32: the chunk accumulators are `torch.zeros(())` in fp32 whatever the "
                    "input dtype, so float64 is neither refused nor kept (fp16 input also "
                    "returns fp32 results, where the contract states the input dtype).")),
            },
        ),
        Binding(
            name="LigerFusedLinearDPOFunction.preference_loss_fn",
            contract="dpo-loss-kernel-v1",
            binds={"dpo_loss": f"{_M}:dpo_loss", "dpo_grad": f"{_M}:dpo_grad"},
            dtypes=_FLOAT_EXTRA,  # plain torch ops: float64 / bfloat16 in, the same out
            not_claimed={"FALSIFY-DPO-012": _LEAF},
            findings={
                "FALSIFY-DPO-011": Finding(
                    kind="deviation", repro="liger_dpo_integer_logps.py",
                    evidence=(
                    "integer log-probs are accepted and the loss and rewards come back float32 "
                    "(β·(π − ref) promotes int64 to the default float), with no error.")),
                "FALSIFY-DPO-001/float16": Finding(
                    kind="deviation", repro="liger_dpo_fp16.py",
                    evidence=(
                    "preference_loss_fn computes in the log-probs' dtype: for fp16 the log "
                    "ratios π − ref (of summed log-probs, magnitudes in the tens to hundreds, "
                    "fp16 spacing up to 0.06), β·(…), logsigmoid, the sum and the division by "
                    "the pair count all round to fp16; got 7.8515625 vs 7.84726590, |err| "
                    "4.3e-3 > atol 1.2e-4 + rtol 4.89e-4·|ref|. fp32 passes.")),
                "FALSIFY-DPO-004/float16": Finding(
                    kind="deviation", repro="liger_dpo_fp16.py",
                    evidence=(
                    "the gradient is autograd through the same fp16 operations: "
                    "d/dπ_c[9] -0.00172710 vs -0.00169986, |err| 2.72e-5 > atol 1.77e-5 + "
                    "rtol 4.88e-4·|ref|. fp32 passes.")),
            },
        ),
        Binding(
            name="LigerFusedLinearGRPOFunction.ppo_loss_fn",
            contract="grpo-loss-kernel-v1",
            binds={"grpo_loss": f"{_M}:grpo_loss"},
            dtypes=("float64",),  # plain torch ops: float64 in, float64 out
            findings={
                "FALSIFY-GRPO-015": Finding(
                    kind="deviation", repro="liger_grpo_loss_dtype.py",
                    evidence=(
                    "bfloat16 log-probs are accepted and the loss comes back float32: the 'dapo' "
                    "normalizer (_compute_dapo_normalizer: `mask.to(torch.float32).sum()`) is "
                    "fp32 and the division promotes, so neither is bfloat16 refused nor kept; "
                    "fp16 input likewise returns an fp32 loss, where the contract states logp's "
                    "dtype (int64 log-probs also return float32).")),
                **{f"FALSIFY-GRPO-{n}": _empty_mean(
                    "mask all 0 (B = T = 1), fp32 and fp16",
                    "ppo_loss_fn ('dapo') divides by _compute_dapo_normalizer, "
                    "`torch.clamp(mask.sum(), min=1.0)`; the KL and clip checks that read the "
                    "same loss fail on the same example.") for n in ("005", "008", "009", "010",
                                                                      "012")},
                "FALSIFY-GRPO-023": _empty_mean(
                    "B = 0 (no sequence)", "The same clamp of the normalizer to ≥ 1."),
                "FALSIFY-GRPO-011": Finding(
                    kind="deviation", repro="liger_grpo_padding_nan.py",
                    evidence=(
                    "padding changes the loss: ppo_loss_fn computes the per-token loss on "
                    "every position and multiplies by the mask afterwards "
                    "(`(per_token_loss * attention_mask).sum()`), so a padded position holding "
                    "inf or NaN (in the contract's domain) gives inf·0 = NaN in the sum; the "
                    "contract masks before any arithmetic (B = 3, T = 37, β = 0.5; fp32 and "
                    "fp16).")),
                "FALSIFY-GRPO-006/float16": Finding(
                    kind="deviation", repro="liger_grpo_fp16_clip.py",
                    evidence=(
                    "ppo_loss_fn computes in logp's dtype: for fp16, ρ = exp(logp − old) and "
                    "clamp(ρ, 1 − ε, 1 + ε) (with 1 + ε itself rounded to fp16) are fp16, so a "
                    "ratio just outside the clip range lands on or inside the bound and takes "
                    "the unclipped gradient −ρ·A/n: d/dlogp(5, 39) -0.01195526 vs 0.00037781 "
                    "(clip active: only the KL term), |err| 1.23e-2 > atol 7.71e-4. fp32 "
                    "passes.")),
                "FALSIFY-GRPO-007/float16": Finding(
                    kind="deviation", repro="liger_grpo_fp16_clip.py",
                    evidence=(
                    "as FALSIFY-GRPO-006/float16 (the fp16 ratio at the clip boundary): "
                    "d/dlogp(5, 39) -0.01232910 vs 0.0 (policy gradient zero where the clip is "
                    "active), |err| 1.23e-2 > atol 7.61e-4.")),
            },
        ),
    ),
)
