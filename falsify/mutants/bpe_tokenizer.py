"""Buggy variants of the byte-level BPE tokenizer's bindings (falsify.kernels.torch.bpe_tokenizer);
each has the signature of the function it replaces.

The merge-order mutants run the classic loop of falsify/reference/bpe_tokenizer.py on the same
fixture tokenizer.json with the pair choice changed: the bug is in the loop, not in the data.
The recipe mutants train with the project's settings (on the corpus slice the fixtures were
made from) but one thing dropped.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from falsify.kernels.torch import bpe_tokenizer as impl
from falsify.llm import data
from falsify.reference.bpe_tokenizer import BYTE_TO_SYMBOL, ByteLevelBPE


class _FirstPair(ByteLevelBPE):
    def merge(self, symbols):
        """Merges the leftmost pair that has any rank, not the lowest-ranked pair."""
        word = list(symbols)
        while True:
            i = next((i for i in range(len(word) - 1)
                      if (word[i], word[i + 1]) in self.ranks), None)
            if i is None:
                return word
            word[i:i + 2] = [word[i] + word[i + 1]]


class _HighestRank(ByteLevelBPE):
    def merge(self, symbols):
        """Merges the pair of highest rank first (ranks read in reverse)."""
        word = list(symbols)
        while True:
            cands = [(self.ranks[(a, b)], i) for i, (a, b) in enumerate(zip(word, word[1:]))
                     if (a, b) in self.ranks]
            if not cands:
                return word
            _, i = max(cands, key=lambda c: (c[0], -c[1]))
            word[i:i + 2] = [word[i] + word[i + 1]]


@lru_cache(maxsize=8)
def _loop(cls, vocab_size: int) -> ByteLevelBPE:
    base = ByteLevelBPE.from_json(impl.tokenizer_json(vocab_size))
    return cls(base.vocab, base.ranks, base.added, base.use_regex)


def encode_first_pair(text: str, vocab_size: int) -> np.ndarray:
    return np.asarray(_loop(_FirstPair, vocab_size).encode(text), dtype=np.int64)


def encode_highest_rank(text: str, vocab_size: int) -> np.ndarray:
    return np.asarray(_loop(_HighestRank, vocab_size).encode(text), dtype=np.int64)


@lru_cache(maxsize=8)
def _recipe(vocab_size: int, special: bool, drop_byte: int | None):
    """impl.train_tokenizer's recipe with the special tokens left unregistered, or one byte's
    symbol left out of the initial alphabet."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    spec = data.DataSpec(corpus="stdlib", max_bytes=impl.TRAIN_BYTES, vocab_size=vocab_size)
    docs, _ = data.load_documents(spec)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if drop_byte is not None:
        alphabet = [c for c in alphabet if c != BYTE_TO_SYMBOL[drop_byte]]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size,
                                  special_tokens=impl.SPECIAL_TOKENS if special else [],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator([d.text for d in docs], trainer, length=len(docs))
    return tok


def encode_specials_unregistered(text: str, vocab_size: int) -> np.ndarray:
    """The tokenizer trained without special_tokens: `<|endoftext|>` is BPE-encoded as text."""
    tok = _recipe(vocab_size, special=False, drop_byte=None)
    return np.asarray(impl.encode_with(tok, text), dtype=np.int64)


def byte_tokens_missing_byte(vocab_size: int) -> np.ndarray:
    """The initial alphabet without byte 0xFF (never in UTF-8 text, so training never adds
    it back): a tokenizer that cannot represent every byte."""
    from tokenizers import pre_tokenizers

    tok = _recipe(vocab_size, special=True, drop_byte=0xFF)
    ids = [tok.token_to_id(c) for c in pre_tokenizers.ByteLevel.alphabet()]
    return np.sort(np.asarray([-1 if i is None else i for i in ids], dtype=np.int64))


def decode_skipping_specials(ids, vocab_size: int) -> str:
    """`Tokenizer.decode`'s default, skip_special_tokens=True: FIM sentinels and
    `<|endoftext|>` vanish from the decoded text."""
    return impl.tokenizer(vocab_size).decode([int(i) for i in ids])


def vocab_check_missing(tokenizer_vocab: int, model_vocab: int) -> str:
    """A preflight without the vocabulary comparison: every pair of sizes is accepted."""
    return ""
