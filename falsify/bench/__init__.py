"""Benchmarks: ours against the baseline each names, measured side by side in one run.

`falsify bench` is a verb group (falsify/cli/bench.py): each module of `BENCHES` registers its
subcommand with `register(sub)`, like every verb.
"""

from __future__ import annotations

BENCHES = ("falsify.bench.kernels", "falsify.bench.train", "falsify.bench.finetune",
           "falsify.bench.distributed", "falsify.bench.grpo", "falsify.bench.self")

