"""Symbolic proof targets (z3 claims, CrossHair-checked functions), one module per kernel."""
