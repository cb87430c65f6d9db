"""Liger-Kernel: liger_cross_entropy crashes on a batch of zero tokens.

cross_entropy_forward reduces over the batch before any kernel launch (a torch max over the
empty target tensor), which raises RuntimeError 'max(): Expected reduction dim to be
specified for input.numel() == 0', where the loss of no tokens is an empty tensor
('none'), 0 ('sum') or NaN ('mean', 0/0), as torch.nn.functional.cross_entropy returns.

Backs FALSIFY-CE-028 (cross-entropy-kernel-v1, size 0: T = 0 returns the reference's
result), binding LigerCrossEntropyFunction. Runs the Triton kernel under the Triton
interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_cross_entropy_empty_batch.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from liger_kernel.transformers.functional import liger_cross_entropy  # noqa: E402

VERSION = importlib.metadata.version("liger-kernel")
logits = torch.zeros(0, 7)
labels = torch.zeros(0, dtype=torch.int64)
bad = []
for reduction in ("none", "sum", "mean"):
    ref = F.cross_entropy(logits, labels, reduction=reduction)
    print(f"case FALSIFY-CE-028: T = 0, reduction {reduction!r}")
    print("input:   logits zeros [0, 7] (float32), labels [] (int64)")
    try:
        y = liger_cross_entropy(logits, labels, reduction=reduction)
        outcome = f"{y.tolist()} (shape {tuple(y.shape)})"
        ok = tuple(y.shape) == tuple(ref.shape) and torch.equal(y.isnan(), ref.isnan()) and \
            bool(((y == ref) | y.isnan()).all())
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {str(e).splitlines()[0]}", False
    print(f"library: liger-kernel {VERSION}: liger_cross_entropy(logits, labels): {outcome}")
    print(f"true:    {ref.tolist()} (shape {tuple(ref.shape)}), as F.cross_entropy returns")
    print("bound:   that result, no error")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: T = 0 crashes'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
