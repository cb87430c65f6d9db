"""Files falsify writes get the mode a plain open() would give them (0o666 & ~umask: 0644
under umask 022), not the 0600 of a temp file (mkstemp) or of safetensors' writer: an exported
model is read by other users and services (a model server, a shared cache)."""

from __future__ import annotations

import os
import stat

import pytest

from falsify.harness.generate import atomic_write
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
