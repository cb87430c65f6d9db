"""Mutants of the model's kernels (falsify/contracts/model-parity-v1.yaml): each is a small
numerical
bug of the kind that passes a loose per-kernel check and shows up only once a whole model has
run through it. Each replaces one equation's torch binding; the parity probe builds the
model's Ops from the contract's bindings, so the model runs the mutant.

Same signatures as the model's `Ops` fields (falsify/llm/ops.py)."""

from __future__ import annotations

import weakref

import numpy as np
import torch
import torch.nn.functional as F

from falsify.kernels.torch.attention import attention as _attention
from falsify.kernels.torch.rmsnorm import rmsnorm as _rmsnorm
from falsify.kernels.torch.rope import rope as _rope

_FP16_TILE = 16  # a tensor core's k-step: fp32 products summed 16 at a time, then fp16
_target: weakref.ref | None = None


def _fp16_accumulate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ wᵀ with the running sum held in fp16: each k-tile of 16 products is summed in fp32
    and added to an fp16 accumulator (cuBLAS's CUBLAS_COMPUTE_16F, or a Triton GEMM whose
    accumulator was declared tl.float16)."""
    acc = torch.zeros(*x.shape[:-1], w.shape[0], dtype=torch.float16)
    for k0 in range(0, x.shape[-1], _FP16_TILE):
        part = F.linear(x[..., k0:k0 + _FP16_TILE], w[:, k0:k0 + _FP16_TILE])
        acc = (acc.float() + part).half()
    return acc.to(x.dtype)


def linear_fp16_accumulate_one_layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The first projection the model runs (layer 0's q_proj) accumulates in fp16; every other
    GEMM is correct. The target is the first weight this mutant sees while that weight is
    alive (held weakly, so a new model gets its own layer 0)."""
    global _target
    if _target is None or _target() is None:
        _target = weakref.ref(w)
    if _target() is w:
        return _fp16_accumulate(x, w)
    return F.linear(x, w)


def rmsnorm_eps_10x(x: torch.Tensor, w: torch.Tensor, eps: float, out=None) -> torch.Tensor:
    """RMSNorm with ε ten times the configured one (a config read in the wrong unit, or a
    hard-coded 1e-4 where the model says 1e-5): every activation with mean square near ε
    comes out too small."""
    return _rmsnorm(x, w, 10.0 * eps, out)


def rope_theta_off(x: torch.Tensor, pos: torch.Tensor, theta: float, out=None) -> torch.Tensor:
    """RoPE with θ 2 % off (a rounded θ, or θ from another checkpoint's config): the angles
    drift in proportion to the position."""
    return _rope(x, pos, 1.02 * theta, out)


def attention_scale_fp16(q, k, v, causal: bool = True, scale: float | None = None, out=None):
    """The softmax scale 1/√d rounded to fp16 before use (a kernel that takes `scale` as a
    half-precision argument): 1/√32 loses 1e-4 of its value, every logit is scaled by that."""
    if scale is None and q.shape[-1] > 0:  # d = 0: left to the kernel's own argument check
        scale = q.shape[-1] ** -0.5
    half = None if scale is None else float(np.float16(scale))  # host-side, no tensor op
    return _attention(q, k, v, causal, half, out)
