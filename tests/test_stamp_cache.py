"""Fingerprints persist across processes in the user's cache directory, and are trusted only
while every file and directory they were computed from has the same content
(falsify/harness/stamp_cache.py)."""

from __future__ import annotations

import json

import pytest

from falsify.harness import fingerprint, model, stamp_cache
from falsify.harness.model import load_contract
from tests import test_fingerprint

proj = test_fingerprint.proj  # the temporary project, a fixture
_hashes = test_fingerprint._hashes


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    d = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("FALSIFY_CACHE_DIR", str(d))
    fingerprint._STORES.clear()
    yield d
    fingerprint._STORES.clear()


def _fresh_process_state():
    """What a new process starts with: no memory of hashes, stores or stamps."""
    fingerprint.reset_cache()
    fingerprint._STORES.clear()


def _walks(monkeypatch) -> list:
    calls = []
    real = fingerprint._Closure.run

    def counted(self, refs):
        calls.append(refs)
        return real(self, refs)

    monkeypatch.setattr(fingerprint._Closure, "run", counted)
    return calls


def _save():
    for s in fingerprint._STORES.values():
        s.save()


def test_a_second_process_reuses_the_hashes_without_walking(proj, monkeypatch, cache_dir):
    first = _hashes(proj)
    _save()
    assert list(cache_dir.glob("fingerprints-*.json"))
    _fresh_process_state()
    walks = _walks(monkeypatch)
    assert _hashes(proj) == first
    assert walks == []


@pytest.mark.parametrize("edit", ["content", "new module beside it"])
def test_a_changed_file_or_directory_is_walked_again(proj, monkeypatch, edit):
    first = _hashes(proj)
    _save()
    if edit == "content":
        p = proj / "fp_helper.py"
        p.write_text(p.read_text().replace("return x", "return x + 0"))
    else:
        (proj / "fp_new.py").write_text("X = 1\n")
    _fresh_process_state()
    walks = _walks(monkeypatch)
    second = _hashes(proj)
    assert walks, "an entry whose stamps changed was trusted"
    if edit == "content":
        assert second != first  # f calls h: every check that runs f is stale
    else:
        assert second == first  # nothing reached changed: same hashes, recomputed


def test_a_damaged_or_foreign_cache_file_is_an_empty_cache(proj, monkeypatch, cache_dir):
    first = _hashes(proj)
    _save()
    for f in cache_dir.glob("fingerprints-*.json"):
        data = json.loads(f.read_text())
        for e in data["entries"].values():
            e["value"][0] = "0" * 64  # a forged hash with the right stamps...
        f.write_text(json.dumps({**data, "format": stamp_cache.FORMAT + 1}))  # ...other format
    _fresh_process_state()
    assert _hashes(proj) == first
    for f in cache_dir.glob("fingerprints-*.json"):
        f.write_text("{not json")
    _fresh_process_state()
    assert _hashes(proj) == first


def test_the_cache_lives_outside_the_project(proj, cache_dir):
    _hashes(proj)
    _save()
    assert not list(proj.rglob("fingerprints-*.json"))
    assert stamp_cache.cache_dir() == cache_dir


def test_schema_check_is_remembered_by_content(proj, monkeypatch):
    from falsify.harness import model

    path = proj / "contracts" / "fp-v1.yaml"
    load_contract(path)
    calls = []
    monkeypatch.setattr(model, "schema_errors", lambda d: calls.append(1) or [])
    load_contract(path)
    assert calls == []  # same text: not checked again
    path.write_text(path.read_text() + "\n# edited\n")
    load_contract(path)
    assert calls == [1]


# ---------------------------------------------------------------- the contract parse cache
def _fresh_parse_store():
    model._parse_store.cache_clear()


def _located(path):
    from falsify.harness import yamlio

    return yamlio.load(yamlio.read_text(path), str(path))


def test_a_cached_parse_is_the_parse_for_every_library_contract(cache_dir, monkeypatch):
    """A second process reads every library contract from the cache without parsing it, with
    the same data, the same line for every value and the same findings as a fresh parse."""
    from falsify.harness import yamlio
    from falsify.harness.project import library_dir

    _fresh_parse_store()
    files = sorted(library_dir().glob("*.yaml"))
    first = {p: load_contract(p) for p in files}
    model._parse_store().save()
    _fresh_parse_store()
    assert len(model._parse_store().entries) == len(files)
    parse = yamlio.load
    monkeypatch.setattr(yamlio, "load", lambda *a, **k: pytest.fail("parsed, not cached"))
    cached = {p: load_contract(p) for p in files}
    monkeypatch.setattr(yamlio, "load", parse)
    for p in files:
        again, fs = cached[p]
        assert again.raw == first[p][0].raw and fs == first[p][1]
        fresh = _located(p)
        assert again.located.lines == fresh.lines and again.located.data == fresh.data


def test_an_edited_contract_is_parsed_afresh_and_a_bad_entry_is_a_miss(tmp_path, cache_dir):
    from falsify.harness.project import library_dir

    p = tmp_path / "softmax-kernel-v1.yaml"
    p.write_text((library_dir() / "softmax-kernel-v1.yaml").read_text())
    _fresh_parse_store()
    load_contract(p)
    model._parse_store().save()
    # the edit moves every line after the first down by one: a stale parse would keep them
    p.write_text("# a comment\n" + p.read_text())
    _fresh_parse_store()
    c, _ = load_contract(p)
    assert c.located.lines == _located(p).lines
    assert c.line("metadata") == 2
    # an entry edited by hand (here: not a parse at all) is read as a miss
    store = model._parse_store()
    for e in store.entries.values():
        e["value"] = {"data": 1}
    c2, _ = load_contract(p)
    assert c2.located.lines == _located(p).lines
