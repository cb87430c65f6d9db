"""The byte-level BPE tokenizer as the training loop uses it: HF `tokenizers`, trained and
called by falsify/llm/data.py (train_tokenizer, encode, decode), refused by falsify/llm/preflight.py
when its vocabulary disagrees with the model's.

This is the kernel's optimized backend, bound in bpe-tokenizer-kernel-v1 beside the pure-Python
reference (falsify/reference/bpe_tokenizer.py). It lives under falsify/kernels/torch/ because that
is the binding
slot of a kernel's production CPU path (one kernel name, one file per backend: `pv audit`
looks here for its exports), although the work is done by `tokenizers`, not by torch. Every
function goes through the project's own entry points, so a change to the recipe in data.py or
to the check in preflight.py is what the contract sees.

The tokenizer under test is named by its `vocab_size`: the project's recipe trained on the
first TRAIN_BYTES of the standard-library corpus (the project's default corpus, in its
deterministic file order), once per process and size.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from falsify.llm import data
from falsify.llm.config import TrainConfig, model_config
from falsify.llm.preflight import PreflightError, preflight

# contract entry points; tokenizer_json / trained are the fixture the reference reads
__all__ = ["encode", "decode", "byte_tokens", "vocab_check"]

# Enough text for every vocabulary the contract draws (1024 needs 764 merges; this slice
# supports several thousand) while training in well under a second.
TRAIN_BYTES = 256 * 1024


@lru_cache(maxsize=8)
def trained(vocab_size: int):
    """The project's tokenizer recipe on a fixed corpus slice; refuses a short vocabulary
    (prepare_data's rule: the model is built with exactly `vocab_size` rows)."""
    spec = data.DataSpec(corpus="stdlib", max_bytes=TRAIN_BYTES, vocab_size=vocab_size)
    spec.validate()
    docs, _ = data.load_documents(spec)
    tok = data.train_tokenizer([d.text for d in docs], vocab_size)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: the first {TRAIN_BYTES} bytes of the "
                         f"stdlib corpus only support {tok.get_vocab_size()} tokens")
    return tok


def tokenizer_json(vocab_size: int) -> str:
    """The trained tokenizer as tokenizer.json text (what the reference reads)."""
    return trained(vocab_size).to_str()


def encode(text: str, vocab_size: int) -> np.ndarray:
    return np.asarray(data.encode(trained(vocab_size), text), dtype=np.int64)


def decode(ids, vocab_size: int) -> str:
    return data.decode(trained(vocab_size), ids)


def byte_tokens(vocab_size: int) -> np.ndarray:
    """The ids of the 256 single-byte tokens, ascending (-1 for each missing byte). The byte
    symbols come from `tokenizers`' own ByteLevel alphabet, not from the reference's table."""
    from tokenizers import pre_tokenizers

    tok = trained(vocab_size)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if len(alphabet) != 256:
        raise ValueError(f"tokenizers' ByteLevel alphabet has {len(alphabet)} symbols, not 256")
    ids = [tok.token_to_id(c) for c in alphabet]
    return np.sort(np.asarray([-1 if i is None else i for i in ids], dtype=np.int64))


def vocab_check(tokenizer_vocab: int, model_vocab: int) -> str:
    """Run the loop's preflight with a tokenizer of `tokenizer_vocab` tokens and the tiny model
    built with `model_vocab` rows: '' when it accepts, else its refusal message. The data
    figures are generous so that only the vocabulary can refuse."""
    cfg = TrainConfig(vocab_size=model_vocab)
    mcfg = model_config(cfg)
    try:
        preflight(cfg, mcfg, n_train_blocks=10**9, n_val_blocks=10**6,
                  tokenizer_vocab=tokenizer_vocab, device=torch.device("cpu"))
    except PreflightError as e:
        return str(e)
    return ""
