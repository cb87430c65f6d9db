"""The training loop: strict config, preflight (config algebra, memory), schedule, token-weighted
accumulation, Andon stops, hyperparameter propagation, metrics and effective config."""

import json
import math
import typing

import pytest
import torch

from falsify.llm import checkpoint as C
from falsify.llm import config as LC
from falsify.llm import preflight as PF
from falsify.llm import run as RUN
from falsify.llm import trainer as TR
from falsify.llm.model import PRESETS, build_model, param_count


# ----------------------------------------------------------------------------- config
def test_unknown_field_is_an_error_naming_it():
    with pytest.raises(LC.ConfigError, match=r"unknown config field 'bta2'.*beta2"):
        LC.config_from_dict({"bta2": 0.95})
    with pytest.raises(LC.ConfigError, match="save_every"):  # a key under the wrong name
        LC.load_config(None, ["save_every=25"])


@pytest.mark.parametrize("d,field", [
    ({"batch_size": 1.5}, "batch_size"), ({"lr": "fast"}, "lr"), ({"progress": "yes"}, "progress"),
    ({"batch_size": True}, "batch_size"), ({"model": None}, "model"),
    ({"data_files": "a.txt"}, "data_files"),
])
def test_types_are_checked(d, field):
    with pytest.raises(LC.ConfigError, match=field):
        LC.config_from_dict(d)


@pytest.mark.parametrize("over,field", [
    (["batch_size=0"], "batch_size"), (["lr_min=1"], "lr_min"), (["beta2=1.0"], "beta2"),
    (["grad_clip=0"], "grad_clip"), (["backend=cuda"], "backend"), (["hidden_size=130"],
                                                                     "num_heads"),
    # accepted before and failing late or not at all: max_bytes=-5 kept one file, a negative
    # andon_loss_max stopped at step 1, a negative budget refused every model
    (["max_bytes=-5"], "max_bytes"), (["max_files=0"], "max_files"), (["threads=0"], "threads"),
    (["andon_loss_max=-1"], "andon_loss_max"), (["memory_budget_gb=0"], "memory_budget_gb"),
    (["val_fraction=1"], "val_fraction"), (["val_fraction=-0.1"], "val_fraction"),
    (["synthetic_tokens=0"], "synthetic_tokens"), (["sample_tokens=-1"], "sample_tokens"),
])
def test_values_are_checked(over, field):
    with pytest.raises(LC.ConfigError, match=field):
        LC.load_config(None, over)


FLOAT_FIELDS = [f for f, tp in typing.get_type_hints(LC.TrainConfig).items()
                if LC._is_optional(tp)[1] is float]


@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_every_float_field_must_be_finite(field):
    """inf passes every `> 0` check yet means "off": grad_clip=inf was accepted and silently
    skipped clipping; lr=inf passed the config and failed at step 1."""
    for text in ("inf", "-inf", "nan", "1e400"):
        with pytest.raises(LC.ConfigError, match=f"'{field}' must be a finite number"):
            LC.load_config(None, [f"{field}={text}"])
    for value in (math.inf, math.nan, 10**400):  # YAML: .inf, .nan, an int beyond float range
        with pytest.raises(LC.ConfigError, match=f"'{field}' must be a finite number"):
            LC.config_from_dict({field: value})


def test_yaml_then_cli_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 3e-4\nbeta2: 0.95\nmax_steps: 5_000\nhidden_size: null\n"
                 "data_files: [a.txt]\n")
    cfg = LC.load_config(f, ["max_steps=40", "num_kv_heads=4", "data_files=x.txt,y.txt",
                            "andon_loss_max=null", "progress=false"])
    assert cfg.lr == 3e-4 and isinstance(cfg.lr, float)  # YAML 1.1 reads 3e-4 as a string
    assert cfg.max_steps == 40 and cfg.num_kv_heads == 4 and cfg.progress is False
    assert cfg.data_files == ["x.txt", "y.txt"] and cfg.andon_loss_max is None
    assert LC.model_config(cfg).num_kv_heads == 4
    with pytest.raises(LC.ConfigError, match="key=value"):
        LC.load_config(None, ["max_steps"])


# ----------------------------------------------------------------------- config algebra
def test_albor_alb060_is_caught():
    """FALSIFY-CFG-001/002: 22079 sequences, batch 4, accum 128 -> 43 steps per epoch; epochs=1
    cannot reach max_steps=5000, and warmup 2000 never completes."""
    a = PF.config_algebra(22079, 4, 128, 1, 5000, 2000)
    assert a["steps_per_epoch"] == 43 and a["achievable_steps"] == 43 and not a["ok"]
    assert a["min_epochs"] == 117  # the 43-of-5000-steps config needs 117 epochs
    with pytest.raises(PF.PreflightError, match=r"max_steps=5000 is unreachable.*= 43.*>= 117"):
        PF.check_config_algebra(22079, 4, 128, 1, 5000, 500)
    # the LR the broken run peaked at: linear warmup to 3e-4 over 2000, stopped at step 43
    assert math.isclose(TR.lr_at(43, 3e-4, 3e-5, 2000, 5000), 6.45e-6, rel_tol=1e-12)


def test_albor_v2_config_passes_and_warmup_rule():
    a = PF.check_config_algebra(67977, 4, 1, 1, 5000, 500, seq_len=1024)
    assert a["steps_per_epoch"] == 16994 and a["warmup_fraction"] == 0.1
    with pytest.raises(PF.PreflightError, match="warmup_steps=501"):
        PF.check_config_algebra(67977, 4, 1, 1, 5000, 501)
    with pytest.raises(PF.PreflightError, match="not enough data"):
        PF.check_config_algebra(3, 4, 1, 10, 1, 0)


def test_a_warmup_beyond_float_range_is_a_preflight_error_not_a_crash():
    """CrossHair's counterexample: warmup_steps / max_steps overflowed a float (OverflowError,
    a traceback instead of an error naming the field) for warmup_steps ~ 1.8e308 and up, a
    value the config's int field takes as written."""
    huge = 10**400
    assert PF.config_algebra(10**9, 1, 1, 1, 10, huge)["warmup_fraction"] == math.inf
    with pytest.raises(PF.PreflightError, match=f"warmup_steps={huge}"):
        PF.check_config_algebra(10**9, 1, 1, 1, 10, huge)
    cfg = LC.config_from_dict({"warmup_steps": huge, "max_steps": 10})  # passes value checks
    assert cfg.warmup_steps == huge


def test_unreachable_max_steps_stops_before_step_one(tmp_path):
    cfg = RUN.tiny_config(tmp_path, max_steps=10_000, warmup_steps=10)
    with pytest.raises(PF.PreflightError, match="unreachable"):
        RUN.train(cfg)
    assert not (tmp_path / "metrics.jsonl").exists()


def test_memory_estimate_formulas_and_budget(tmp_path):
    cfg = PRESETS["350m"]
    m = PF.memory_estimate(cfg, batch_size=4, seq_len=1024)
    p = 398_509_056
    assert (m["weights"], m["grads"], m["optimizer"]) == (4 * p, 4 * p, 8 * p)
    assert m["activations_albor"] == 24 * 1024 * 1024 * 10 * 4 * 4
    assert m["total"] == 16 * p + m["activations"]
    ck = PF.memory_estimate(cfg, 4, 1024, activation_checkpointing=True)
    assert ck["logits"] == m["logits"] == 4 * 4096 * 32768 * 4
    assert ck["activations"] - ck["logits"] < (m["activations"] - m["logits"]) / 5
    with pytest.raises(PF.PreflightError, match="exceeds the budget"):
        RUN.train(RUN.tiny_config(tmp_path, memory_budget_gb=0.001))


# ------------------------------------------------------------------------- schedule
def test_lr_schedule_warmup_peak_cosine_min():
    """Update index t is 0-based: t = 0 has lr 0, t = W is the first at the peak."""
    lr = [TR.lr_at(t, 1e-3, 1e-4, 10, 100) for t in range(0, 101)]
    assert lr[0] == 0.0 and lr[1] == pytest.approx(1e-4) and lr[10] == 1e-3
    assert all(b <= a for a, b in zip(lr[10:], lr[11:]))  # monotone down after warmup
    assert lr[100] == 1e-4
    assert lr[55] == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way through the cosine


def test_trainer_applies_the_schedule(tmp_path):
    """A schedule parsed but never applied; the optimizer must carry lr_at(t)."""
    tr, cfg = _trainer(tmp_path, max_steps=20, warmup_steps=2)
    x = torch.randint(4, 512, (2, 32))
    for t in range(4):
        st = tr.train_step([(x, x)])
        assert st.lr == TR.lr_at(t, cfg.lr, cfg.lr_min, 2, 20)
        assert all(g["lr"] == st.lr for g in tr.optimizer.param_groups)


# -------------------------------------------------------------------- the step itself
def _trainer(tmp_path, **over):
    cfg = RUN.tiny_config(tmp_path, **over)
    model = build_model(LC.model_config(cfg), "torch", seed=0)
    return TR.Trainer(model, cfg, torch.device("cpu")), cfg


def _grads(tr):
    return [p.grad.clone() for p in tr.params]


def test_accumulation_is_token_weighted(tmp_path):
    """Two micro-batches with different numbers of counted tokens accumulate to exactly the
    gradient of one batch holding both: Σ CE / N_total, not the mean of per-micro means."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, 512, (4, 32), generator=g)
    y = torch.randint(4, 512, (4, 32), generator=g)
    y[:2, :25] = TR.IGNORE_INDEX  # micro-batch 1 counts 14 tokens, micro-batch 2 counts 64
    big_clip = {"grad_clip": 1e9, "andon_grad_norm": 1e9, "lr": 1e-9, "lr_min": 0.0}
    ta, _ = _trainer(tmp_path / "a", **big_clip)
    sa = ta.train_step([(x[:2], y[:2]), (x[2:], y[2:])])
    tb, _ = _trainer(tmp_path / "b", **big_clip)
    sb = tb.train_step([(x, y)])
    assert sa.tokens == sb.tokens == 14 + 64
    assert sa.loss == pytest.approx(sb.loss, rel=1e-6)
    for a, b in zip(_grads(ta), _grads(tb)):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-5)
    # and the mean of per-micro means is measurably different (the check can fail)
    tc, _ = _trainer(tmp_path / "c", **big_clip)
    l1 = tc.train_step([(x[:2], y[:2])]).loss
    l2 = tc.train_step([(x[2:], y[2:])]).loss
    assert abs((l1 + l2) / 2 - sa.loss) > 1e-3


def test_clipping_bounds_the_update_norm(tmp_path):
    tr, cfg = _trainer(tmp_path, grad_clip=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(4, 512, (4, 32), generator=g)
    st = tr.train_step([(x, x.roll(-1, 1))])
    clipped = math.sqrt(sum(float((p.grad ** 2).sum()) for p in tr.params))
    assert st.grad_norm > 0.01 and clipped == pytest.approx(0.01, rel=1e-4)


def test_evaluate_leaves_each_module_in_the_mode_it_had():
    """Evaluation ended with model.train() whatever the mode before: a model held in eval mode
    came back in train mode. Mixed modes show that each module gets its own flag back."""
    cfg = RUN.tiny_config("unused", max_steps=10, warmup_steps=1)
    model = build_model(LC.model_config(cfg), "torch", seed=0)
    tr = TR.Trainer(model, cfg, torch.device("cpu"))
    x = torch.randint(4, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    model.eval()
    model.layers[0].train()
    before = [m.training for m in model.modules()]
    loss, ppl = tr.evaluate([(x, x.roll(-1, 1))])
    assert [m.training for m in model.modules()] == before
    assert math.isfinite(loss) and ppl == math.exp(loss)


def test_hyperparameters_propagate_to_every_group():
    """Non-default betas/eps/wd reach the optimizer; decay only on matrices."""
    out = RUN.run_steps(steps=3, beta1=0.8, beta2=0.97, adam_eps=1e-7, weight_decay=0.05)
    for g in out["optimizer_groups"]:
        assert g["betas"] == [0.8, 0.97] and g["eps"] == 1e-7
    wd = {g["name"]: g["weight_decay"] for g in out["optimizer_groups"]}
    assert wd == {"decay": 0.05, "no_decay": 0.0}


def test_run_steps_is_stable_learns_and_every_param_moves():
    out = RUN.run_steps(steps=30, seed=1)
    assert all(math.isfinite(v) for v in out["losses"]) and all(out["params_finite"])
    assert out["losses"][-1] < out["losses"][0] - 0.3
    assert min(out["grad_flow"].values()) > 0  # every tensor gets a gradient
    assert all(out["params_changed"].values())
    assert out["param_count"] == out["param_count_formula"]
    assert out["lrs"][3] == 3e-3 and out["lrs"][0] == 0.0  # warmup 3: update 3 at the peak


# ------------------------------------------------------------------------------- Andon
def test_non_finite_loss_stops_without_updating(tmp_path):
    tr, _ = _trainer(tmp_path)
    with torch.no_grad():
        tr.model.norm.weight[0] = float("nan")
    before = [p.detach().clone() for p in tr.params]
    x = torch.randint(4, 512, (2, 32))
    with pytest.raises(TR.AndonStop, match="non-finite loss"):
        tr.train_step([(x, x)])
    assert tr.step == 0
    assert all(torch.equal(a, b, ) or torch.isnan(a).any() for a, b in zip(before, tr.params))


def test_non_finite_parameters_after_the_step_stop(tmp_path, monkeypatch):
    tr, _ = _trainer(tmp_path)
    real_step = tr.optimizer.step

    def poisoned_step():
        real_step()
        with torch.no_grad():
            tr.params[0][0, 0] = float("inf")

    monkeypatch.setattr(tr.optimizer, "step", poisoned_step)
    x = torch.randint(4, 512, (2, 32))
    with pytest.raises(TR.AndonStop, match="non-finite parameters.*layers.0.self_attn.q_proj"):
        tr.train_step([(x, x)])


def test_grad_norm_andon_keeps_last_good_checkpoint(tmp_path):
    cfg = RUN.tiny_config(tmp_path, max_steps=20)
    RUN.train(cfg, stop_after=4)
    good = C.latest_checkpoint(tmp_path)
    assert good.name == "step-00000004"
    cfg2 = LC.config_from_dict({"andon_grad_norm": 1e-6}, base=cfg)
    with pytest.raises(TR.AndonStop, match=r"gradient norm .* > andon_grad_norm=1e-06 at step 5"):
        RUN.train(cfg2, resume="auto")
    assert C.latest_checkpoint(tmp_path) == good
    info = json.loads((tmp_path / "andon.json").read_text())
    assert info["step"] == 5 and info["last_good_checkpoint"] == str(good)


def test_loss_andon(tmp_path):
    tr, _ = _trainer(tmp_path, andon_loss_max=1.0)
    x = torch.randint(4, 512, (2, 32))
    with pytest.raises(TR.AndonStop, match="andon_loss_max"):
        tr.train_step([(x, x)])


# ---------------------------------------------------------------------- run artifacts
def test_run_writes_effective_config_metrics_and_refuses_to_clobber(tmp_path):
    cfg = RUN.tiny_config(tmp_path, max_steps=10, warmup_steps=1, eval_interval=5)
    r = RUN.train(cfg)
    assert r.final_step == 10 and r.stopped == "max_steps" and r.val_ppl is not None
    assert r.val_ppl == pytest.approx(math.exp(r.val_loss))
    eff = json.loads((tmp_path / "config.json").read_text())
    assert eff["train"]["max_steps"] == 10 and eff["model"]["hidden_size"] == 64
    assert eff["preflight"]["algebra"]["ok"] and eff["kernels"]["rmsnorm"]
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r_["step"] for r_ in recs if "loss" in r_] == list(range(1, 11))
    assert [r_["step"] for r_ in recs if "val_loss" in r_] == [5, 10]
    state = C.read_state(C.latest_checkpoint(tmp_path))
    assert state["config"]["train"] == eff["train"]
    with pytest.raises(LC.ConfigError, match="already holds checkpoints"):
        RUN.train(cfg)


def test_resume_with_a_different_lr_is_refused(tmp_path):
    cfg = RUN.tiny_config(tmp_path, max_steps=10, warmup_steps=1)
    RUN.train(cfg, stop_after=2)
    with pytest.raises(LC.ConfigError, match="'lr'"):
        RUN.train(LC.config_from_dict({"lr": 1e-3}, base=cfg), resume="auto")


def test_param_count_of_default_config():
    assert param_count(LC.model_config(LC.TrainConfig())) == 1_049_728


# ------------------------------------------------------------------------------- the CLI
def _cli_args(tmp_path, **over):
    d = dict(RUN.TINY_TEST, out_dir=str(tmp_path), max_steps=6, warmup_steps=0,
             sample_tokens=8, eval_interval=6, save_interval=3)
    d.update(over)
    return [f"{k}={v}" for k, v in d.items()]


def test_cli_trains_prints_perplexity_and_resumes(tmp_path, capsys):
    from falsify.cli import main

    assert main(["train", *_cli_args(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "perplexity" in out and "sample" in out
    # a finished run resumed by directory: nothing left to do, same exit code, no new steps
    assert main(["train", "--resume", str(tmp_path)]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert C.latest_checkpoint(tmp_path).name == "step-00000006"


def test_cli_errors_are_exit_code_2(tmp_path, capsys):
    from falsify.cli import main

    assert main(["train", *_cli_args(tmp_path, max_steps=100_000, warmup_steps=0)]) == 2
    assert "unreachable" in capsys.readouterr().out
    assert main(["train", "save_every=25"]) == 2
    assert "unknown config field 'save_every'" in capsys.readouterr().out


def test_the_commands_error_line_names_an_os_errors_path_and_escapes_markup():
    """run_base.report_error, which `falsify train`, `distill` and `finetune` print through: an
    OSError (out_dir not creatable, a disk full) as path: reason; any other error as its text,
    with rich markup in it shown, not interpreted; exit code 2 either way."""
    import io

    from rich.console import Console

    from falsify.llm.run_base import report_error

    buf = io.StringIO()
    console = Console(file=buf, width=200)
    e = NotADirectoryError(20, "Not a directory", "/runs/[x]/step-1")
    assert report_error(console, e) == 2
    assert report_error(console, LC.ConfigError("unknown config field '[red]'")) == 2
    assert buf.getvalue().splitlines() == ["error: /runs/[x]/step-1: Not a directory",
                                           "error: unknown config field '[red]'"]


def test_resume_config_tolerates_fields_added_since_at_their_default(tmp_path):
    """A checkpoint written before a config field existed ran as that field's default: resuming
    with the default continues the same run, resuming with another value is refused."""
    from dataclasses import asdict

    from falsify.llm.config import ConfigError, TrainConfig, check_resume_config

    cfg = TrainConfig()
    saved = asdict(cfg)
    del saved["fim_rate"]  # as if written before fim_rate existed
    check_resume_config(saved, cfg, tmp_path, set())
    with pytest.raises(ConfigError, match="fim_rate"):
        check_resume_config(saved, cfg.replace(fim_rate=0.5), tmp_path, set())
