"""Triton kernels.

Without a GPU, kernels run under the Triton interpreter, which must be switched on before
`triton` is first imported. We do that here, once, and say so on stderr when it happens, so the
choice is never silent. Set FALSIFY_TRITON=gpu to forbid the interpreter (then a missing GPU is
an error at launch).
"""

import os
import sys


def _gpu_present() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


if "triton" not in sys.modules and not _gpu_present():
    if os.environ.get("FALSIFY_TRITON") == "gpu":
        raise RuntimeError("FALSIFY_TRITON=gpu but no CUDA device is visible")
    if os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        if os.environ.get("FALSIFY_QUIET") != "1":
            print("falsify: no GPU visible; Triton kernels run under TRITON_INTERPRET=1",
                  file=sys.stderr)

# Triton 3.9 warns that its FP-fusion default will flip in 3.10. Fusion (FMA contraction)
# changes rounding, so we pin it explicitly rather than inherit whichever default ships.
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
