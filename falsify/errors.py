"""Errors every layer may raise and the CLI turns into exit codes: a leaf module that imports
nothing of ours, so the harness, the application and the benchmarks can raise a usage error
without importing the command line."""


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""
