"""`falsify distill` end to end, on the tiny synthetic config: teachers from our checkpoints and
from an HF directory of another architecture (transformers' GPT-2), refusals before step 1
(vocabulary, tokenizer, a cache written for another teacher), and resume. The loop's
obligations are falsify/contracts/distill-v1.yaml's; these are the command's edges."""

from __future__ import annotations

import json

import pytest
import torch

from falsify.cli import main
from falsify.llm import data as D
from falsify.llm import distill as DI
from falsify.llm import run as R
from falsify.llm.model import ModelConfig, build_model

TINY = ["corpus=synthetic", "vocab_size=512", "hidden_size=32", "num_layers=1",
        "num_heads=2", "num_kv_heads=1", "intermediate_size=64", "seq_len=32",
        "synthetic_tokens=20000", "batch_size=4", "max_steps=4", "warmup_steps=0",
        "eval_interval=4", "save_interval=2", "eval_batches=1", "threads=1",
        "progress=false", "max_bytes=null"]



@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """rich wraps messages at the terminal's width (80 under xdist); the tests read them."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """A tiny teacher pretrained for a few steps on the synthetic corpus (our checkpoint)."""
    out = tmp_path_factory.mktemp("teacher") / "run"
    R.train(R.tiny_config(out, max_steps=4, warmup_steps=0, save_interval=4,
                          eval_interval=4, sample_tokens=0))
    return out


def _fingerprint(path):
    from falsify.llm.finetune_base import load_base

    return DI.weights_fingerprint(load_base(path, "torch", need_tokenizer=False).model)


def test_distill_from_our_checkpoint(teacher_run, tmp_path, capsys):
    before = _fingerprint(teacher_run)
    out = tmp_path / "student"
    rc = main(["distill", "--teacher", str(teacher_run), *TINY, f"out_dir={out}"])
    assert rc == 0, capsys.readouterr().out
    info = json.loads((out / "distill.json").read_text())
    assert info["teacher_fingerprint"] == before == _fingerprint(teacher_run)
    assert info["student_params"] < info["teacher_params"]
    assert info["kd_kernel"] == "falsify.kernels.torch.fused_linear_kd"
    assert (info["alpha"], info["temperature"]) == (0.5, 4.0)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m] == [1, 2, 3, 4]


def test_distill_resume_continues_bit_identically(teacher_run, tmp_path):
    """Killed after step 2 and resumed: the same losses and weights as a straight run (the
    teacher reloads, the data position and optimizer state come from the checkpoint)."""
    from falsify.llm.config import parse_overrides

    def cfg(out):
        return DI.DistillConfig.from_dict(
            {**parse_overrides(TINY), "teacher": str(teacher_run), "out_dir": str(out)},
            source="test", from_text=True)

    straight = DI.distill(cfg(tmp_path / "a"), keep_model=True)
    DI.distill(cfg(tmp_path / "b"), stop_after=2)
    resumed = DI.distill(cfg(tmp_path / "b"), resume="auto", keep_model=True)
    assert resumed.losses == straight.losses[2:]
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_hf_teacher_of_another_architecture(tmp_path, capsys):
    """Any HF-layout causal LM: a GPT-2 (not LLaMA) teacher over the same 512-token vocabulary,
    loaded by transformers; its weights are untouched."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=32, n_embd=32, n_layer=1,
                                     n_head=2, resid_pdrop=0.1, embd_pdrop=0.1))
    gpt.save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "student"
    rc = main(["distill", "--teacher", str(tmp_path / "gpt2"), *TINY, f"out_dir={out}"])
    assert rc == 0, capsys.readouterr().out
    info = json.loads((out / "distill.json").read_text())
    assert info["teacher_layout"] == "hf"
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2")
    assert DI.weights_fingerprint(reloaded) == info["teacher_fingerprint"]


def test_vocabulary_mismatch_is_refused_before_step_1(teacher_run, tmp_path, capsys):
    out = tmp_path / "student"
    rc = main(["distill", "--teacher", str(teacher_run), *TINY, "vocab_size=600",
               f"out_dir={out}"])
    text = capsys.readouterr().out
    assert rc == 2
    assert "vocabulary size 512" in text and "vocab_size 600" in text
    assert not (out / "metrics.jsonl").exists()


def test_tokenizer_mismatch_is_refused(tmp_path):
    """Same vocabulary size, different merges: the same ids would mean different text."""
    a = D.train_tokenizer(["def f(x):\n    return x + 1\n" * 50], 300)
    b = D.train_tokenizer(["class A:\n    pass\n" * 50], 300)
    D.save_tokenizer(b, tmp_path / "tokenizer.json")
    teacher = DI.Teacher(torch.nn.Linear(1, 1), 300, "t", str(tmp_path / "tokenizer.json"),
                         hf=False)
    data = D.PreparedData(None, None, 300, {}, "k", tokenizer=a, cache_path=tmp_path)
    with pytest.raises(DI.DistillConfigError, match="tokenizer .* differs"):
        DI.check_teacher(teacher, 300, data)
    D.save_tokenizer(a, tmp_path / "tokenizer.json")
    DI.check_teacher(teacher, 300, data)  # the same tokenizer passes


def test_cache_for_another_teacher_is_refused(tmp_path):
    """A top-k cache records the teacher's fingerprint; another teacher cannot reuse it."""
    mcfg = ModelConfig(vocab_size=512, hidden_size=32, num_layers=1, num_heads=2,
                       num_kv_heads=1, intermediate_size=64, max_seq_len=32)
    t1 = DI.Teacher(build_model(mcfg, "torch", seed=1), 512, "t1", None, hf=False)
    t2 = DI.Teacher(build_model(mcfg, "torch", seed=2), 512, "t2", None, hf=False)
    cfg = DI.DistillConfig.from_dict(
        {**{k: v for k, v in (x.split("=") for x in TINY)}, "out_dir": str(tmp_path / "a"),
         "teacher_topk": "4", "teacher_cache": str(tmp_path / "cache")},
        source="test", from_text=True)
    DI.distill(cfg, teacher=t1)
    man = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert man["k"] == 4 and man["teacher"] == DI.weights_fingerprint(t1.module)
    with pytest.raises(DI.DistillConfigError, match="teacher is"):
        DI.distill(cfg.replace(out_dir=str(tmp_path / "b")), teacher=t2)


def test_config_errors_name_the_field(tmp_path, capsys):
    assert main(["distill", "alpha=1.5"]) == 2
    assert "alpha" in capsys.readouterr().out
    assert main(["distill", f"teacher_cache={tmp_path / 'cache'}"]) == 2
    assert "teacher_topk" in capsys.readouterr().out
