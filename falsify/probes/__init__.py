"""Executable probes: the `run:` functions of training-kind checks, one module per kernel."""
