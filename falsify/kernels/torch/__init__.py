"""PyTorch implementations: the fast path on CPU; autograd-aware."""
