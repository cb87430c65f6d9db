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

__version__ = "0.1.0"
