"""Decide how Triton runs, once, before `triton` is first imported.

torch 2.13 imports triton on its first matmul, so the decision cannot wait for our kernel
modules: `import falsify` makes it. Without a GPU the kernels run under the Triton interpreter
(TRITON_INTERPRET=1) and we say so on stderr — never silently. FALSIFY_TRITON overrides:
`gpu` (a missing GPU is an error), `interpret` (always interpret), `compile` (neither: for
offline compilation to PTX in the static checks).
"""

import os
import sys

MODES = ("auto", "gpu", "interpret", "compile")


def gpu_visible() -> bool:
    """An NVIDIA driver node, checked without importing torch (cheap at `import falsify`)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def configure() -> None:
    mode = os.environ.get("FALSIFY_TRITON", "auto")
    if mode not in MODES:
        raise RuntimeError(f"FALSIFY_TRITON={mode!r}: choose one of {', '.join(MODES)}")
    # Triton 3.9 warns that its FP-fusion default flips in 3.10. Fusion (FMA contraction)
    # changes rounding, so we pin it rather than inherit whichever default ships.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if "triton" in sys.modules or mode == "compile":
        return
    if mode == "gpu":
        if not gpu_visible():
            raise RuntimeError("FALSIFY_TRITON=gpu but no NVIDIA GPU is visible")
        return
    if (mode == "interpret" or not gpu_visible()) and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        if os.environ.get("FALSIFY_QUIET") != "1":
            print("falsify: no GPU visible; Triton kernels run under TRITON_INTERPRET=1",
                  file=sys.stderr)
