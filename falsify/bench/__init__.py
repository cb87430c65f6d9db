"""Benchmarks: ours against the baseline each names, measured side by side in one run."""
