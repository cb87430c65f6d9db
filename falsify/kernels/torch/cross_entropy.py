"""Cross-entropy in PyTorch, chunked over tokens and vocabulary, with our own backward.

Forward, per chunk of TOKEN_CHUNK rows and VOCAB_CHUNK columns, in fp32 whatever the logits
dtype: the online logsumexp keeps (m, d) per row and merges a vocabulary chunk c with
    m' = max(m, max_c z),  d' = d·exp(m − m') + Σ_c exp(z − m')
which is exact: d'·exp(m') = Σ_{seen} exp(z) (proved in falsify/proofs/cross_entropy.py).
lse = m + log d is saved (T floats); no [T, V] softmax is ever stored.

Backward (math in falsify/reference/cross_entropy.py): for valid rows
    ∂loss_t/∂z = softmax(z)·(1 + 2ζ·lse) − (1 − ε)·e_y − ε/V
recomputed chunk by chunk from the saved lse, times the upstream scale of that row: dy[t] for
reduction "none" (a vector: Liger #968 read dy[0] for every row), dy for "sum", dy/n for
"mean" with n the count of non-ignored rows. Ignored rows get exactly 0.

Under torch.compile the chunks are one block each way (`spans`): a Python loop over
range(0, T, C) reads T as a number, so Dynamo would specialize the compiled graph to each
sequence length and recompile for every new one. The chunks bound eager memory; a compiled
graph's buffers are Inductor's to plan (it fuses the row reductions into its own loops).

The loss is returned in the logits dtype (as F.cross_entropy does), computed in fp32 and
rounded once; the gradient is in the logits dtype.
"""

from __future__ import annotations

import torch

from falsify.kernels.dtypes import CHECKED, require
from falsify.reference.cross_entropy import REDUCTIONS

__all__ = ["cross_entropy", "cross_entropy_grad"]

TOKEN_CHUNK = 1024
VOCAB_CHUNK = 2048


def spans(n, chunk: int) -> list[tuple]:
    """(start, stop) of each chunk of range(n); one span (0, n) under torch.compile, where n
    stays a symbolic size instead of being read as a number (see the module docstring)."""
    if torch.compiler.is_compiling():
        return [(0, n)]
    return [(a, min(n, a + chunk)) for a in range(0, n, chunk)]


def check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing,
                  dtypes: tuple = CHECKED):
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a 2-D tensor [T, V]")
    require("cross_entropy", dtypes, logits=logits)
    if not isinstance(labels, torch.Tensor) or labels.dim() != 1 or labels.shape[0] != \
            logits.shape[0]:
        raise ValueError(f"labels must be a 1-D tensor of length T={logits.shape[0]}")
    if labels.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"labels dtype {labels.dtype}: must be int64 or int32")
    if logits.shape[1] < 1:
        raise ValueError(f"vocabulary size V = {logits.shape[1]}: must be ≥ 1")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}: must be one of {REDUCTIONS}")
    if not (isinstance(z_loss, (int, float)) and z_loss >= 0 and z_loss != float("inf")):
        raise ValueError(f"z_loss={z_loss!r}: must be finite and ≥ 0")
    if not (isinstance(label_smoothing, (int, float)) and 0.0 <= label_smoothing <= 1.0):
        raise ValueError(f"label_smoothing={label_smoothing!r}: must lie in [0, 1]")
    V = logits.shape[1]
    if torch.compiler.is_compiling():  # reading `bad` back is a graph break: see _bounded
        return
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= V))
    if bool(bad.any()):
        raise ValueError(f"labels outside [0, {V}) that are not ignore_index={ignore_index}")


def _bounded(labels, ignore_index, V):
    """Under torch.compile: every label outside [0, V) that is not ignore_index moved to V, so
    that Inductor's indexing assert on the gather ("index out of bounds") refuses it, as
    check_ce_args does eagerly, instead of a negative label wrapping to a column from the end."""
    if not torch.compiler.is_compiling():
        return labels
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= V))
    return torch.where(bad, torch.full_like(labels, V), labels)


def rows_forward(z, labels, ignore_index, z_loss, label_smoothing):
    """Per-row (loss, lse) in fp32 for a block of rows z [R, V] (any float dtype), chunked
    over the vocabulary."""
    R, V = z.shape
    m = torch.full((R,), float("-inf"), dtype=torch.float32, device=z.device)
    d = torch.zeros(R, dtype=torch.float32, device=z.device)
    zsum = torch.zeros(R, dtype=torch.float32, device=z.device)
    for c0, c1 in spans(V, VOCAB_CHUNK):
        zc = z[:, c0:c1].float()
        m_new = torch.maximum(m, zc.amax(dim=1))
        d = d * torch.exp(m - m_new) + torch.exp(zc - m_new[:, None]).sum(dim=1)
        m = m_new
        if label_smoothing:
            zsum += zc.sum(dim=1)
    lse = m + torch.log(d)
    valid = labels != ignore_index
    safe_y = torch.where(valid, labels, torch.zeros_like(labels)).long()
    zy = z.gather(1, safe_y[:, None])[:, 0].float()
    loss = (1.0 - label_smoothing) * (lse - zy)
    if label_smoothing:
        loss = loss + label_smoothing * (lse - zsum / V)
    if z_loss:
        loss = loss + z_loss * lse * lse
    return torch.where(valid, loss, torch.zeros_like(loss)), lse


def rows_grad(z, labels, lse, scale, ignore_index, z_loss, label_smoothing, out=None):
    """∂loss/∂z for a block of rows, times the per-row upstream `scale` [R] (fp32), chunked
    over the vocabulary; written into `out` (z's dtype unless given)."""
    R, V = z.shape
    out = torch.empty(z.shape, dtype=z.dtype, device=z.device) if out is None else out
    valid = labels != ignore_index
    scale = torch.where(valid, scale, torch.zeros_like(scale))
    safe_y = torch.where(valid, labels, torch.zeros_like(labels)).long()
    factor = (1.0 + 2.0 * z_loss * lse) if z_loss else torch.ones_like(lse)
    for c0, c1 in spans(V, VOCAB_CHUNK):
        p = torch.exp(z[:, c0:c1].float() - lse[:, None])
        g = p * factor[:, None] - label_smoothing / V
        hit = (safe_y >= c0) & (safe_y < c1)
        # −(1 − ε) at each row's label column in this chunk; rows whose label lies elsewhere
        # add −0.0, which changes no value: the same single rounding as indexing the hit rows,
        # without nonzero's data-dependent shape (a graph break under torch.compile)
        col = (safe_y - c0).clamp(0, c1 - c0 - 1)[:, None]
        g.scatter_add_(1, col, -(1.0 - label_smoothing) * hit.float()[:, None])
        out[:, c0:c1] = (g * scale[:, None]).to(out.dtype)
    return out


def upstream_scale(dy, reduction, labels, ignore_index, T):
    """Per-row multiplier of the row gradient: dy[t] (none), dy (sum), dy/n (mean)."""
    dy = dy.float()
    if reduction == "none":
        if dy.shape != (T,):
            raise ValueError(f"upstream gradient for reduction='none' must have shape ({T},)")
        return dy
    if reduction == "sum":
        return dy.reshape(()).expand(T)
    # n ≥ 1: with every row ignored each row's scale is masked to 0 anyway, and dy/0 = inf
    # would make the double backward's ∂/∂dy 0·inf = NaN where the derivative is 0
    n = (labels != ignore_index).sum().clamp_min(1).float()
    return (dy.reshape(()) / n).expand(T)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, ignore_index, reduction, z_loss, label_smoothing):
        T = logits.shape[0]
        loss = torch.empty(T, dtype=torch.float32, device=logits.device)
        lse = torch.empty(T, dtype=torch.float32, device=logits.device)
        for r0, r1 in spans(T, TOKEN_CHUNK):
            sl = slice(r0, r1)
            loss[sl], lse[sl] = rows_forward(logits[sl], labels[sl], ignore_index, z_loss,
                                             label_smoothing)
        ctx.save_for_backward(logits, labels, lse)
        ctx.cfg = (ignore_index, reduction, z_loss, label_smoothing)
        return reduce_rows(loss, labels, ignore_index, reduction).to(logits.dtype)

    @staticmethod
    def backward(ctx, dy):
        logits, labels, lse = ctx.saved_tensors
        ignore_index, reduction, z_loss, label_smoothing = ctx.cfg
        T = logits.shape[0]
        if torch.is_grad_enabled():
            # create_graph=True: this backward will be differentiated. The saved lse is an
            # intermediate of the forward, a constant to autograd: softmax = exp(z − lse) built
            # on it would silently lose the −softmax·softmaxᵀ half of the Hessian. Recompute it
            # from the logits with the forward's own operations (bit-identical values).
            lse = torch.cat([rows_forward(logits[r0:r1], labels[r0:r1], ignore_index, z_loss,
                                          label_smoothing)[1]
                             for r0, r1 in spans(T, TOKEN_CHUNK)])
        scale = upstream_scale(dy, reduction, labels, ignore_index, T)
        dz = torch.empty_like(logits)
        for r0, r1 in spans(T, TOKEN_CHUNK):
            sl = slice(r0, r1)
            rows_grad(logits[sl], labels[sl], lse[sl], scale[sl], ignore_index, z_loss,
                      label_smoothing, out=dz[sl])
        return dz, None, None, None, None, None


def reduce_rows(loss, labels, ignore_index, reduction):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (labels != ignore_index).sum()  # 0/0 = NaN when every row is ignored


def cross_entropy(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                  label_smoothing=0.0):
    check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    labels = _bounded(labels, ignore_index, logits.shape[1])
    return _CrossEntropy.apply(logits, labels, ignore_index, reduction, float(z_loss),
                               float(label_smoothing))


def cross_entropy_grad(logits, labels, ignore_index=-100, reduction="mean", z_loss=0.0,
                       label_smoothing=0.0):
    """∂(reduced loss)/∂logits with dy = 1 (ones for "none"), through our backward."""
    check_ce_args(logits, labels, ignore_index, reduction, z_loss, label_smoothing)
    z = logits.detach().clone().requires_grad_(True)
    loss = cross_entropy(z, labels, ignore_index, reduction, z_loss, label_smoothing)
    (g,) = torch.autograd.grad(loss, [z], grad_outputs=torch.ones_like(loss))
    return g
