"""Files falsify writes get the mode a plain open() would give them (0o666 & ~umask: 0644
under umask 022), not the 0600 of a temp file (mkstemp) or of safetensors' writer: an exported
model is read by other users and services (a model server, a shared cache)."""

from __future__ import annotations

import os
import stat

import pytest

from falsify.harness.files import atomic_write
from falsify.llm import gguf_io as G
from falsify.llm import hf
from tests.test_finetune import tiny_model


@pytest.fixture(params=[0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_exports_and_written_files_follow_the_umask(tmp_path, umask):
    want = 0o666 & ~umask
    model = tiny_model()
    out = hf.export_hf(model, tmp_path / "hf")
    assert _mode(out / "model.safetensors") == want
    assert _mode(out / "config.json") == want
    assert _mode(G.write_gguf(model, tmp_path / "m.gguf", None, "f32")) == want
    atomic_write(tmp_path / "c.yaml", "a: 1\n")
    assert _mode(tmp_path / "c.yaml") == want


def test_state_files_follow_the_umask(tmp_path, umask, monkeypatch):
    """The ledger, the run manifest and the stamp cache are read by CI steps and by other users
    of a shared checkout: they get a plain file's mode too."""
    from falsify.harness import handover, ledger
    from falsify.harness.stamp_cache import StampCache

    want = 0o666 & ~umask
    path = ledger.merge([], [], tmp_path / ".falsify" / "ledger.json")
    assert _mode(path) == want
    handover.atomic_write_json(tmp_path / ".falsify" / "handover.json", {"runs": []})
    assert _mode(tmp_path / ".falsify" / "handover.json") == want
    monkeypatch.setenv("FALSIFY_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "m.py"
    src.write_text("x = 1\n")
    cache = StampCache("modes", "scope")
    cache.put("k", 1, {src})
    cache.save()
    assert _mode(cache.path) == want


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    from falsify.harness.files import atomic_path

    target = tmp_path / "out.json"
    target.write_text("old\n")
    with pytest.raises(RuntimeError, match="writer failed"):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    atomic_write(target, b"new\n", durable=True)
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
