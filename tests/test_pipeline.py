"""`falsify pipeline` on a small preset: all seven stages run, each reading the previous
stage's model; a rerun skips every stage; changing one stage's settings reruns that stage and
those after it only; an unknown stage is refused. Slow (a real chain, minutes on 2 cores):
CI runs it in its own step."""

from __future__ import annotations

import json

import pytest
import yaml

from falsify.cli import main
from falsify.llm import pipeline as PL

SMALL = {
    "pretrain": {"model": "tiny", "corpus": "stdlib", "max_bytes": 400_000, "vocab_size": 512,
                 "hidden_size": 64, "num_layers": 1, "num_heads": 4, "num_kv_heads": 2,
                 "intermediate_size": 128, "seq_len": 64, "max_steps": 6, "warmup_steps": 0,
                 "batch_size": 4, "eval_interval": 6, "eval_batches": 1, "save_interval": 6,
                 "sample_tokens": 0, "progress": False},
    # every projection of the student has a multiple of 32 input columns (int4, group 32)
    "distill": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
                "intermediate_size": 64, "max_steps": 4, "warmup_steps": 0, "batch_size": 4,
                "eval_interval": 4, "eval_batches": 1, "save_interval": 4, "progress": False},
    "finetune": {"max_steps": 2, "method": "qlora", "batch_size": 2, "progress": False,
                 "sample_tokens": 0},
    "merge": {},
    "prune": {"method": "wanda", "sparsity": 0.5, "calibration": 2},
    "quantize": {"method": "int8"},
    "eval": {"samples": 1, "k": "1", "limit": 2, "max_new_tokens": 8, "temperature": 0},
}



@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """rich wraps messages at the terminal's width (80 under xdist); the tests read them."""
    monkeypatch.setenv("COLUMNS", "400")


@pytest.mark.heavy
def test_pipeline_runs_resumes_and_reruns_what_changed(tmp_path, capsys):
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    out = tmp_path / "out"
    assert main(["pipeline", "--config", str(cfg), "--out", str(out)]) == 0, \
        capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    assert [r["stage"] for r in report] == list(PL.STAGES)
    assert not any(r["skipped"] for r in report)
    by = {r["stage"]: r for r in report}
    for stage in ("pretrain", "distill", "finetune", "merge", "prune", "quantize"):
        assert by[stage]["perplexity"] > 1 and by[stage]["size_bytes"] > 0, stage
    assert 0.0 <= by["eval"]["pass_at_1"] <= 1.0
    # the int8 layout is smaller than the fp32 model it came from
    assert by["quantize"]["size_bytes"] < by["prune"]["size_bytes"]
    # the distilled student is smaller than its teacher, and transformers loads it exported
    assert by["distill"]["size_bytes"] < by["pretrain"]["size_bytes"]
    assert main(["export", by["distill"]["model"], "--out", str(tmp_path / "student-hf")]) == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    student = AutoModelForCausalLM.from_pretrained(tmp_path / "student-hf")
    assert student.config.hidden_size == SMALL["distill"]["hidden_size"]
    assert AutoTokenizer.from_pretrained(tmp_path / "student-hf").eos_token == "<|endoftext|>"
    capsys.readouterr()

    assert main(["pipeline", "--config", str(cfg), "--out", str(out)]) == 0
    again = json.loads((out / "report.json").read_text())
    assert all(r["skipped"] for r in again)

    cfg.write_text(yaml.safe_dump({**SMALL, "quantize": {"method": "int4", "group": 32}}))
    assert main(["pipeline", "--config", str(cfg), "--out", str(out)]) == 0
    third = {r["stage"]: r["skipped"] for r in json.loads((out / "report.json").read_text())}
    assert third == {"pretrain": True, "distill": True, "finetune": True, "merge": True,
                     "prune": True, "quantize": False, "eval": False}


def test_unknown_stage_is_refused(tmp_path, capsys):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("pretrain: {}\ndistil: {}\n")
    assert main(["pipeline", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "unknown stage 'distil'" in capsys.readouterr().out


def test_a_stage_must_be_a_mapping(tmp_path, capsys):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("prune: 0.5\n")
    assert main(["pipeline", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "must be a mapping" in capsys.readouterr().out


@pytest.mark.parametrize("settings, message", [
    ("prune: {sparsity: 0.5, calibrate: 2}",
     "stage 'prune': setting 'calibrate': unknown (settings: method, sparsity, pattern"),
    ("quantize: {group: sixty-four}", "stage 'quantize': setting 'group': 'sixty-four' is not "
                                      "an integer"),
    ("eval: {samples: 1, temperature: hot}", "stage 'eval': setting 'temperature': 'hot' is "
                                             "not a number"),
    ("quantize: {method: int3}", "stage 'quantize': setting 'method': 'int3': choose from "
                                 "int8, int4, nf4"),
    ("quantize: {asymmetric: 1}", "stage 'quantize': setting 'asymmetric': 1 is not true or "
                                  "false"),
    ("prune: {out: elsewhere}", "stage 'prune': setting 'out' is set by the pipeline"),
    # the config-field stages: read as their command reads key=value overrides
    ("pretrain: {max_step: 3}", "stage 'pretrain': unknown config field 'max_step'"),
    ("distill: {alpha: lots}", "stage 'distill': config field 'alpha': cannot parse 'lots'"),
    ("finetune: {lora_r: x}", "stage 'finetune': config field 'lora_r': cannot parse 'x' as "
                              "int"),
    ("finetune: {group_size: 4}", "stage 'finetune': config field group_size=4: only "
                                  "method=grpo reads it (method='qlora')"),
    ("finetune: {method: grpo, group_size: 1}", "stage 'finetune': config field group_size=1: "
                                                "must be >= 2"),
])
def test_a_bad_stage_setting_names_the_file_stage_and_key(tmp_path, capsys, settings, message):
    """Settings the pipeline hands to a library function are checked up front, before any
    stage runs (as the command's parser would refuse them), naming file, stage and key."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(settings + "\n")
    assert main(["pipeline", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    out = capsys.readouterr().out
    assert f"{cfg}: {message}" in out, out
    assert not (tmp_path / "o").exists()


def test_stage_settings_convert_as_the_flags_did():
    assert PL.stage_settings("prune", {"sparsity": 1, "pattern": None, "calibration": "4"}) \
        == {"sparsity": 1.0, "calibration": 4}
    assert PL.stage_settings("eval", {"k": 1, "text": "a.py"}) == {"k": "1", "text": ["a.py"]}
    assert PL.stage_settings("quantize", {"double_quant": True, "asymmetric": False}) \
        == {"double_quant": True, "asymmetric": False}


def test_a_list_setting_reaches_the_stage_as_the_same_list(tmp_path, capsys):
    """`data_files` is a list: the stage's overrides carry it in the command line's list syntax
    (a,b), which reads back to the same list; an item with a comma cannot be carried and is
    refused up front, naming the file, stage and key."""
    from falsify.llm.config import TrainConfig, parse_overrides

    files = ["a.txt", "sub/b.txt"]
    cfg = TrainConfig.from_dict(parse_overrides(PL._overrides({"data_files": files})),
                                source="t", from_text=True)
    assert cfg.data_files == files
    bad = tmp_path / "p.yaml"
    bad.write_text("pretrain: {data_files: ['a,b.txt']}\n")
    assert main(["pipeline", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    out = capsys.readouterr().out
    assert f"{bad}: stage 'pretrain': config field 'data_files': an item holds a comma" in out
    assert not (tmp_path / "o").exists()
