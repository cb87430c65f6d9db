"""Benchmarks: ours against the baseline each names, measured side by side in one run.

`falsify bench` is a verb group: each module of `BENCHES` registers its subcommand with
`register(sub)`, like every verb (falsify/cli/common.py).
"""

from __future__ import annotations

BENCHES = ("falsify.bench.kernels", "falsify.bench.train", "falsify.bench.finetune",
           "falsify.bench.distributed", "falsify.bench.grpo")


def register(sub) -> None:
    from falsify.cli.common import group

    group(sub, "bench", "kernels|train|finetune|distributed|grpo: ours vs the baseline",
          BENCHES)
