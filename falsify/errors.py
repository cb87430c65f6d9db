"""Errors more than one layer raises: a leaf module that imports nothing of ours, so the
harness, the application and the benchmarks can raise a usage error (which the CLI turns into
exit code 2) without importing the command line, and the reference and the kernels raise one
and the same NonFiniteGradNorm without either importing the other."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class NonFiniteGradNorm(FloatingPointError):
    """The total gradient norm is NaN or infinite: the gradients were left unchanged. Raised
    by gradient clipping with error_if_nonfinite=True in the reference and every backend alike,
    so the contract's check can catch one type."""
