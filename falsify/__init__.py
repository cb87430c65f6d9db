"""falsify: contract-first verification for LLM-training kernels and training loops."""

import logging as _logging
import os as _os

from falsify import triton_env as _triton_env

_triton_env.configure()

# Third-party noise that is not the user's business, silenced at its source before any of it
# is imported: torchao logs a warning per prebuilt extension this torch cannot load ("Failed
# to load ... .so"), torch's pytree logs a deprecation when torchao registers its enums, and
# transformers draws a "Loading weights" bar per model load (it reads huggingface_hub's switch;
# a user who set it keeps their choice). Errors still get through.
for _name in ("torchao", "torch.utils._pytree"):
    _logging.getLogger(_name).setLevel(_logging.ERROR)
_os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# torch's profiler (kineto, C++) writes "USDT: ... profiler_start" and "profiler_stop" to stderr
# each time a profile opens and closes: the probes and the train/finetune benches that count
# bytes or split time with torch.profiler would print them per check. Kineto's levels are
# VERBOSE 0 .. ERROR 4, USDT 5, and it prints what is at or above KINETO_LOG_LEVEL, read when a
# profile starts: 6 is the only value that leaves USDT out (kineto's own error lines go too; a
# profiler that fails still raises in Python). A user who set it keeps their choice.
_os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__version__ = "0.1.0"
