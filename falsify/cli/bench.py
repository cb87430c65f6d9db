"""`falsify bench`: a verb group whose subcommands are the benchmark modules of
falsify.bench.BENCHES, each registering itself with `register(sub)` like every verb. The group
is made here so that the benchmarks do not import the command line."""

from __future__ import annotations

from falsify.bench import BENCHES
from falsify.cli.common import group


def register(sub) -> None:
    group(sub, "bench", "ours vs the baseline; self: falsify's own run times",
          BENCHES)
