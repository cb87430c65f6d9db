"""`pv ledger merge`: one ledger from the ledgers of a sharded run (`falsify run --shard`)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from falsify.cli.common import EXIT_FAILED, EXIT_OK, group
from falsify.errors import UsageError
from falsify.helptext import first_paragraph


def cmd_merge(args) -> int:
    from falsify.harness import ledger

    if args.output in args.ledgers:
        # the output would be replaced while it is still one of the inputs being read
        raise UsageError(f"-o {args.output}: is also an input; write the merge elsewhere")
    try:
        data = ledger.write_merged(args.ledgers, args.output)
    except ledger.LedgerConflict as e:
        print(f"conflict: {e}; nothing written", file=sys.stderr)
        return EXIT_FAILED
    except ledger.LedgerError as e:
        raise UsageError(str(e)) from None
    print(f"merged {len(args.ledgers)} ledger(s) into {args.output}: {len(data['runs'])} "
          f"check result(s), {len(data['mutants'])} mutant result(s)")
    return EXIT_OK


def register(sub) -> None:
    g = group(sub, "ledger", "combine results ledgers", [SimpleNamespace(register=_verbs)])
    g.description = first_paragraph(__doc__)


def _verbs(sub) -> None:
    m = sub.add_parser("merge", help="merge shard ledgers into one; refuse conflicting entries "
                                     "(the same key with another outcome or hash)")
    m.add_argument("ledgers", nargs="+", help="ledger files, e.g. one per shard")
    m.add_argument("-o", "--output", required=True, help="the merged ledger (written atomically)")
    m.set_defaults(func=cmd_merge)
