"""`falsify`: run the contracts' checks, the mutants, benchmarks and the training loop.

    falsify run [CONTRACT...] [--backend reference,torch,triton] [--quick|--thorough]
                [-n WORKERS] [--format table|json|junit] [--bind EQ.BACKEND=module:function]
    falsify mutants [CONTRACT...] [-n WORKERS]
    falsify mutate [CONTRACT...] [--module PATH ...] [--budget MINUTES] [--shard K/N]
    falsify conformance [LIB...] [--binding LIB/NAME] [--against LEDGER]
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

Every verb is a module with `register(sub)` (see falsify/cli/common.py) named in `INDEX`;
adding a verb is adding its name, module and one-line help there.
`pv` is built the same way (falsify/cli/pv.py).
"""

from __future__ import annotations

import sys

from falsify.cli import common
from falsify.helptext import first_paragraph

# verb -> (its module, its one-line help), in `--help` order: what a command line shows of the
# verbs it does not run, without importing their modules (most import torch). It must say what
# the modules register (tests/test_cli_smoke.py compares the two).
INDEX = {
    "run": ("falsify.cli.run", "run the contracts' checks and mutants, report coverage"),
    "mutants": ("falsify.cli.run", "run every declared mutant; a survivor is a failure"),
    "mutate": ("falsify.cli.mutate", "make bugs in the code; one the checks miss fails"),
    "conformance": ("falsify.cli.conformance",
                    "the contracts judged against third-party libraries"),
    "bench": ("falsify.cli.bench", "ours vs the baseline; self: falsify's own run times"),
    "train": ("falsify.cli.train", "pretrain a LLaMA-style model (default: tiny, on the stdlib)"),
    "distill": ("falsify.cli.distill", "distill a teacher into a smaller student (KD loss)"),
    "finetune": ("falsify.cli.finetune",
                 "LoRA / QLoRA fine-tuning (SFT, reward-weighted, DPO, GRPO)"),
    "merge": ("falsify.cli.merge", "merge an adapter into its base, or models with each other"),
    "export": ("falsify.cli.export",
               "write a checkpoint or adapter as HF or GGUF files"),
    "eval": ("falsify.cli.eval", "perplexity and pass@k on code problems, run in a sandbox"),
    "prune": ("falsify.cli.prune", "prune projections: magnitude or WANDA, per row or N:M"),
    "quantize": ("falsify.cli.quantize", "weight-only int8, int4 or NF4 quantization"),
    "pipeline": ("falsify.cli.pipeline", "the post-training chain from one YAML, resumable"),
    "generate": ("falsify.cli.generate", "sample from a checkpoint: base, +adapter, merged"),
    "init": ("falsify.cli.init", "scaffold a project: config, contract, stubs, CI, pre-commit"),
    "soak": ("falsify.cli.soak", "draw fresh seeds over the contracts until the time is up"),
    "parity": ("falsify.cli.parity", "the whole model per backend vs the float64 reference"),
}
VERBS = tuple(dict.fromkeys(module for module, _ in INDEX.values()))  # each module once, in order


def build_parser(argv: list[str] | None = None) -> common.Parser:
    """Every verb's parser; given the command line, only the one it runs (INDEX stands in for
    the others)."""
    return common.build_parser("falsify", first_paragraph(__doc__), VERBS,
                               index=None if argv is None else INDEX, argv=argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return common.dispatch(build_parser(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
