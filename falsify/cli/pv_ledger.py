"""`pv ledger merge`: one ledger from the ledgers of a sharded run (`falsify run --shard`).
`pv ledger stamp`: record a ledger's provenance (commit, profile, date) so that the docs pages
can publish it as evidence."""

from __future__ import annotations

import sys
from pathlib import Path
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


def cmd_stamp(args) -> int:
    import subprocess

    from falsify.harness import evidence

    # the commit is resolved now, once, and stored: generating pages never asks git
    r = subprocess.run(["git", "rev-parse", "--verify", f"{args.commit}^{{commit}}"],
                       capture_output=True, text=True,
                       cwd=Path(args.ledger).resolve().parent)  # the ledger's repository
    if r.returncode != 0:
        raise UsageError(f"--commit {args.commit}: not a commit of this repository "
                         f"({r.stderr.strip() or 'git rev-parse failed'})")
    prov = evidence.stamp(args.ledger, r.stdout.strip())
    print(f"stamped {args.ledger}: commit {prov['commit']}, profile {prov['profile']}, "
          f"date {prov['date']}")
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
    s = sub.add_parser("stamp", help="record a committed ledger's provenance (commit, profile, "
                                     "date) so the docs pages can publish it as evidence")
    s.add_argument("ledger", help="the ledger, e.g. evidence/thorough-ledger.json")
    s.add_argument("--commit", default="HEAD",
                   help="the commit whose code the results were recorded against (default HEAD)")
    s.set_defaults(func=cmd_stamp)
