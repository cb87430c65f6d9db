"""Triton kernels.

How Triton runs (GPU, or the interpreter when there is none) is decided once, before `triton`
is imported, by `falsify.triton_env` — `import falsify` already did it; see that module for the
FALSIFY_TRITON override.
"""

import os

from falsify import triton_env

triton_env.configure()

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
triton_env.pin_interpreter_dot()  # tl.dot's rows independent of their tile position
triton_env.memoize_interpreter_dtypes()  # the same dtype mapping, from a table built once
triton_env.skip_discarded_overflow_checks()  # the interpreter never reads their verdict
triton_env.patch_language_once_per_launch()  # device-function calls reuse the launch's patches
