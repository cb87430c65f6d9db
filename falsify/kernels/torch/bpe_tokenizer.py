"""The byte-level BPE tokenizer as the training loop uses it: HF `tokenizers`, trained and
called through the recipe below (train_tokenizer, encode_with, decode_with and the special
tokens), which falsify/llm/data.py imports for the loop, so the loop and the contract run the
same code.

This is the kernel's optimized backend, bound in bpe-tokenizer-kernel-v1 beside the pure-Python
reference (falsify/reference/bpe_tokenizer.py). It lives under falsify/kernels/torch/ because that
is the binding slot of a kernel's production CPU path (one kernel name, one file per backend:
`pv audit` looks here for its exports), although the work is done by `tokenizers`, not by torch.

The tokenizer under test is named by its `vocab_size`: a fixture file shipped with the contracts,
falsify/contracts/fixtures/bpe-tokenizer-<vocab_size>.json, which this recipe trained on the first
TRAIN_BYTES of the standard-library corpus (falsify/llm/bpe_fixtures.py writes them). The
reference parses the same file, so both sides judge one tokenizer, whatever this Python's
standard library holds.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from falsify.reference.bpe_tokenizer import FIXTURE_DIR, FIXTURE_NAME, FIXTURE_VOCABS

EOS = "<|endoftext|>"
FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX = "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"
# Order fixes the ids 0..3 (BpeTrainer adds special tokens first); synthetic data uses the same.
SPECIAL_TOKENS = [EOS, FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX]

# The corpus slice the fixtures were trained on (1024 needs 764 merges; 256 KiB supports
# several thousand and trains in under a second).
TRAIN_BYTES = 256 * 1024

# contract entry points; the recipe (train_tokenizer, encode_with, decode_with) is the
# application's, reached by the contract through encode and decode
__all__ = ["encode", "decode", "byte_tokens"]


# ------------------------------------------------------------------------------- the recipe
def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 pre-tokenizer regex, all 256 byte symbols in the initial alphabet so
    nothing is ever unknown; special tokens get ids 0..3 and are never split)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer, length=len(texts))
    return tok


def encode_with(tok, text: str) -> list[int]:
    """The loop's encode: special tokens in the text become their ids; none are added."""
    return tok.encode(text, add_special_tokens=False).ids


def decode_with(tok, ids) -> str:
    """The loop's decode: special tokens are kept (tokenizers drops them by default)."""
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


# ------------------------------------------------------------------- the tokenizer under test
def fixture_path(vocab_size: int) -> Path:
    if vocab_size not in FIXTURE_VOCABS:
        raise ValueError(f"vocab_size={vocab_size!r}: no tokenizer fixture (the contract's are "
                         f"{', '.join(map(str, FIXTURE_VOCABS))})")
    return FIXTURE_DIR / FIXTURE_NAME.format(vocab_size=vocab_size)


def tokenizer_json(vocab_size: int) -> str:
    """The fixture's tokenizer.json text, the same bytes the reference parses."""
    return fixture_path(vocab_size).read_text(encoding="utf-8")


@lru_cache(maxsize=8)
def tokenizer(vocab_size: int):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json(vocab_size))


def encode(text: str, vocab_size: int) -> np.ndarray:
    return np.asarray(encode_with(tokenizer(vocab_size), text), dtype=np.int64)


def decode(ids, vocab_size: int) -> str:
    return decode_with(tokenizer(vocab_size), ids)


def byte_tokens(vocab_size: int) -> np.ndarray:
    """The ids of the 256 single-byte tokens, ascending (-1 for each missing byte). The byte
    symbols come from `tokenizers`' own ByteLevel alphabet, not from the reference's table."""
    from tokenizers import pre_tokenizers

    tok = tokenizer(vocab_size)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if len(alphabet) != 256:
        raise ValueError(f"tokenizers' ByteLevel alphabet has {len(alphabet)} symbols, not 256")
    ids = [tok.token_to_id(c) for c in alphabet]
    return np.sort(np.asarray([-1 if i is None else i for i in ids], dtype=np.int64))
