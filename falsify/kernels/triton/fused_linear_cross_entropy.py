"""Fused linear + cross-entropy with the Triton cross-entropy kernels (Liger-Kernel's design):
per chunk of C token rows, z_c = x_c·Wᵀ by a GEMM, then the Triton forward kernel (online
logsumexp over the vocabulary, per-row loss and lse) and the Triton backward kernel writing
G_c = ∂loss/∂z_c in place over z_c, then dx_c = G_c·W and dW += G_cᵀ·x_c.

The chunk loop, the reduction-dependent precompute (sum/mean in the forward, "none" recomputed
in the backward with the per-row dy) and the memory bound are those of
falsify/kernels/torch/fused_linear_cross_entropy.py; only the per-chunk CE math runs in Triton. The
kernels themselves (and their static checks) live in falsify/kernels/triton/cross_entropy.py — this
file
adds no kernel of its own, as the GEMMs are plain matmuls.
"""

from __future__ import annotations

import falsify.kernels.triton  # noqa: F401  (selects the interpreter before triton is imported)

# isort: split

from falsify.kernels.dtypes import triton_dtypes
from falsify.kernels.torch.fused_linear_cross_entropy import (
    _FLCE,
    _check_labels,
    check_flce_args,
    chunk_rows,
)
from falsify.kernels.triton import cross_entropy as xce

__all__ = ["fused_linear_cross_entropy"]


def _block(z, labels, scale, ignore_index, z_loss, label_smoothing):
    """Per-chunk CE with the Triton kernels: the forward kernel gives (loss, lse); with
    `scale` ([C] per-row dy, stride 1, or a broadcast scalar, stride 0 — the kernel reads
    dy_ptr[t·stride] either way) the backward kernel writes G over z in place."""
    loss, lse = xce.forward_rows(z, labels, ignore_index, z_loss, label_smoothing)
    if scale is not None:
        xce.backward_rows(z, labels, lse, scale, scale.stride(0), ignore_index, z_loss,
                          label_smoothing, dz=z)
    return loss, lse


def fused_linear_cross_entropy(x, weight, labels, ignore_index=-100, reduction="mean",
                               z_loss=0.0, label_smoothing=0.0, chunk_size=None):
    check_flce_args(x, weight, labels, chunk_size, triton_dtypes())
    _check_labels(labels, weight.shape[0], x.shape[0], ignore_index, reduction, z_loss,
                  label_smoothing)
    chunk = chunk_size or chunk_rows(x.shape[0], weight.shape[0])
    return _FLCE.apply(x, weight, labels, ignore_index, reduction, float(z_loss),
                       float(label_smoothing), chunk, _block)
