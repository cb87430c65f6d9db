"""Optimized implementations: PyTorch (`impl.torch`) and Triton kernels (`impl.triton`)."""
