"""falsify: contract-first verification for LLM-training kernels and training loops."""

__version__ = "0.1.0"
