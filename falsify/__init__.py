"""falsify: contract-first verification for LLM-training kernels and training loops."""

from falsify import triton_env as _triton_env

_triton_env.configure()

__version__ = "0.1.0"
