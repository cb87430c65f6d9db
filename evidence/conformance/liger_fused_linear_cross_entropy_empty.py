"""Liger-Kernel: liger_fused_linear_cross_entropy divides by zero on T = 0 or H = 0.

fused_linear_cross_entropy_forward sizes its chunks with
`inc_factor = triton.cdiv(V, chunk_mem_const * H)`, `chunk_size =
triton.next_power_of_2(triton.cdiv(BT, inc_factor))` and `num_chunks = triton.cdiv(BT,
chunk_size)`, which raise ZeroDivisionError for a hidden size of 0 (H = 0) or no tokens
(T = 0: chunk_size is 0), where the loss is an empty tensor (T = 0) or
the cross-entropy of all-zero logits, log V per token (H = 0), as
F.cross_entropy(x @ W.T, y) gives.

Backs FALSIFY-FLCE-014 (fused-linear-cross-entropy-kernel-v1, size 0: T = 0 and H = 0
return the reference's result), binding LigerFusedLinearCrossEntropyFunction. Runs under the
Triton interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_fused_linear_cross_entropy_empty.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy  # noqa: E402

VERSION = importlib.metadata.version("liger-kernel")
bad = []
for name, T, H in (("T = 0", 0, 4), ("H = 0", 2, 0)):
    x, w = torch.zeros(T, H), torch.zeros(5, H)
    y = torch.zeros(T, dtype=torch.int64)
    ref = F.cross_entropy(x @ w.T, y, reduction="none")
    print(f"case FALSIFY-FLCE-014: {name}")
    print(f"input:   x zeros [{T}, {H}], weight zeros [5, {H}] (float32), labels zeros [{T}] "
          "(int64), reduction 'none'")
    try:
        out = liger_fused_linear_cross_entropy(x, w, y, reduction="none")
        outcome = f"{out.tolist()} (shape {tuple(out.shape)})"
        ok = tuple(out.shape) == tuple(ref.shape) and torch.allclose(out, ref)
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {e}", False
    print(f"library: liger-kernel {VERSION}: liger_fused_linear_cross_entropy(x, weight, y): "
          f"{outcome}")
    print(f"true:    {ref.tolist()} (shape {tuple(ref.shape)}; log 5 = 1.6094379 per token)")
    print("bound:   that result within float32 rounding, no error")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: ' + name + ' crashes'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
