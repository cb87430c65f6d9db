"""Optimized implementations: PyTorch (`falsify.kernels.torch`) and Triton kernels
(`falsify.kernels.triton`)."""
