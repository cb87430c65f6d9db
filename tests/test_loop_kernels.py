"""The training step runs the kernels its contracts check, and records which ran.

The loop's AdamW update, gradient clip and LR schedule come from the model's Ops bundle
(falsify/llm/ops.py); the adamw-, grad-clip- and lr-schedule-kernel contracts bind thin wrappers
over the same functions. Replacing a bound function must change what the loop does, and the
run config and every checkpoint must name the functions that ran."""

import json

import numpy as np
import pytest
import torch

from falsify.cli import main as falsify_main
from falsify.kernels.torch import adamw as torch_adamw
from falsify.kernels.torch import grad_clip as torch_clip
from falsify.kernels.torch import lr_schedule as torch_lrs
from falsify.llm import checkpoint as C
from falsify.llm import config as LC
from falsify.llm import ops as ops_mod
from falsify.llm import preflight as PF
from falsify.llm import run as RUN
from falsify.llm import trainer as TR
from falsify.llm.model import build_model
from falsify.reference import adamw as ref_adamw
from falsify.reference import grad_clip as ref_clip

TRAINING_KERNELS = {"adamw": "falsify.kernels.torch.adamw:adamw_multi",
                    "grad_clip": "falsify.kernels.torch.grad_clip:clip_grad_norm_",
                    "lr_schedule": "falsify.kernels.torch.lr_schedule:set_lr"}


def _one_step(cfg) -> tuple[TR.Trainer, TR.StepStats]:
    model = build_model(LC.model_config(cfg), "torch", seed=0)
    tr = TR.Trainer(model, cfg, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    shape = (cfg.batch_size, cfg.seq_len)
    micro = [(torch.randint(4, cfg.vocab_size, shape, generator=g),
              torch.randint(4, cfg.vocab_size, shape, generator=g)) for _ in range(2)]
    return tr, tr.train_step(micro)


# ------------------------------------------------------------------------ what is recorded
def test_run_config_and_every_checkpoint_name_the_kernels_that_ran(tmp_path):
    r = RUN.train(RUN.tiny_config(tmp_path, max_steps=4, warmup_steps=0, save_interval=2,
                                  eval_interval=2, keep_last=5))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["backend"] == "torch"
    for k, ref in TRAINING_KERNELS.items():
        assert cfg["kernels"][k] == ref
    for k in ops_mod.KERNELS:
        assert cfg["kernels"][k] == f"falsify.kernels.torch.{k}:{k}"
    ckpts = C.list_checkpoints(tmp_path)
    assert len(ckpts) == 2 and r.final_step == 4
    for ck in ckpts:
        state = C.read_state(ck)["config"]
        assert state["kernels"] == cfg["kernels"] and state["backend"] == "torch"


def test_recorded_names_are_the_functions_the_trainer_calls(tmp_path):
    """The provenance strings resolve to exactly the callables in the trainer's Ops, and the
    optimizer runs that update."""
    import importlib

    tr, _ = _one_step(RUN.tiny_config(tmp_path))
    for k, ref in tr.ops.provenance.items():
        mod, name = ref.split(":")
        assert getattr(importlib.import_module(mod), name) is getattr(tr.ops, k)
    assert isinstance(tr.optimizer, torch_adamw.AdamW)
    assert tr.optimizer.update_fn() is torch_adamw.adamw_multi


# ------------------------------------------------------- replacing the bound function
@pytest.fixture
def fresh_ops(monkeypatch):
    """get_ops caches one bundle per backend; a test that replaces a kernel builds a new one."""
    monkeypatch.setattr(ops_mod, "_CACHE", {})


def test_replacing_the_bound_adamw_changes_the_loops_step(tmp_path, monkeypatch, fresh_ops):
    cfg = RUN.tiny_config(tmp_path, warmup_steps=0)
    tr, _ = _one_step(cfg)
    good = [p.detach().clone() for p in tr.params]
    calls = []
    real = torch_adamw.adamw_multi

    def coupled_decay(params, grads, ms, vs, step, lr, beta1, beta2, eps, weight_decay):
        """Adam + L2 (the adamw contract's MUT-AW-001 bug) in the function the loop calls."""
        calls.append(len(params))
        grads = [g + weight_decay * p for g, p in zip(grads, params)]
        real(params, grads, ms, vs, step, lr, beta1, beta2, eps, 0.0)

    monkeypatch.setattr(torch_adamw, "adamw_multi", coupled_decay)
    ops_mod._CACHE.clear()
    tr2, _ = _one_step(cfg)
    assert calls and sum(calls) == len(tr2.params)
    assert tr2.ops.adamw is coupled_decay
    changed = [not torch.equal(a, b.detach()) for a, b in zip(good, tr2.params)]
    assert any(changed)
    # ... and the contract's binding runs the same function, so its checks see the bug
    rng = np.random.default_rng(0)
    p, g = rng.uniform(-1, 1, (4, 8)), rng.uniform(-1, 1, (4, 8))
    m, v = np.zeros((4, 8)), np.zeros((4, 8))
    hp = dict(lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    want = ref_adamw.adamw_step(p, g, m, v, 1, **hp)[0]
    t = [torch.tensor(a, dtype=torch.float32) for a in (p, g, m, v)]
    got = torch_adamw.adamw_step(*t, 1, **hp)[0].double().numpy()
    assert np.max(np.abs(got - want)) > 1e-3


def test_replacing_the_bound_clip_changes_the_loops_step(tmp_path, monkeypatch, fresh_ops):
    cfg = RUN.tiny_config(tmp_path, warmup_steps=0, grad_clip=0.01)
    _, st = _one_step(cfg)
    real = torch_clip.clip_grad_norm_

    def per_tensor(grads, max_norm, eps, error_if_nonfinite):
        """Each tensor clipped by its own norm (the grad-clip contract's MUT-CLIP-002 bug)."""
        return max(real([g], max_norm, eps, error_if_nonfinite) for g in grads)

    monkeypatch.setattr(torch_clip, "clip_grad_norm_", per_tensor)
    ops_mod._CACHE.clear()
    tr2, st2 = _one_step(cfg)
    assert tr2.ops.grad_clip is per_tensor
    assert st2.grad_norm < st.grad_norm  # the largest per-tensor norm, not the global one
    gs = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 3)]
    want = ref_clip.clip_grad_norm(*[g.double().numpy() for g in gs], 0.5, 1e-6, False)
    got = torch_clip.clip_grad_norm(*gs, 0.5, 1e-6, False)
    assert abs(float(got[3]) - float(want[3])) > 1e-3 * float(want[3])


def test_replacing_the_bound_schedule_changes_the_loops_lr(tmp_path, monkeypatch, fresh_ops):
    cfg = RUN.tiny_config(tmp_path, warmup_steps=2)
    _, st = _one_step(cfg)
    assert st.lr == 0.0  # update 0 of a warmup starts at 0
    real = torch_lrs.set_lr

    def no_warmup(optimizer, step, warmup, total, lr_max, lr_min):
        return real(optimizer, step, 0, total, lr_max, lr_min)

    monkeypatch.setattr(torch_lrs, "set_lr", no_warmup)
    ops_mod._CACHE.clear()
    tr2, st2 = _one_step(cfg)
    assert st2.lr == cfg.lr
    assert all(g["lr"] == cfg.lr for g in tr2.optimizer.param_groups)


# ----------------------------------------------------------- config algebra before data
def test_bad_warmup_is_refused_before_any_data_is_prepared(tmp_path, monkeypatch, capsys):
    """`falsify train max_steps=30` (warmup_steps defaults to 30: 100 % of the run) used to
    tokenize the corpus for over a minute before refusing. Now nothing is prepared: no cache,
    no run directory, and the data layer is never asked."""
    from falsify.llm import data as data_mod

    def touched(*a, **k):
        raise AssertionError("data preparation ran before the config-only preflight")

    monkeypatch.setattr(data_mod, "prepare_data", touched)
    monkeypatch.chdir(tmp_path)
    rc = falsify_main(["train", "max_steps=30", f"cache_dir={tmp_path / 'cache'}"])
    assert rc == 2
    assert "warmup_steps=30 is 100.0% of max_steps=30" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(PF.PreflightError, match="warmup_steps=3 is"):
        RUN.train(RUN.tiny_config(tmp_path / "run", max_steps=20, warmup_steps=3))
    assert not (tmp_path / "run").exists()


def test_memory_budget_is_refused_before_any_data_is_prepared(tmp_path, monkeypatch):
    from falsify.llm import data as data_mod

    monkeypatch.setattr(data_mod, "prepare_data", lambda *a, **k: pytest.fail("data prepared"))
    with pytest.raises(PF.PreflightError, match="exceeds the budget"):
        RUN.train(RUN.tiny_config(tmp_path / "run", memory_budget_gb=1e-6))
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ one core, two loops
SHARED_BAD = [("lr", "0"), ("lr_min", "1"), ("beta1", "1.0"), ("beta2", "-0.1"),
              ("adam_eps", "0"), ("weight_decay", "-1"), ("grad_clip", "0"),
              ("andon_grad_norm", "0"), ("andon_loss_max", "-1"), ("threads", "0"),
              ("warmup_steps", "-1"), ("batch_size", "0"), ("device", "tpu"),
              ("precision", "fp8"), ("backend", "cuda"), ("sample_top_k", "0")]


@pytest.mark.parametrize("field,value", SHARED_BAD)
def test_both_loops_refuse_a_shared_field_with_the_same_rule(field, value):
    """FinetuneConfig extends LoopConfig: a shared field is refused by the one rule, with the
    same message, whichever loop is configured."""
    from falsify.llm import finetune as FT

    msgs = []
    for cls in (LC.TrainConfig, FT.FinetuneConfig):
        assert issubclass(cls, LC.LoopConfig)
        with pytest.raises(cls.error, match=f"config field {field}=") as e:
            cls.load(None, [f"{field}={value}"])
        msgs.append(str(e.value).split(": ", 1)[1])
    assert msgs[0] == msgs[1]


def test_fine_tuning_reuses_the_update_step():
    """The fine-tuning trainer supplies only its micro-batch hook; the step is the shared one."""
    from falsify.llm import finetune as FT

    for name in ("train_step", "forward_backward", "apply_update"):
        assert getattr(FT.FinetuneTrainer, name) is getattr(TR.Trainer, name)
    for name in ("micro_loss", "count"):
        assert getattr(FT.FinetuneTrainer, name) is not getattr(TR.Trainer, name)


# ------------------------------------------------------- the clip's one-pass norm, and its limits
@pytest.mark.parametrize("scale", [1e-30, 1e-21, 1.0, 1e18, 1e35])
def test_clip_norm_is_right_where_a_plain_fp32_sum_of_squares_is_not(scale):
    """The loop's clip takes torch._foreach_norm's one pass when the fp32 Σg² is trustworthy
    and the scaled norm when it would overflow (|g| ≳ 1.8e19) or leave the normal range
    (|g| ≲ 1e-19). Every scale must match the float64 norm to a few fp32 ulps (N = 4,000
    squares: the fp32 sum's bound (N/2 + 6)·eps is looser; this data cancels nothing)."""
    g = torch.Generator().manual_seed(1)
    gs = [torch.randn(40, 50, generator=g) * scale, torch.randn(2000, generator=g) * scale]
    want = np.sqrt(sum(float((x.double() ** 2).sum()) for x in gs))
    got = float(torch_clip.clip_grad_norm_([x.clone() for x in gs], 1.0, 1e-6, False))
    assert abs(got - want) <= 2e3 * 2**-24 * want
    plain = float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(gs, 2))))
    if scale in (1e-30, 1e35):  # what the fast path alone reports: 0 and inf
        assert not abs(plain - want) <= 1e-3 * want


# ------------------------------------------------------------------ precision on a GPU
@pytest.mark.parametrize("precision,backend,expect", [
    ("auto", "torch", None), ("auto", "triton", None), ("fp32", "torch", None),
    ("bf16", "triton", torch.bfloat16), ("bf16", "torch", "refused")])
def test_precision_on_cuda_is_what_the_kernel_contracts_check(monkeypatch, precision, backend,
                                                              expect):
    """On a GPU `auto` trains fp32: bf16 autocast hands the torch kernels a dtype their
    contracts do not check (the H200 run stopped at step 1 in rope). bf16 must be asked for,
    and with the torch backend it is refused before any work, naming the reason. A CUDA device
    also switches the loop to deterministic kernels (resume is bit-identical by contract)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(RUN, "deterministic_cuda", lambda: calls.append(1))
    cfg = LC.TrainConfig.load(None, [f"precision={precision}", f"backend={backend}",
                                     "device=cuda"])
    if expect == "refused":
        with pytest.raises(LC.ConfigError, match="precision='bf16' with backend='torch'"):
            RUN.resolve_device(cfg)
        return
    dev, autocast = RUN.resolve_device(cfg)
    assert dev.type == "cuda" and autocast == expect and calls == [1]
