"""Check kinds: one small module per kind of executable check."""
