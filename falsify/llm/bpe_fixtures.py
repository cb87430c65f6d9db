"""Write the tokenizer fixtures bpe-tokenizer-kernel-v1 checks: the project's tokenizer recipe
(falsify/kernels/torch/bpe_tokenizer.py train_tokenizer) trained on the first TRAIN_BYTES of the
standard-library corpus, once per vocabulary the contract draws, saved as tokenizer.json.

    python -m falsify.llm.bpe_fixtures falsify/contracts/fixtures

The corpus is this Python's standard library, so another Python version writes other merges:
regenerate only when the recipe changes. The contract declares the files
(`metadata.fixtures`), so their bytes are part of every check's fingerprint: new files stale the
results computed from the old ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from falsify.kernels.torch.bpe_tokenizer import TRAIN_BYTES, train_tokenizer
from falsify.llm import data
from falsify.reference.bpe_tokenizer import FIXTURE_NAME, FIXTURE_VOCABS


def train(vocab_size: int):
    """The recipe on the fixed corpus slice; refuses a short vocabulary (prepare_data's rule:
    the model is built with exactly `vocab_size` rows)."""
    spec = data.DataSpec(corpus="stdlib", max_bytes=TRAIN_BYTES, vocab_size=vocab_size)
    spec.validate()
    docs, _ = data.load_documents(spec)
    tok = train_tokenizer([d.text for d in docs], vocab_size)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: the first {TRAIN_BYTES} bytes of the "
                         f"stdlib corpus only support {tok.get_vocab_size()} tokens")
    return tok


def write_fixtures(out_dir: str | Path, vocab_sizes=FIXTURE_VOCABS) -> list[Path]:
    """Train and save one fixture per vocabulary (each written atomically); returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for v in vocab_sizes:
        path = out / FIXTURE_NAME.format(vocab_size=v)
        data.save_tokenizer(train(v), path)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m falsify.llm.bpe_fixtures",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="where to write bpe-tokenizer-<vocab>.json")
    args = parser.parse_args(argv)
    for path in write_fixtures(args.out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
