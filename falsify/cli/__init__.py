"""`falsify`: run the contracts' checks, the mutants, benchmarks and the training loop.

    falsify run [CONTRACT...] [--backend reference,torch,triton] [--quick|--thorough]
                [-n WORKERS] [--format table|json|junit] [--bind EQ.BACKEND=module:function]
    falsify mutants [CONTRACT...] [-n WORKERS]
    falsify bench kernels|train|finetune
    falsify train [--config FILE] [--resume [DIR]] [--FIELD VALUE ...]
    falsify parity [--model tiny] [--backend reference,torch,triton] [--bisect] [--train]
    falsify distill | finetune | merge | export | generate | eval | prune | quantize |
            pipeline   (each: --help)

Every verb takes `--flag value`; a config field is a flag of its name (`--max-steps 100`), and
`--out DIR` is the output directory wherever one is written. `key=value` is the old form of
the config flags, kept for this release (it comes last and wins).

Exit codes: 0 all passed, 1 a check failed or a mutant survived, 2 usage error (some verbs
add their own: `falsify train` 3 on an Andon stop, `falsify merge` 4 when its self-check fails).

Every verb is a module with `register(sub)` (see falsify/cli/common.py) named in `VERBS`;
adding a verb is adding its module to that list, one line. `pv` is built the same way
(falsify/cli/pv.py).
"""

from __future__ import annotations

import sys

from falsify.cli import common
from falsify.helptext import first_paragraph

VERBS = (  # the order of `falsify --help`
    "falsify.cli.run",       # run, mutants
    "falsify.cli.bench",     # bench kernels | train | finetune
    "falsify.cli.train",     # train
    "falsify.cli.distill",   # distill
    "falsify.cli.finetune",  # finetune
    "falsify.cli.merge",     # merge
    "falsify.cli.export",    # export
    "falsify.cli.eval",      # eval
    "falsify.cli.prune",     # prune
    "falsify.cli.quantize",  # quantize
    "falsify.cli.pipeline",  # pipeline
    "falsify.cli.generate",  # generate
    "falsify.cli.init",      # init
    "falsify.cli.soak",      # soak
    "falsify.cli.parity",    # parity
)


def build_parser() -> common.Parser:
    return common.build_parser("falsify", first_paragraph(__doc__), VERBS)


def main(argv: list[str] | None = None) -> int:
    return common.dispatch(build_parser(), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
