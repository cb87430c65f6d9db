"""falsify: contract-first verification for LLM-training kernels and training loops."""

from falsify import _tree

_tree.check(__file__)

from falsify import triton_env as _triton_env  # noqa: E402  (after the tree check)

_triton_env.configure()

__version__ = "0.1.0"
