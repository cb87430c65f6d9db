"""Mutants: deliberately buggy variants of bound functions, one module per kernel."""
