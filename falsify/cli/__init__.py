"""`falsify`: run the contracts' checks, the mutants, benchmarks and the training loop.

    falsify run [CONTRACT...] [--backend reference,torch,triton] [--quick|--thorough]
                [-n WORKERS] [--format table|json|junit] [--bind EQ.BACKEND=module:function]
    falsify mutants [CONTRACT...] [-n WORKERS]
    falsify bench kernels|train|finetune
    falsify train [--config FILE] [key=value ...]

Exit codes: 0 all passed, 1 a check failed or a mutant survived, 2 usage error.
"""

from __future__ import annotations

import sys

from falsify.cli.common import Parser, UsageError


def build_parser():
    import argparse

    from falsify.cli import run, soak

    p = Parser(prog="falsify", description=__doc__.splitlines()[0],
               formatter_class=argparse.RawDescriptionHelpFormatter,
               epilog="more commands (each has its own --help):\n"
                      "  train      pretrain a LLaMA-style model (default: tiny preset, stdlib)\n"
                      "  finetune   LoRA / QLoRA fine-tuning (SFT, reward-weighted SFT, DPO)\n"
                      "  merge      merge an adapter into a full-precision checkpoint\n"
                      "  generate   sample from a checkpoint (base, +adapter, merged)\n"
                      "  bench      kernels | train | finetune: ours vs the baseline, one run")
    sub = p.add_subparsers(dest="cmd", parser_class=Parser)
    run.register(sub)
    soak.register(sub)
    return p


def cmd_delegate(module: str, argv: list[str]) -> int:
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise UsageError(f"{module} is not available: {e}") from None
    return int(mod.main(argv) or 0)


DELEGATES = {"train": "falsify.cli.train", "finetune": "falsify.cli.finetune",
             "merge": "falsify.cli.merge", "generate": "falsify.cli.generate"}
BENCHES = {"kernels": "falsify.bench.kernels", "train": "falsify.bench.train",
           "finetune": "falsify.bench.finetune"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in DELEGATES:
            return cmd_delegate(DELEGATES[argv[0]], argv[1:])
        if argv and argv[0] == "bench":
            if len(argv) < 2 or argv[1] not in BENCHES:
                raise UsageError(f"falsify bench: choose one of {', '.join(BENCHES)}")
            return cmd_delegate(BENCHES[argv[1]], argv[2:])
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            print("\nalso: falsify train | finetune | merge | generate | bench "
                  + "|".join(BENCHES))
            return 2
        return args.func(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
