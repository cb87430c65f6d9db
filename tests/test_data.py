"""Data: deterministic stdlib corpus, byte-level BPE with lossless roundtrip and atomic special
tokens, file-level split, cache, FIM (PSM), packing, seeded resumable batches."""

import json

import numpy as np
import pytest

from falsify.llm import data as D

SMALL_BYTES = 400_000  # a slice of the stdlib: tokenizer training well under a second


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    spec = D.DataSpec(max_bytes=SMALL_BYTES, vocab_size=512, val_fraction=0.1)
    return D.prepare_data(spec, cache), spec, cache


def test_stdlib_files_sorted_deterministic_no_site_packages():
    a, b = D.stdlib_files(), D.stdlib_files()
    assert a == b and len(a) > 100
    rel = [p.relative_to(D.stdlib_root()).as_posix() for p in a]
    assert rel == sorted(rel)
    assert not any("site-packages" in r for r in rel)
    assert all(r.endswith(".py") for r in rel)


def test_limits_apply_in_order():
    docs, info = D.load_documents(D.DataSpec(max_files=5))
    assert len(docs) == 5
    docs2, info2 = D.load_documents(D.DataSpec(max_bytes=50_000))
    assert info2["bytes"] <= 50_000 or len(docs2) == 1
    assert [d.name for d in docs2] == [d.name for d in D.load_documents(
        D.DataSpec(max_files=len(docs2)))[0]]


def test_tokenizer_vocab_and_special_ids(prepared):
    data, spec, _ = prepared
    tok = data.tokenizer
    assert tok.get_vocab_size() == spec.vocab_size
    for i, t in enumerate(D.SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i == data.special_ids[t]
    # sentinels are atomic: one id each, never split into bytes
    text = f"{D.FIM_PREFIX}a{D.FIM_SUFFIX}b{D.FIM_MIDDLE}c{D.EOS}"
    ids = D.encode(tok, text)
    assert [i for i in ids if i < 4] == [1, 3, 2, 0]


@pytest.mark.parametrize("text", [
    "def f(x):\n\treturn  x ** 2   # trailing spaces   \n\n\n",
    "    indented\r\n\tmixed\ttabs  \n",
    "unicode: ünïcødé, 中文, emoji 🚀🐍, combining e\u0301",
    "",
    " leading space and <|endoftext|> inside text",
    bytes(range(32, 127)).decode() + "\x00\x01\x7f",
])
def test_roundtrip_is_lossless(prepared, text):
    tok = prepared[0].tokenizer
    assert D.decode(tok, D.encode(tok, text)) == text


def test_every_byte_is_known(prepared):
    """Byte-level: all 256 byte values (as their UTF-8 encodings of code points 0..255) encode
    without an unknown token and decode back."""
    tok = prepared[0].tokenizer
    text = "".join(chr(c) for c in range(256))
    ids = D.encode(tok, text)
    assert all(0 <= i < tok.get_vocab_size() for i in ids)
    assert D.decode(tok, ids) == text


def test_split_is_by_file_disjoint_and_stable(prepared):
    data, spec, _ = prepared
    docs, _ = D.load_documents(spec)
    train, val = D.split_documents(docs, spec.val_fraction)
    assert val and train
    assert not {d.name for d in train} & {d.name for d in val}
    assert len(train) + len(val) == len(docs)
    assert [d.name for d in val] == [d.name for d in D.split_documents(docs, 0.1)[1]]
    assert len(data.train) == len(train) and len(data.val) == len(val)
    # each document is exactly its own tokens
    tok = data.tokenizer
    assert D.decode(tok, data.train.doc(0)) == train[0].text


def test_cache_hit_is_identical_and_keyed_by_vocab(prepared):
    data, spec, cache = prepared
    again = D.prepare_data(spec, cache)
    assert again.info["cached"] and not data.info["cached"]
    assert again.key == data.key
    assert np.array_equal(again.train.tokens, data.train.tokens)
    assert np.array_equal(again.val.offsets, data.val.offsets)
    other = D.prepare_data(D.DataSpec(max_bytes=SMALL_BYTES, vocab_size=600, val_fraction=0.1),
                           cache)
    assert other.key != data.key and other.tokenizer.get_vocab_size() == 600
    assert not any(p.name.startswith(".") for p in cache.iterdir())  # no temp dirs left


def test_vocab_too_large_for_corpus_is_an_error(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("abc abc abc")
    with pytest.raises(D.DataError, match="vocab_size"):
        D.prepare_data(D.DataSpec(corpus="none", data_files=(str(f),), vocab_size=4000,
                                  val_fraction=0.0), tmp_path / "c")


def test_jsonl_user_files(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "print(1)\n"}) + "\n\n" + json.dumps({"text": "x = 2\n"}))
    docs = D._user_documents((str(f),), "text")
    assert [d.text for d in docs] == ["print(1)\n", "x = 2\n"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"content": "x"}) + "\n")
    with pytest.raises(D.DataError, match=r"bad.jsonl:1.*'text'"):
        D._user_documents((str(bad),), "text")
    with pytest.raises(D.DataError, match="does not exist"):
        D._user_documents((str(tmp_path / "nope.txt"),), "text")


def test_spec_validation():
    with pytest.raises(D.DataError, match="corpus"):
        D.DataSpec(corpus="web").validate()
    with pytest.raises(D.DataError, match="val_fraction"):
        D.DataSpec(val_fraction=1.0).validate()


# ----------------------------------------------------------------------------- FIM, packing
def _docs(n=50, seed=0):
    rng = np.random.default_rng(seed)
    ds = [rng.integers(4, 100, size=int(rng.integers(0, 40))).astype(np.uint16)
          for _ in range(n)]
    off = np.concatenate([[0], np.cumsum([len(d) for d in ds])]).astype(np.int64)
    return D.TokenDocs(np.concatenate(ds).astype(np.uint16), off), ds


def _split_stream(stream):
    out, cur = [], []
    for t in stream.tolist():
        if t == 0:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out


def test_fim_rate_zero_is_identity_plus_eos():
    docs, ds = _docs()
    s = D.token_stream(docs, 0, 0.0)
    assert [list(d) for d in ds] == _split_stream(s)


def test_fim_psm_layout_reconstructs_the_document():
    docs, ds = _docs()
    s = D.token_stream(docs, 0, fim_rate=1.0, fim_seed=3)
    for orig, got in zip(ds, _split_stream(s)):
        assert got[0] == 1 and got.count(1) == got.count(3) == got.count(2) == 1
        i_suf, i_mid = got.index(3), got.index(2)
        assert 0 < i_suf < i_mid
        prefix, suffix, middle = got[1:i_suf], got[i_suf + 1:i_mid], got[i_mid + 1:]
        assert prefix + middle + suffix == list(orig)


def test_fim_is_seeded_and_rate_is_respected():
    docs, _ = _docs(400)
    a = D.token_stream(docs, 0, 0.5, fim_seed=11)
    assert np.array_equal(a, D.token_stream(docs, 0, 0.5, fim_seed=11))
    assert not np.array_equal(a, D.token_stream(docs, 0, 0.5, fim_seed=12))
    frac = np.mean([d[0] == 1 for d in _split_stream(a) if d])
    assert 0.4 < frac < 0.6  # 400 docs: binomial sd 0.025, so +-4 sd
    with pytest.raises(D.DataError, match="fim_rate"):
        D.token_stream(docs, 0, 1.5)


def test_blocks_shift_targets_by_one():
    stream = np.arange(1, 42, dtype=np.uint16)  # 41 tokens
    assert D.num_blocks(len(stream), 8) == 5
    x, y = D.block(stream, 4, 8)
    assert list(x) == list(range(33, 41)) and list(y) == list(range(34, 42))


def test_sampler_epochs_steps_and_resume():
    stream = np.arange(1, 8 * 50 + 2, dtype=np.int64) % 60000
    s = D.BatchSampler(stream, 8, batch_size=3, grad_accum=2, epochs=2, seed=5, data_key="k")
    assert s.n_blocks == 50 and s.steps_per_epoch == 50 // 6 == 8 and s.total_steps == 16
    seen = []
    for _ in range(8):
        micro = s.next_step()
        assert len(micro) == 2 and micro[0][0].shape == (3, 8)
        for x, y in micro:
            assert np.array_equal(y[:, :-1], x[:, 1:])
            seen += [int(r[0]) // 8 for r in x]
    assert len(set(seen)) == len(seen) == 48  # one epoch: no block twice
    assert (s.epoch, s.step_in_epoch) == (1, 0)
    state = s.state_dict()
    nxt = s.next_step()
    t = D.BatchSampler(stream, 8, 3, 2, 2, 5, "k")
    t.load_state_dict(state)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(nxt, t.next_step()))
    for _ in range(7):
        s.next_step()
    with pytest.raises(StopIteration):
        s.next_step()
    u = D.BatchSampler(stream, 8, 3, 2, 2, 5, "other-data")
    with pytest.raises(D.DataError, match="data_key"):
        u.load_state_dict(state)


def test_synthetic_data_is_deterministic():
    a = D.prepare_data(D.DataSpec(corpus="synthetic", vocab_size=256, synthetic_tokens=5000))
    b = D.prepare_data(D.DataSpec(corpus="synthetic", vocab_size=256, synthetic_tokens=5000))
    assert np.array_equal(a.train.tokens, b.train.tokens) and a.key == b.key
    assert a.tokenizer is None and int(a.train.tokens.min()) >= 4
    assert a.train.num_tokens + a.val.num_tokens >= 5000
