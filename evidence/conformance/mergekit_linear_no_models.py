"""mergekit: a linear merge of no models fails with an error that does not name k = 0.

linear_merge takes a TensorBatch of the models' tensors; with no models
TensorBatch.__post_init__ (merge_methods/base.py) raises ValueError 'TensorBatch requires
nonempty output and input axes' before any work: a refusal, but one that does not say that
the number of models is 0.

Backs FALSIFY-MRG-027 (merging-kernel-v1, layouts and size 0 of linear: k = 0 raises a
ValueError naming k = 0), binding linear_merge.
Run: python mergekit_linear_no_models.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
from mergekit.merge_methods.base import TensorBatch
from mergekit.merge_methods.linear import linear_merge

VERSION = importlib.metadata.version("mergekit")
print("case FALSIFY-MRG-027: k = 0 models")
print("input:   linear_merge over TensorBatch(tensors=()) (no models), weight [1, 0] float32")
try:
    out = linear_merge.implementation(TensorBatch(tensors=()), weight=torch.zeros(1, 0),
                                      normalize=True)
    outcome, ok = f"returned {tuple(out.shape)}", False
except ValueError as e:
    outcome = f"ValueError: {e}"
    ok = "k = 0" in str(e) or "k=0" in str(e) or "no models" in str(e) or "zero models" in str(e)
except Exception as e:  # noqa: BLE001 - the finding is which exception this is
    outcome, ok = f"{type(e).__name__}: {e}", False
print(f"library: mergekit {VERSION}: {outcome}")
print("true:    the merge of no models is undefined (0/0 weights)")
print("bound:   a ValueError naming k = 0 (the number of models), before any work")
print(f"error:   {'none' if ok else 'the error does not name k = 0'}")
print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: the error names no dim'}")
sys.exit(0 if ok else 1)
