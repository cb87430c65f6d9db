"""Hand-written cases for the byte-level BPE tokenizer the contract cannot express: the
reference against HF tokenizers on a hand-built merge table (ranks a trainer never writes),
refusals of tokenizer.json settings the reference does not implement, preflight's message, the
merge-order mutants on code text alone, and the recipe itself: the contract reads fixture files
the recipe wrote, so a change to the recipe's settings is caught here."""

from __future__ import annotations

import json

import pytest

from falsify.kernels.torch import bpe_tokenizer as impl
from falsify.llm import data, preflight
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
    assert preflight.vocab_check(2048, 2048) == ""
    msg = preflight.vocab_check(2048, 2049)
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


# A small corpus with repeated words, so a few dozen merges are learned in well under a second.
CORPUS = [CODE, "def f(x):\n    return x + 1\n" * 20, "the cat sat on the mat; " * 30,
          "café naïve 中文 ✓\n"]


def _fresh(vocab_size=300):
    return impl.train_tokenizer(CORPUS, vocab_size)


def test_the_recipe_makes_a_tokenizer_the_reference_accepts():
    tok = _fresh()
    model = ref.ByteLevelBPE.from_json(tok.to_str())  # refuses any setting it lacks
    assert -1 not in model.byte_token_ids()  # all 256 bytes, used in the corpus or not
    assert model.added == {t: i for i, t in enumerate(impl.SPECIAL_TOKENS)}
    assert len(model.ranks) > 0
    text = CODE + "<|endoftext|>the mat" + impl.FIM_MIDDLE
    assert model.encode(text) == impl.encode_with(tok, text)
    assert impl.decode_with(tok, impl.encode_with(tok, text)) == text


def _settings(text: str) -> dict:
    """A tokenizer.json without what training learns (the vocabulary and the merges)."""
    spec = json.loads(text)
    spec["model"] = {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges")}
    return spec


@pytest.mark.parametrize("vocab_size", ref.FIXTURE_VOCABS)
def test_the_fixtures_hold_the_recipes_settings(vocab_size):
    """The contract checks the fixture files; a recipe whose settings moved on since they were
    written (`python -m falsify.llm.bpe_fixtures`) makes them stale, and this fails."""
    fixture = impl.tokenizer_json(vocab_size)
    assert _settings(fixture) == _settings(_fresh().to_str())
    assert impl.tokenizer(vocab_size).get_vocab_size() == vocab_size


def test_the_loop_runs_the_recipe_the_contract_checks():
    assert (data.train_tokenizer, data.encode, data.decode) == (
        impl.train_tokenizer, impl.encode_with, impl.decode_with)
    assert (data.EOS, data.SPECIAL_TOKENS) == (impl.EOS, impl.SPECIAL_TOKENS)


@pytest.mark.parametrize("backend", [impl, ref])
def test_a_vocab_size_without_a_fixture_is_refused_by_name(backend):
    with pytest.raises(ValueError, match="vocab_size=512: no tokenizer fixture"):
        backend.encode("x", 512)


def test_the_fixture_writer_writes_what_the_backends_read(tmp_path):
    from falsify.llm import bpe_fixtures

    (path,) = bpe_fixtures.write_fixtures(tmp_path, vocab_sizes=(300,))
    assert path.name == impl.fixture_path(300).name
    model = ref.ByteLevelBPE.from_json(path.read_text(encoding="utf-8"))
    assert len(model.vocab) == 300 and -1 not in model.byte_token_ids()
