"""A pretraining run on a real corpus, as `falsify train` makes it, read by the commands that
follow it: `falsify export` ships the run's tokenizer (recovered from the corpus its config
names: a checkpoint does not store it) in the HF layout and in GGUF, and `falsify distill` with
its defaults accepts the teacher `falsify train` made with its defaults (the same defaults mean
the same corpus, hence the same tokenizer)."""

from __future__ import annotations

import dataclasses
import json
import os
import warnings

import pytest

from falsify.cli import main
from falsify.llm import data as D
from falsify.llm import run as R
from falsify.llm.config import DATA_FIELDS, TrainConfig, model_config
from falsify.llm.distill import DistillConfig

TEXT = 'def f(x):\n    """Return x."""\n    return x + 1  # é\n'


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """rich wraps messages at the terminal's width (80 under xdist); the tests read them."""
    monkeypatch.setenv("COLUMNS", "400")


def _tokenizer_of(run) -> D.PreparedData:
    """The run's corpus prepared again from its recorded config (cached: no retraining)."""
    cfg = TrainConfig.from_dict(json.loads((run / "config.json").read_text())["train"],
                                source="test")
    return D.prepare_data(R.data_spec(cfg, model_config(cfg).vocab_size), cfg.cache_dir)


@pytest.fixture
def stdlib_run(tmp_path, monkeypatch):
    """`falsify train` on the first 300 kB of the stdlib, 2 steps, in a fresh project."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "max_steps=2", "warmup_steps=0", "max_bytes=300000", "batch_size=4",
                 "sample_tokens=0", "progress=false", "threads=1", "out_dir=pre"]) == 0
    return tmp_path / "pre"


def test_export_ships_a_pretraining_runs_tokenizer(stdlib_run, capsys):
    from transformers import AutoTokenizer

    capsys.readouterr()
    assert main(["export", "pre", "--out", "hf"]) == 0
    out = capsys.readouterr().out
    assert "bit-identical" in out and "no tokenizer" not in out and "synthetic" not in out
    ours = _tokenizer_of(stdlib_run).tokenizer
    assert json.loads(D.load_tokenizer("hf/tokenizer.json").to_str()) == \
        json.loads(ours.to_str())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = AutoTokenizer.from_pretrained("hf")
    ids = theirs(TEXT)["input_ids"]
    assert ids == D.encode(ours, TEXT) and theirs.decode(ids) == TEXT


def test_gguf_export_carries_a_pretraining_runs_tokenizer(stdlib_run, capsys):
    from gguf import GGUFReader

    from falsify.llm import gguf_io

    assert main(["export", "pre", "--out", "m.gguf", "--gguf"]) == 0
    assert "tokenizer.ggml.model = none" not in capsys.readouterr().out
    fields = GGUFReader("m.gguf").fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    ours = _tokenizer_of(stdlib_run).tokenizer
    assert fields["tokenizer.ggml.tokens"].contents() == \
        [t for t, _ in sorted(ours.get_vocab().items(), key=lambda kv: kv[1])]
    _, tok = gguf_io.load_model("m.gguf", "torch")
    assert D.encode(tok, TEXT) == D.encode(ours, TEXT)


def test_export_says_a_synthetic_run_has_no_tokenizer(tmp_path, capsys):
    R.train(R.tiny_config(tmp_path / "run", max_steps=2, warmup_steps=0))
    capsys.readouterr()
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "trained on the synthetic corpus" in capsys.readouterr().out
    assert not (tmp_path / "hf" / "tokenizer.json").exists()


def test_train_and_distill_default_to_the_same_data():
    """Field by field, and as the data spec each run prepares (the tokenizer's input)."""
    t, d = TrainConfig(), DistillConfig()
    assert {f: getattr(d, f) for f in DATA_FIELDS} == {f: getattr(t, f) for f in DATA_FIELDS}
    assert R.data_spec(d, model_config(d).vocab_size) == \
        R.data_spec(t, model_config(t).vocab_size)
    # DATA_FIELDS names every field of the data spec (the seed only feeds synthetic data)
    spec = {f.name for f in dataclasses.fields(D.DataSpec)}
    assert spec - {"seed"} <= set(DATA_FIELDS)


@pytest.mark.heavy
def test_distill_with_defaults_takes_the_teacher_train_made_with_defaults(tmp_path,
                                                                         monkeypatch, capsys):
    """The user's two commands on the whole default corpus (tokenized once, then cached);
    only the step counts are cut."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "max_steps=2", "warmup_steps=0", "sample_tokens=0", "progress=false",
                 "out_dir=pre"]) == 0
    capsys.readouterr()
    rc = main(["distill", "--teacher", "pre", "max_steps=2", "warmup_steps=0",
               "progress=false", "out_dir=student"])
    assert rc == 0, capsys.readouterr().out
    info = json.loads((tmp_path / "student" / "distill.json").read_text())
    assert info["student_params"] < info["teacher_params"]
    assert os.path.isfile(tmp_path / "student" / "summary.json")
