"""`pv`: validate, inspect and generate from contracts.

Exit codes (every verb): 0 fine, 1 violations found, 2 usage or I/O error.
Every verb loads contracts through `harness.validate.load_all`, the one loading path.

The verbs live in the modules of `VERBS`, each with a `register(sub)` (falsify/cli/common.py);
adding a verb module is one line there. This file is the entry point only.
"""

from __future__ import annotations

import sys

from falsify.cli import common
from falsify.helptext import first_paragraph

VERBS = (
    "falsify.cli.pv_validate",  # validate
    "falsify.cli.pv_inspect",   # status, graph, equations, diff: read contracts
    "falsify.cli.pv_harness",   # generate, coverage, audit: contracts and the results ledger
    "falsify.cli.pv_ledger",    # ledger merge: shard ledgers into one
)


def build_parser() -> common.Parser:
    return common.build_parser("pv", first_paragraph(__doc__), VERBS)


def main(argv: list[str] | None = None) -> int:
    return common.dispatch(build_parser(), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
