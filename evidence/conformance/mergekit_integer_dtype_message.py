"""mergekit: linear and SLERP refuse integer tensors with an error that does not name the dtype.

linear_merge and slerp_merge_method check `is_floating_point()` and raise TypeError
'Linear merging requires floating-point tensors' / 'SLERP requires floating-point tensors'
before any work: a refusal, but one that does not say which dtype was given (int64 here),
which the contract asks of every refusal so that a caller can tell a wrong checkpoint dtype
from another mistake.

Backs FALSIFY-MRG-022 (linear) and FALSIFY-MRG-023 (slerp) of merging-kernel-v1: every
undeclared dtype is refused with a TypeError or ValueError naming it.
Run: python mergekit_integer_dtype_message.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
from mergekit.merge_methods.base import TensorBatch
from mergekit.merge_methods.linear import linear_merge
from mergekit.merge_methods.slerp import slerp_merge_method

VERSION = importlib.metadata.version("mergekit")
A, B = [[1, 2], [3, 4]], [[5, 6], [7, 8]]
a, b = torch.tensor(A)[None], torch.tensor(B)[None]  # mergekit's leading output-batch axis
calls = (
    ("FALSIFY-MRG-022", "linear_merge", lambda: linear_merge.implementation(
        TensorBatch(tensors=(a, b)), weight=torch.tensor([[0.5, 0.5]]), normalize=True)),
    ("FALSIFY-MRG-023", "slerp_merge_method", lambda: slerp_merge_method.implementation(
        TensorBatch(tensors=(a, b), base_index=0), t=torch.tensor([0.3], dtype=torch.float64))),
)
bad = []
for check, name, call in calls:
    print(f"case {check}: {name} on int64 tensors")
    print(f"input:   models {A} and {B} (int64, with mergekit's [1, m, n] batch axis)"
          + (", weights [0.5, 0.5]" if "linear" in name else ", t = 0.3"))
    try:
        out = call()
        outcome, ok = f"accepted: {out.tolist()} ({out.dtype})", False
    except (TypeError, ValueError) as e:
        named = any(s in str(e) for s in ("int64", "Long", "torch.int64"))
        outcome, ok = f"{type(e).__name__}: {e}", named
    print(f"library: mergekit {VERSION}: {outcome}")
    print("true:    int64 is not a declared dtype of merging-kernel-v1 (float32, float16; the "
          "binding adds float64 and bfloat16)")
    print("bound:   a TypeError or ValueError whose message names the dtype (int64), before "
          "any work")
    print(f"error:   {'none' if ok else 'the refusal does not name the dtype'}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: the error names no dtype'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
