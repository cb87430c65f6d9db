"""Fine-tuning data, config and loop (falsify/llm/sft_data.py, falsify/llm/finetune.py, falsify
finetune):
formats and masks, errors that name the file and line, resume, early stopping, reward-weighted
SFT and DPO end to end through the CLI. Shared helpers for tests/test_finetune_*.py are here."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from falsify.llm import data as data_mod
from falsify.llm import finetune as FT
from falsify.llm import lora_model as LM
from falsify.llm import sft_data as SD
from falsify.llm.finetune_stage import finetune
from falsify.llm.model import ModelConfig, build_model
from falsify.llm.preflight import PreflightError

CFG = ModelConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=192, max_seq_len=96)
U32 = 2.0**-24


# ------------------------------------------------------------------------------ helpers
def shipped_records(n: int) -> list[dict]:
    out = []
    with open(SD.SHIPPED_DATASET, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if len(r["prompt"]) + len(r["response"]) < 160:
                out.append({"prompt": r["prompt"], "response": r["response"]})
            if len(out) == n:
                break
    return out


def make_tokenizer(path: Path):
    texts = [r["prompt"] + r["response"] for r in shipped_records(400)]
    tok = data_mod.train_tokenizer(texts, CFG.vocab_size)
    data_mod.save_tokenizer(tok, path)
    return tok


def tiny_model(seed: int = 0, scale: float = 0.08):
    """Weights far from init (std 0.08, norm gains in [0.5, 1.5]) so logits are O(1)."""
    m = build_model(CFG, "torch", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    return m


def write_base(dirpath: Path, tokenizer_path: Path, seed: int = 0) -> Path:
    from falsify.cli.merge import write_ours

    return write_ours(tiny_model(seed), dirpath, str(tokenizer_path), {"test": True})


def base_with_tokenizer(root: Path) -> Path:
    """A tiny base (our layout) with its tokenizer, in `root`."""
    tok = root / "tokenizer.json"
    make_tokenizer(tok)
    return write_base(root / "base", tok)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def logit_tolerance(cfg: ModelConfig, logits: torch.Tensor) -> float:
    """fp32, different op orders (one GEMM per projection vs fused q/k/v, SDPA vs eager): each
    of the 2L+1 stages has GEMMs with reductions ≤ K, error ~√K·u relative, 8 such ops per
    stage (tests/test_hf.py's derivation): 8·(2L+1)·√K·u·max|logits|."""
    k = max(cfg.hidden_size, cfg.intermediate_size)
    return 8 * (2 * cfg.num_layers + 1) * math.sqrt(k) * U32 * float(logits.abs().max())


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer(p)
    return p


@pytest.fixture(scope="module")
def tok(tok_path):
    return data_mod.load_tokenizer(tok_path)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tok_path):
    return write_base(tmp_path_factory.mktemp("base") / "base", tok_path)


def small_args(out: Path, *extra) -> list[str]:
    return ["--out", str(out), "max_steps=3", "batch_size=2", "grad_accum=2", "lora_r=4",
            "val_split=0.2", "sample_count=1", "sample_tokens=4", "progress=false",
            "backend=torch", *extra]


# -------------------------------------------------------------------- formats and masks
def test_formats_are_detected_and_masks_are_response_only(tmp_path, tok):
    eos = tok.token_to_id(data_mod.EOS)
    pr = write_jsonl(tmp_path / "pr.jsonl", [{"prompt": "def f(x):", "response": "\n    x"}])
    ins = write_jsonl(tmp_path / "ins.jsonl", [{"instruction": "def f(x):",
                                                "response": "\n    x", "id": 7}])
    txt = write_jsonl(tmp_path / "t.jsonl", [{"text": "import os"}])
    chat = write_jsonl(tmp_path / "c.jsonl", [{"messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"}]}])
    pref = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": " b", "rejected": " c"}])
    rw = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "a", "response": " b", "score": 0.5},
                                            {"prompt": "a", "response": " c", "score": -2}])
    enc = lambda s: data_mod.encode(tok, s)  # noqa: E731
    p_ids, r_ids = enc("def f(x):"), enc("\n    x")
    for f in (pr, ins):
        ds = SD.load_dataset([f], tok, 64)
        e = ds.examples[0]
        assert e.ids == [eos] + p_ids + r_ids + [eos]
        assert e.mask == [False] * (1 + len(p_ids)) + [True] * (len(r_ids) + 1)
        assert ds.kind == "sft" and not ds.reward_weighted
    e = SD.load_dataset([pr], tok, 64, train_on_prompt=True).examples[0]
    assert e.mask == [False] + [True] * (len(e.ids) - 1)
    e = SD.load_dataset([txt], tok, 64).examples[0]
    assert e.mask == [False] + [True] * (len(e.ids) - 1)
    e = SD.load_dataset([chat], tok, 64).examples[0]
    trained = [t for t, m in zip(e.ids, e.mask) if m]
    assert trained == enc("ok") + [eos]  # only the assistant's content and the closing EOS
    ds = SD.load_dataset([pref], tok, 64)
    assert ds.kind == "preference"
    assert [t for t, m in zip(ds.examples[0].chosen.ids, ds.examples[0].chosen.mask) if m] \
        == enc(" b") + [eos]
    ds = SD.load_dataset([rw], tok, 64)
    assert ds.reward_weighted and [e.reward for e in ds.examples] == [0.5, -2.0]
    assert ds.formats[str(rw)] == "reward_prompt_response"


def test_collate_trains_the_last_prompt_position():
    """Position t predicts token t+1: the last prompt position is the one that predicts the
    first response token, so its label is trained and the earlier prompt positions are not."""
    e = SD.SFTExample([0, 10, 11, 12, 20, 21, 0], [False, False, False, False, True, True, True])
    f = SD.SFTExample([0, 30, 40, 0], [False, False, True, True])
    b = SD.collate([e, f], pad_id=0)
    assert b.x.tolist() == [[0, 10, 11, 12, 20, 21], [0, 30, 40, 0, 0, 0]]
    assert b.labels.tolist() == [[10, 11, 12, 20, 21, 0], [30, 40, 0, -100, -100, -100]]
    assert b.mask.tolist() == [[False, False, False, True, True, True],
                               [False, True, True, False, False, False]]
    assert b.n_tokens == 5 and b.targets()[0, :3].tolist() == [-100] * 3


BAD_LINES = [
    ('{"prompt": "a", "response": "b"', "invalid JSON"),
    ('{"prompt": "a", "respone": "b"}', "unknown key 'respone'|cannot tell the format"),
    ('{"prompt": "a", "response": "b", "rewrad": 1}', "unknown key 'rewrad'"),
    ('{"prompt": 3, "response": "b"}', "field 'prompt' must be a string"),
    ('{"prompt": "a", "response": ""}', "field 'response' is empty"),
    ('{"prompt": "a", "response": "b", "reward": "high"}', "'reward' must be a finite number"),
    ('{"prompt": "a", "response": "b", "reward": 1, "score": 2}', "both 'reward' and 'score'"),
    ('{"prompt": "a", "instruction": "a", "response": "b"}', "exactly one of"),
    ('{"prompt": "a", "chosen": "b", "rejected": "b"}', "identical"),
    ('{"prompt": "a", "chosen": "b", "rejected": "c", "reward": 1}', "not used by preference"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', r"messages\[0\].role='bot'"),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no non-empty assistant message"),
    ('[1, 2]', "must be a JSON object"),
    ('{"text": "a"}', "a text record in a file whose first record"),
    ('{"prompt": "a", "response": "b", "reward": 0.3}', "a 'reward'/'score' although"),
]


@pytest.mark.parametrize("bad,msg", BAD_LINES)
def test_malformed_line_is_an_error_naming_file_and_line(tmp_path, bad, msg):
    good = '{"prompt": "x", "response": "y"}'
    f = write_jsonl(tmp_path / "d.jsonl", [good, "", good, bad, good])
    with pytest.raises(data_mod.DataError, match=rf"d\.jsonl:4: .*({msg})"):
        SD.read_jsonl(f)


def test_missing_reward_on_a_later_line_names_that_line(tmp_path):
    f = write_jsonl(tmp_path / "r.jsonl", ['{"prompt": "x", "response": "y", "reward": 1}',
                                           '{"prompt": "x", "response": "z"}'])
    with pytest.raises(data_mod.DataError, match=r"r\.jsonl:2: no 'reward'/'score'"):
        SD.read_jsonl(f)


def test_mixing_sft_and_preference_files_is_an_error(tmp_path, tok):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "x", "response": "y"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "x", "chosen": "y", "rejected": "z"}])
    with pytest.raises(data_mod.DataError, match="cannot be mixed"):
        SD.load_dataset([a, b], tok, 64)
    with pytest.raises(data_mod.DataError, match="does not exist"):
        SD.load_dataset([tmp_path / "nope.jsonl"], tok, 64)


def test_overlong_examples(tmp_path, tok):
    f = write_jsonl(tmp_path / "l.jsonl", [{"prompt": "p " * 40, "response": " r" * 40},
                                           {"prompt": "p " * 80, "response": " r"},
                                           {"prompt": "a", "response": " b"}])
    ds = SD.load_dataset([f], tok, 48, overlong="truncate")
    assert ds.stats["truncated"] == 1 and ds.stats["dropped"] == 1 and len(ds.examples) == 2
    assert all(len(e.ids) <= 49 for e in ds.examples)
    assert SD.load_dataset([f], tok, 48, overlong="drop").stats["dropped"] == 2
    with pytest.raises(data_mod.DataError, match=r"l\.jsonl:1: .* tokens > seq_len"):
        SD.load_dataset([f], tok, 48, overlong="error")


def test_reward_weights_clip_and_scale():
    w = SD.reward_weights(torch.tensor([-5.0, -1.0, 0.0, 1.0, 3.0], dtype=torch.float64))
    assert w.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]
    with pytest.raises(data_mod.DataError, match="min-max scaling is undefined"):
        SD.reward_weights(torch.tensor([2.0, 7.0]))  # both clip to 1


# ------------------------------------------------------------------------------- config
@pytest.mark.parametrize("over,msg", [
    (["lora_rank=4"], "unknown config field 'lora_rank'.*lora_r"),
    (["targets=q,x"], "targets"),
    (["lora_r=0"], "lora_r"),
    (["nf4_blocksize=48"], "nf4_blocksize"),
    (["method=dora"], "method"),
    (["early_stopping_patience=2", "val_split=0"], "early_stopping_patience"),
    (["overlong=wrap"], "overlong"),
    (["lr_min=1"], "lr_min"),
    (["grad_clip=inf"], "'grad_clip' must be a finite number"),  # clipping silently off
    (["lora_alpha=nan"], "'lora_alpha' must be a finite number"),
    (["threads=0"], "threads"), (["andon_loss_max=-1"], "andon_loss_max"),
])
def test_bad_config_is_an_error_naming_the_field(over, msg):
    with pytest.raises(FT.FinetuneConfigError, match=msg):
        FT.load_config(None, over)


def test_freeze_every_layer_is_an_error():
    m = tiny_model()
    with pytest.raises(LM.LoraConfigError, match="freeze_layers"):
        LM.apply_lora(m, LM.LoraSpec(freeze_layers=CFG.num_layers))


def test_freeze_layers_puts_no_adapter_below_n():
    m = tiny_model()
    LM.apply_lora(m, LM.LoraSpec(method="lora", r=2, targets=("q", "v"), freeze_layers=1))
    names = sorted(LM.adapter_parameters(m))
    assert names and all(n.startswith("layers.1.") for n in names)
    assert {n.split(".")[3] for n in names} == {"q_proj", "v_proj"}
    cfg = LM.peft_config(m.lora_spec, CFG.num_layers, "b")
    assert cfg["layers_to_transform"] == [1] and cfg["target_modules"] == ["q_proj", "v_proj"]


# ------------------------------------------------------------------------ the CLI, loop
def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["prompt_response", "reward", "chat", "text", "preference"])
def test_cli_trains_every_format(tmp_path, base_dir, kind):
    from falsify.cli import main

    recs = shipped_records(24)
    rows = {
        "prompt_response": recs,
        "reward": [dict(r, reward=float(i % 5) - 2) for i, r in enumerate(recs)],
        "chat": [{"messages": [{"role": "user", "content": r["prompt"]},
                               {"role": "assistant", "content": r["response"]}]} for r in recs],
        "text": [{"text": r["prompt"] + r["response"]} for r in recs],
        "preference": [{"prompt": r["prompt"], "chosen": r["response"],
                        "rejected": recs[(i + 1) % len(recs)]["response"]}
                       for i, r in enumerate(recs)],
    }[kind]
    data = write_jsonl(tmp_path / f"{kind}.jsonl", rows)
    out = tmp_path / "run"
    rc = main(["finetune", "--method", "qlora", "--model", str(base_dir), "--data", str(data),
               "lr=3e-3", *small_args(out)])
    assert rc == 0
    m = _metrics(out)
    steps = [r for r in m if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) and r["loss"] >= 0 for r in steps)
    assert any(r.get("step") == 0 and "val_loss" in r for r in m)  # the base's baseline
    if kind == "preference":
        assert abs(steps[0]["loss"] - math.log(2)) < 1e-4  # policy = reference at B = 0
        assert {"chosen_reward", "rejected_reward", "accuracy"} <= set(steps[0])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["data"]["reward_weighted"] == (kind == "reward")
    assert (out / "adapter" / LM.ADAPTER_CONFIG).is_file()
    assert (out / "adapter" / LM.ADAPTER_WEIGHTS).is_file()


def test_cli_data_error_exit_code_and_message(tmp_path, base_dir, capsys):
    from falsify.cli import main

    data = write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": "a", "response": "b"}',
                                                '{"prompt": "a", "answer": "b"}'])
    rc = main(["finetune", "--model", str(base_dir), "--data", str(data),
               *small_args(tmp_path / "o")])
    assert rc == 2
    assert "bad.jsonl:2" in capsys.readouterr().out.replace("\n", "")


def _ds(tok, n=24):
    recs = shipped_records(n)
    rows = [SD.RawRecord("prompt_response", r, None, f"mem:{i}") for i, r in enumerate(recs)]
    return SD.Dataset("sft", SD.tokenize(rows, tok), ["mem"], {"mem": "prompt_response"},
                      False, {"truncated": 0, "dropped": 0})


def _base(tok_path, seed=0):
    return FT.Base(tiny_model(seed), data_mod.load_tokenizer(tok_path), str(tok_path),
                   "tiny", "memory")


def test_resume_is_bit_identical(tmp_path, tok, tok_path):
    kw = dict(method="qlora", lora_r=4, batch_size=2, grad_accum=2, max_steps=10, epochs=3,
              warmup_steps=1, val_split=0.2, save_every=2, progress=False, sample_count=0,
              backend="torch", shuffle=True)
    a = finetune(FT.config_from_dict(dict(kw, out_dir=str(tmp_path / "a"))),
                    base=_base(tok_path), dataset=_ds(tok), keep_model=True)
    cb = FT.config_from_dict(dict(kw, out_dir=str(tmp_path / "b")))
    b1 = finetune(cb, base=_base(tok_path), dataset=_ds(tok), stop_after=3)
    assert b1.final_step == 3 and b1.adapter_dir is None
    b2 = finetune(cb, resume="auto", base=_base(tok_path), dataset=_ds(tok),
                     keep_model=True)
    assert b2.resumed_from.endswith("step-00000003")
    assert b1.losses + b2.losses == a.losses
    pa, pb = LM.adapter_parameters(a.model), LM.adapter_parameters(b2.model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    # a different base is refused
    with pytest.raises(Exception, match="another base"):
        finetune(cb, resume="auto", base=_base(tok_path, seed=5), dataset=_ds(tok))
    # an out_dir with checkpoints needs --resume
    with pytest.raises(FT.FinetuneConfigError, match="already holds checkpoints"):
        finetune(cb, base=_base(tok_path), dataset=_ds(tok))


def test_early_stopping_stops_after_patience(tmp_path, tok, tok_path, monkeypatch):
    vals = iter([5.0, 4.0, 4.5, 4.6, 4.7, 4.8])  # baseline, then best at step 1, then worse

    def fake_eval(self, batches):
        return {"val_loss": next(vals), "val_ppl": 1.0}

    monkeypatch.setattr(FT.FinetuneTrainer, "evaluate_examples", fake_eval)
    cfg = FT.config_from_dict(dict(lora_r=4, batch_size=2, max_steps=8, val_split=0.2,
                                   eval_interval=1, early_stopping_patience=2, progress=False,
                                   sample_count=0, backend="torch",
                                   out_dir=str(tmp_path / "r")))
    r = finetune(cfg, base=_base(tok_path), dataset=_ds(tok))
    assert r.final_step == 3 and r.stopped.startswith("early stopping")
    assert r.checkpoint.endswith("step-00000003") and r.adapter_dir is not None


def _report(cfg, r) -> str:
    from rich.console import Console

    from falsify.llm.finetune_stage import summary

    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    summary(console, cfg, r)
    return console.export_text()


def _words(text: str) -> str:
    return " ".join(text.split())  # the table's title wraps to the table's width


def _eval_rows(text: str) -> list[str]:
    return [ln.split("│")[1].strip() for ln in text.splitlines() if ln.startswith("│")]


def test_the_summary_shows_the_evaluations_that_ran_and_says_when_none_did(tmp_path, tok,
                                                                           tok_path):
    """max_steps below eval_interval: the last step is evaluated all the same, so the table
    holds the frozen base (step 0) and step 2. A resumed run's baseline is the first process's:
    its table does not claim step 0. No held-out examples: no table, a line that says why."""
    kw = dict(method="qlora", lora_r=4, batch_size=2, max_steps=2, val_split=0.2,
              eval_interval=10, progress=False, sample_count=0, backend="torch")
    cfg = FT.config_from_dict(dict(kw, out_dir=str(tmp_path / "a")))
    text = _report(cfg, finetune(cfg, base=_base(tok_path), dataset=_ds(tok)))
    assert "held-out examples (step 0 = the frozen base)" in _words(text)
    assert _eval_rows(text) == ["0", "2"]

    cfg = FT.config_from_dict(dict(kw, max_steps=3, out_dir=str(tmp_path / "b")))
    finetune(cfg, base=_base(tok_path), dataset=_ds(tok), stop_after=1)
    text = _report(cfg, finetune(cfg, resume="auto", base=_base(tok_path), dataset=_ds(tok)))
    assert "held-out examples" in text and "step 0" not in text
    assert _eval_rows(text) == ["3"]

    cfg = FT.config_from_dict(dict(kw, val_split=0.0, out_dir=str(tmp_path / "c")))
    text = _report(cfg, finetune(cfg, base=_base(tok_path), dataset=_ds(tok)))
    assert "val_loss" not in text and not _eval_rows(text)
    assert "no evaluation ran: no held-out examples (val_split=0, 24 train examples)" \
        in _words(text)


def test_only_adapters_train_and_checkpoint_holds_only_adapters(tmp_path, tok, tok_path):
    cfg = FT.config_from_dict(dict(lora_r=4, batch_size=2, max_steps=2, val_split=0.0,
                                   progress=False, sample_count=0, backend="torch",
                                   out_dir=str(tmp_path / "r")))
    r = finetune(cfg, base=_base(tok_path), dataset=_ds(tok), keep_model=True)
    from safetensors.torch import load_file

    saved = load_file(str(Path(r.checkpoint) / "model.safetensors"))
    assert set(saved) == set(LM.adapter_parameters(r.model))
    eff = json.loads((tmp_path / "r" / "config.json").read_text())
    assert eff["finetune"]["max_steps"] == 2 and eff["lora"]["scale"] == 16.0 / 4
    assert eff["trainable_params"] == sum(p.numel() for p in saved.values())


def test_max_steps_unreachable_is_a_preflight_error(tmp_path, tok, tok_path):
    cfg = FT.config_from_dict(dict(batch_size=4, epochs=1, max_steps=50, val_split=0.0,
                                   progress=False, backend="torch", out_dir=str(tmp_path)))
    with pytest.raises(PreflightError, match="max_steps=50 is unreachable"):
        finetune(cfg, base=_base(tok_path), dataset=_ds(tok))


def test_hf_base_directory(tmp_path, tok, tok_path):
    """An HF LLaMA directory (falsify/llm/hf.py export, with tokenizer.json) is a valid --model."""
    from falsify.llm import hf

    hf.export_hf(tiny_model(), tmp_path / "hf", tok_path)
    b = FT.load_base(tmp_path / "hf", "torch")
    assert b.layout == "hf" and b.tokenizer.get_vocab_size() == CFG.vocab_size
    ref = tiny_model()
    x = torch.randint(0, CFG.vocab_size, (1, 16))
    with torch.no_grad():
        assert torch.equal(b.model(x), ref(x))
    with pytest.raises(FT.FinetuneConfigError, match="neither an HF LLaMA directory"):
        FT.load_base(tmp_path, "torch")


def test_reward_zero_sample_contributes_nothing_in_the_loss():
    """sft_loss: weight 0 removes the sample's terms; the denominator keeps its tokens."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=g)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    mask = torch.ones(2, 5, dtype=torch.bool)
    s, n = FT.sft_loss(logits, labels, mask, torch.tensor([1.0, 0.0]))
    s1, _ = FT.sft_loss(logits[:1], labels[:1], mask[:1], torch.ones(1))
    assert int(n) == 10 and torch.equal(s, s1)
    lp = torch.log_softmax(logits.double(), -1)
    want = -lp.gather(-1, labels[..., None]).sum()
    s_all, _ = FT.sft_loss(logits, labels, mask, torch.ones(2))
    assert abs(float(s_all) - float(want)) <= 10 * (11 + 16) * U32 * float(want)
    assert np.isfinite(float(s_all))


def test_dpo_validation_uses_its_own_reference_values(tmp_path, tok, tok_path):
    """The reference log-probs are cached per example; the validation split must not read the
    training split's entries. The last val_loss equals DPO recomputed from scratch."""
    recs = shipped_records(24)
    rows = [SD.RawRecord("preference", {"prompt": r["prompt"], "chosen": r["response"],
                                        "rejected": recs[(i + 3) % 24]["response"]}, None,
                         f"p:{i}") for i, r in enumerate(recs)]
    ex, fit = SD.fit_length(SD.tokenize(rows, tok), CFG.max_seq_len, "drop")
    ds = SD.Dataset("preference", ex, ["p"], {"p": "preference"}, False, fit)
    cfg = FT.config_from_dict(dict(lora_r=4, batch_size=2, max_steps=4, val_split=0.25,
                                   lr=3e-2, progress=False, sample_count=0, backend="torch",
                                   out_dir=str(tmp_path / "r")))
    r = finetune(cfg, base=_base(tok_path), dataset=ds, keep_model=True)
    _, val = SD.split_examples(ds.examples, 0.25, cfg.seed)
    model = r.model.eval()
    losses = []
    with torch.no_grad():
        for e in val:
            lp = []
            for on in (True, False):
                for part in (e.chosen, e.rejected):
                    b = SD.collate([part], 0)
                    if on:
                        lg = model(b.x)
                    else:
                        with LM.adapters_disabled(model):
                            lg = model(b.x)
                    lp.append(float(FT.sequence_logps(lg, b.labels, b.mask)[0]))
            d = cfg.dpo_beta * ((lp[0] - lp[2]) - (lp[1] - lp[3]))
            losses.append(math.log1p(math.exp(-d)))
    assert r.evals[0]["val_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert r.evals[-1]["val_loss"] == pytest.approx(float(np.mean(losses)), abs=1e-5)
    assert abs(r.evals[-1]["val_loss"] - math.log(2)) > 1e-3  # training moved the policy


def test_cli_several_data_files_and_flags(tmp_path, base_dir):
    from falsify.cli import main

    recs = shipped_records(24)
    a = write_jsonl(tmp_path / "a.jsonl", recs[:12])
    b = write_jsonl(tmp_path / "b.jsonl", recs[12:])
    out = tmp_path / "run"
    rc = main(["finetune", "--data", str(a), "--data", str(b), "--model", str(base_dir), "--method",
               "lora", "--rank", "2", "--targets", "q,v", "--freeze-layers", "1",
               "--train-on-prompt", "--no-shuffle", "--grad-checkpoint", *small_args(out)])
    assert rc == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["data"]["files"] == [str(a), str(b)] and cfg["data"]["records"] == 24
    f = cfg["finetune"]
    # key=value overrides come last and win: small_args' lora_r=4 beats --rank 2
    assert (f["method"], f["lora_r"], f["targets"], f["freeze_layers"]) == ("lora", 4,
                                                                          ["q", "v"], 1)
    assert f["train_on_prompt"] and not f["shuffle"] and f["activation_checkpointing"]
    assert f["max_steps"] == 3 and cfg["lora"]["freeze_layers"] == 1
    # layer 1 only, q and v: A [4, 64] + B [64, 4] (q) and A [4, 64] + B [32, 4] (v, 2 kv heads)
    assert cfg["trainable_params"] == (4 * 64 + 64 * 4) + (4 * 64 + 32 * 4)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_dropout_applies_to_the_adapter_input_only(method):
    """PEFT: y = base(x) + s·B(A(drop(x))). In train mode with p > 0 the layer composes that
    from F.linear; in eval mode it is the kernel (falsify/kernels/torch/lora.py / qlora.py) — both
    must
    agree with the formula written out here."""
    m = tiny_model()
    LM.apply_lora(m, LM.LoraSpec(method=method, r=4, dropout=0.5, targets=("q",)))
    lin = dict(LM.adapted_layers(m))["layers.0.self_attn.q_proj"]
    with torch.no_grad():
        lin.lora_B.weight.normal_(0, 0.5)  # B ≠ 0 so the adapter path shows
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    w, a, b, s = lin.base_weight(), lin.lora_A.weight, lin.lora_B.weight, lin.scale()
    lin.train()
    torch.manual_seed(7)
    y = lin(x)
    torch.manual_seed(7)
    xd = torch.nn.functional.dropout(x, 0.5, training=True)
    want = x @ w.T + s * (xd @ a.T) @ b.T
    assert torch.allclose(y, want, atol=1e-5, rtol=0)
    lin.eval()
    y_eval = lin(x)
    assert torch.allclose(y_eval, x @ w.T + s * (x @ a.T) @ b.T, atol=1e-5, rtol=0)
    assert float((y - y_eval).abs().max()) > 1e-2  # dropout did act in train mode


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counted_logits_give_the_loss_of_the_full_logits(seed):
    """The SFT step computes the LM head only at the positions whose targets count
    (`counted_logits`). Against the full logits: the same counted targets per sample, in order;
    each logit within the dot-product bound of two summation orders, 2·H·u·(|h|·|W|); the loss
    within two orders of the same fp32 sum, 2·(n + b)·u·Σ w·CE (the dropped positions add
    exact zeros), plus 2·w·max|Δlogit| per token (a CE moves by at most twice the largest
    change of its logits). Variable masks, a sample with nothing counted, padding, non-unit
    weights."""
    model = tiny_model(seed)
    g = torch.Generator().manual_seed(seed)
    b, s = 4, 12
    x = torch.randint(4, CFG.vocab_size, (b, s), generator=g)
    labels = torch.randint(4, CFG.vocab_size, (b, s), generator=g)
    labels[0, -3:] = SD.IGNORE_INDEX  # padding
    mask = (torch.rand(b, s, generator=g) < 0.6) & (labels != SD.IGNORE_INDEX)
    mask[1] = False  # a sample with nothing counted
    weights = torch.rand(b, generator=g) + 0.25
    batch = SD.Batch(x, labels, mask, weights, torch.arange(b))

    with torch.no_grad():
        full = model(x)
        h = model.hidden(x)
        lg, lab, keep = FT.counted_logits(model, batch)
    assert lg.shape[:2] == lab.shape == keep.shape and lg.shape[1] == int(mask.sum(1).max())
    assert torch.equal(keep.sum(1), mask.sum(1))
    w = model.embed_tokens.weight.detach()
    moved = 0.0
    for i in range(b):
        pos = mask[i].nonzero().squeeze(1)
        k = len(pos)
        assert torch.equal(lab[i, :k], labels[i, pos])
        assert bool((lab[i, k:] == SD.IGNORE_INDEX).all())
        bound = 2 * CFG.hidden_size * U32 * (h[i, pos].abs() @ w.abs().T)
        assert bool(((lg[i, :k] - full[i, pos]).abs() <= bound).all())
        moved += 2 * float(weights[i]) * float(bound.amax(dim=1).sum()) if k else 0.0

    s_full, n_full = FT.sft_loss(full, labels, mask, weights)
    s_cnt, n_cnt = FT.sft_loss(lg, lab, keep, weights)
    assert int(n_cnt) == int(n_full) == int(mask.sum())
    ce = torch.nn.functional.cross_entropy(full.reshape(-1, full.shape[-1]).double(),
                                           labels.clamp_min(0).reshape(-1), reduction="none")
    mag = float((ce.view(b, s) * mask * weights[:, None]).sum())
    assert abs(float(s_cnt) - float(s_full)) <= 2 * (int(n_full) + b) * U32 * mag + moved


def test_runs_without_out_dir_get_their_own_directories_and_resume_finds_their_kind(
        tmp_path, base_dir, monkeypatch, capsys):
    """`falsify finetune` twice with no out_dir, as the README shows it: each run gets a
    runs/<method>-<time> of its own (as `falsify train` does) instead of the second one
    refusing the first one's checkpoints. `--resume auto` without out_dir continues the newest
    run of its own loop: `falsify train` the pretraining run and `falsify finetune` the
    fine-tuning run, whichever was written last."""
    from falsify.cli import main
    from falsify.llm import run as RUN

    monkeypatch.chdir(tmp_path)
    data = write_jsonl(tmp_path / "d.jsonl", shipped_records(24))
    flags = ["--model", str(base_dir), "--data", str(data), "--max-steps", "3", "--batch-size",
             "2", "--lora-r", "4", "--val-split", "0.2", "--sample-count", "0", "--no-progress",
             "--backend", "torch"]
    assert main(["finetune", *flags]) == 0
    first = {p.name for p in Path("runs").iterdir()}
    assert main(["finetune", *flags]) == 0, capsys.readouterr().out
    runs = {p.name for p in Path("runs").iterdir()}
    assert len(first) == 1 and len(runs) == 2
    assert all(n.startswith("qlora-") for n in runs)

    # a fine-tuning run stopped at step 2, then a pretraining run stopped at step 2 after it
    cfg = FT.config_from_dict({"model": str(base_dir), "data": [str(data)], "max_steps": 3,
                               "batch_size": 2, "lora_r": 4, "val_split": 0.2,
                               "sample_count": 0, "progress": False, "backend": "torch",
                               "save_every": 1})
    ft = finetune(cfg, stop_after=2)
    assert Path(ft.out_dir).parent == Path("runs") and Path(ft.out_dir).name not in runs
    pre = RUN.new_run_dir("tiny")
    tiny = RUN.tiny_config(pre, max_steps=4, warmup_steps=0)
    RUN.train(tiny, stop_after=2)
    capsys.readouterr()
    assert main(["finetune", "--resume", *flags]) == 0  # newest run is pretraining: not it
    assert f"resumed from {ft.out_dir}/checkpoints/step-00000002" in \
        " ".join(capsys.readouterr().out.split())
    r = RUN.train(replace(tiny, out_dir=None), resume="auto")  # the newest run: fine-tuning
    assert r.resumed_from == str(pre / "checkpoints" / "step-00000002") and r.final_step == 4
