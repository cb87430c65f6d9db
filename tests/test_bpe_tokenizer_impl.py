"""Hand-written cases for the byte-level BPE tokenizer the contract cannot express: the
reference against HF tokenizers on a hand-built merge table (ranks a trainer never writes),
refusals of tokenizer.json settings the reference does not implement, preflight's message, and
the merge-order mutants on code text alone."""

from __future__ import annotations

import json

import pytest

from falsify.kernels.torch import bpe_tokenizer as impl
from falsify.mutants import bpe_tokenizer as mutants
from falsify.reference import bpe_tokenizer as ref

CODE = "    def __init__(self, value):\n        self.value = value  # it's 42\n"


def _hand_built():
    """A byte-level BPE whose merge list puts a pair built by a merge (ab, c) *before* a pair
    of plain bytes (c, d): applying merges all at once per rank, or by first occurrence, gives
    other ids than one lowest-rank merge at a time, which is what tokenizers does."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    sym = ref.BYTE_TO_SYMBOL
    vocab = {sym[b]: i for i, b in enumerate(range(256))}
    merges = [("a", "b"), ("ab", "c"), ("c", "d"), ("b", "c"), ("abc", "d"), ("Ġ", "a")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    return tok


@pytest.mark.parametrize("text", ["abcd", "abcdabcd", "bcd abc", "aabbccdd ab<|endoftext|>cd",
                                  "abcabc\n\n  abcd\t", ""])
def test_reference_matches_tokenizers_on_a_hand_built_merge_table(text):
    tok = _hand_built()
    model = ref.ByteLevelBPE.from_json(tok.to_str())
    assert model.encode(text) == tok.encode(text, add_special_tokens=False).ids
    assert model.decode(model.encode(text)) == text


@pytest.mark.parametrize("edit, field", [
    (lambda j: j.update(normalizer={"type": "NFC"}), "normalizer"),
    (lambda j: j["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
    (lambda j: j["model"].update(dropout=0.1), "model.dropout"),
    (lambda j: j["added_tokens"][0].update(lstrip=True), "added_tokens[0].lstrip"),
    (lambda j: j["model"].update(type="WordPiece"), "model.type"),
])
def test_reference_refuses_settings_it_does_not_implement(edit, field):
    spec = json.loads(_hand_built().to_str())
    edit(spec)
    with pytest.raises(ref.TokenizerSpecError, match=field.replace("[", r"\[")):
        ref.ByteLevelBPE.from_json(json.dumps(spec))


def test_preflight_names_both_sizes_and_accepts_equal_ones():
    assert impl.vocab_check(2048, 2048) == ""
    msg = impl.vocab_check(2048, 2049)
    assert "2048" in msg.split() and "2049" in msg.split()


def test_merge_order_mutants_differ_on_code_alone():
    want = list(ref.encode(CODE, 1024))
    assert list(impl.encode(CODE, 1024)) == want
    assert list(mutants.encode_first_pair(CODE, 1024)) != want
    assert list(mutants.encode_highest_rank(CODE, 1024)) != want


def test_code_points_newer_than_this_python_still_round_trip():
    """U+1C89 is a letter in tokenizers' Unicode tables and unassigned in Python 3.11's: the
    ids may differ from the reference (outside BPE-EQ-001's domain) but decode(encode(x))
    still gives x back on both."""
    text = "a\u1c89b \U000105c0 1\U00010d40"
    for backend in (impl, ref):
        assert backend.decode(backend.encode(text, 300), 300) == text
