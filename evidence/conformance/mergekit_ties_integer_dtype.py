"""mergekit: the TIES merge of integer tensors fails inside torch, after the merge's work.

GeneralizedTaskArithmeticMerge.merge_group checks no dtype: for int64 tensors it computes
the task vectors, the sparsification and the sign election, and fails at
`mixed_delta /= divisor` with torch's RuntimeError 'result type Float can't be cast to the
desired output type Long'. The refusal comes late, from inside torch, and names no dtype.

Backs FALSIFY-MRG-025 (merging-kernel-v1: every undeclared dtype is refused with a TypeError
or ValueError naming it, before any work), binding ties.
Run: python mergekit_ties_integer_dtype.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
from mergekit.merge_methods import registry
from mergekit.merge_methods.base import TensorGroup

VERSION = importlib.metadata.version("mergekit")
BASE, MODEL = [[1, 2], [3, 4]], [[5, 6], [7, 8]]
group = TensorGroup.from_tensors([torch.tensor(BASE), torch.tensor(MODEL)], base_index=0)
ids = [e.id for e in group.non_base]
print("case FALSIFY-MRG-025: ties on int64 tensors")
print(f"input:   base {BASE}, one model {MODEL} (int64), weight 0.5, density 1, lambda 1")
try:
    out = registry.get("ties").merge_group(group, weight=dict.fromkeys(ids, 0.5),
                                           density=dict.fromkeys(ids, 1.0), int8_mask=False,
                                           normalize=True, rescale=False, **{"lambda": 1.0})
    outcome, ok = f"accepted: {out.tolist()} ({out.dtype})", False
except (TypeError, ValueError) as e:
    outcome, ok = f"{type(e).__name__}: {e}", "int64" in str(e) or "Long" in str(e)
except Exception as e:  # noqa: BLE001 - the finding is which exception this is
    outcome, ok = f"{type(e).__name__}: {e}", False
print(f"library: mergekit {VERSION}: {outcome}")
print("true:    int64 is not a declared dtype of merging-kernel-v1")
print("bound:   a TypeError or ValueError naming the dtype, before any work")
print(f"error:   {'none' if ok else outcome}")
print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: not a refusal naming the dtype'}")
sys.exit(0 if ok else 1)
