"""Run functions for falsify/contracts/distill-v1.yaml (`training`-kind checks of the distillation
loop,
falsify/llm/distill.py).

Every run drives the real loop (DistillRun: the pretraining run with the KD step) on the tiny
synthetic config of the pretraining loop contract (2 layers, hidden 64, vocab 512, seq 32), with
the loop's swappable pieces (falsify/llm/distill.DistillParts: freezing the teacher, what the
teacher reads, the micro-batch numerator, the teacher check) looked up through the harness at
call time, so when `falsify mutants` swaps a binding the loop under test runs the mutant. The
teacher is a tiny model with sharper logits (init_std 0.2) so the KD term is far from zero.
Each run compares against something the loop did not compute: the teacher's weights as loaded,
plain pretraining, the float64 kd-loss reference on logits computed outside the loop, the
on-the-fly top-k path.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np

CONTRACT = "distill-v1"
PARTS = {"freeze": "freeze", "teacher_input": "teacher_input",
         "micro_numerator": "micro_numerator", "check_teacher": "check_teacher"}


def _bound(equation: str):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract(CONTRACT), equation, "torch")


def _parts():
    from falsify.llm.distill import DistillParts

    return DistillParts(**{field: _bound(eq) for eq, field in PARTS.items()})


def _config(out: Path, **over):
    from falsify.llm import run as R
    from falsify.llm.distill import DistillConfig
    from falsify.probes import device

    d = {**R.TINY_TEST, "out_dir": str(out), "max_steps": 4, "warmup_steps": 0,
         "save_interval": 1000, "eval_interval": 1000, "max_bytes": None, "alpha": 0.5,
         "temperature": 2.0, "kd_chunk": 48}
    d.update(over)
    # the run lives where the check's backend does (torch: the CPU), not wherever `auto` finds
    # a GPU: the probes compare against CPU tensors, and the checks name their backend
    d.setdefault("device", device(d.get("backend", "torch")))
    return DistillConfig.from_dict(d, source="distill probe")


def _teacher(vocab: int = 512, seed: int = 1):
    from falsify.llm.distill import Teacher
    from falsify.llm.model import ModelConfig, build_model

    mcfg = ModelConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=4,
                       num_kv_heads=2, intermediate_size=192, max_seq_len=32, init_std=0.2)
    return Teacher(build_model(mcfg, "torch", seed=seed), vocab, "probe teacher", None, hf=False)


def _run(cfg, teacher=None, steps=None):
    """A DistillRun through its stages; returns (run, result)."""
    from falsify.llm import run as R
    from falsify.llm.distill import DistillRun
    from falsify.llm.trainer import LoopParts

    with R.torch_threads(cfg.threads):
        run = DistillRun(cfg, LoopParts(), _parts(), teacher or _teacher())
        run.open(None)
        run.prepare(None)
        run.build()
        res = run.loop(steps, keep_model=True)
    return run, res


# ---------------------------------------------------------------------------------- runs
def frozen_teacher_run(backend: str = "torch", dtype: str = "float32", steps: int = 3) -> dict:
    """`steps` distillation steps: the teacher's mode, its parameters' requires_grad and .grad,
    and whether its weights are bit-identical to a copy taken before the run."""
    import torch

    teacher = _teacher()
    before = {k: v.detach().clone() for k, v in teacher.module.state_dict().items()}
    teacher.module.train()  # as loaded by a careless caller: the loop must freeze it
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp) / "run", max_steps=steps, backend=backend)
        run, res = _run(cfg, teacher)
    sd = teacher.module.state_dict()
    return {"steps": res.final_step,
            "training": teacher.module.training,
            "requires_grad": [n for n, p in teacher.module.named_parameters() if p.requires_grad],
            "with_grad": [n for n, p in teacher.module.named_parameters() if p.grad is not None],
            "changed": [k for k in before if not torch.equal(before[k], sd[k])],
            "student_moved": bool(res.losses and len(res.losses) == steps)}


def alpha_zero_run(backend: str = "torch", dtype: str = "float32", steps: int = 4) -> dict:
    """α = 0 against plain pretraining (falsify/llm/run.py:train) on the same data, seed and
    config: per-step losses and the final student weights."""
    from falsify.llm import run as R

    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp) / "kd", max_steps=steps, alpha=0.0, backend=backend)
        _, kd = _run(cfg)
        pre_cfg = R.tiny_config(Path(tmp) / "pre", **{
            k: getattr(cfg, k) for k in ("max_steps", "warmup_steps", "save_interval",
                                         "eval_interval", "backend", "device")})
        pre = R.train(pre_cfg, keep_model=True)
    a, b = kd.model.state_dict(), pre.model.state_dict()
    rel = [abs(x - y) / abs(y) for x, y in zip(kd.losses, pre.losses, strict=True)]
    return {"steps": len(kd.losses), "losses_kd": kd.losses, "losses_pretrain": pre.losses,
            "max_loss_relerr": max(rel),
            "max_weight_diff": max(float((a[k] - b[k]).abs().max()) for k in a),
            "max_move": sum(kd.lrs), "eps32": 2.0 ** -23}


def first_step_reference_run(backend: str = "torch", dtype: str = "float32",
                             alpha: float = 0.5, temperature: float = 2.0,
                             teacher_topk: int | None = None) -> dict:
    """Step 1's loss against the float64 kd-loss reference, on student and teacher logits
    computed outside the loop (the student's hidden states and head before the update, the
    teacher's forward on the same input blocks)."""
    import torch

    from falsify.llm import data as D
    from falsify.llm.model import build_model
    from falsify.reference import kd_loss as KD

    teacher = _teacher()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp) / "run", max_steps=1, alpha=alpha, temperature=temperature,
                      teacher_topk=teacher_topk, backend=backend)
        run, res = _run(cfg, teacher)
        # the student as built (the same seed rebuilds the same initial weights)
        student = build_model(run.mcfg, backend, seed=cfg.seed)
        sampler = D.BatchSampler(run.sampler.stream, run.sampler.seq_len, cfg.batch_size,
                                 cfg.grad_accum, cfg.epochs, cfg.seed, run.data.key)
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in sampler.next_step():
                zs = (student.hidden(x).double() @ student.embed_tokens.weight.double().T)
                zt = teacher.module(x).double()
                zs, zt = zs.reshape(-1, zs.shape[-1]).numpy(), zt.reshape(-1, zt.shape[-1]).numpy()
                lab = y.reshape(-1).numpy()
                if teacher_topk is None:
                    loss = KD.kd_loss(zs, zt, lab, temperature, alpha, ignore_index=-100)[0]
                else:
                    loss = KD.kd_loss_from_topk(zs, zt, lab, temperature, alpha, teacher_topk,
                                                ignore_index=-100)[0]
                n = int((lab != -100).sum())
                total, count = total + float(loss) * n, count + n
    ref = total / count
    return {"loss": res.losses[0], "ref": ref, "relerr": abs(res.losses[0] - ref) / abs(ref),
            "V": run.mcfg.vocab_size, "d": run.mcfg.hidden_size, "eps32": 2.0 ** -23}


def vocab_mismatch_run(backend: str = "torch", dtype: str = "float32",
                       teacher_vocab: int = 256) -> dict:
    """A teacher over another vocabulary: refused, and when, and with what message."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp) / "run", max_steps=2, backend=backend)
        out = Path(tmp) / "run"
        try:
            _run(cfg, _teacher(vocab=teacher_vocab))
            return {"refused": False, "error": None, "message": "", "metrics_written": True}
        except Exception as e:  # noqa: BLE001 - the check inspects what was raised
            from falsify.llm.distill import DistillConfigError

            metrics = out / "metrics.jsonl"
            return {"refused": isinstance(e, DistillConfigError), "error": type(e).__name__,
                    "message": str(e),
                    "metrics_written": metrics.is_file() and metrics.stat().st_size > 0}


def cache_equivalence_run(backend: str = "torch", dtype: str = "float32", steps: int = 3,
                          k: int = 8) -> dict:
    """teacher_topk=k on the fly vs the same k read from a teacher cache written by the run:
    losses and final weights."""
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        fly = _run(_config(Path(tmp) / "fly", max_steps=steps, teacher_topk=k,
                           backend=backend))[1]
        cache = Path(tmp) / "cache"
        cached = _run(_config(Path(tmp) / "cached", max_steps=steps, teacher_topk=k,
                              teacher_cache=str(cache), backend=backend))[1]
        files = sorted(p.name for p in cache.iterdir())
    a, b = fly.model.state_dict(), cached.model.state_dict()
    return {"losses_fly": fly.losses, "losses_cached": cached.losses,
            "bit_identical": all(torch.equal(a[n], b[n]) for n in a)
            and fly.losses == cached.losses, "files": files}


def _bigram_teacher():
    """The probe teacher with its attention and MLP outputs zeroed: its logits depend on the
    current token only (a bigram model), a function the student can learn in a few steps."""
    import torch

    t = _teacher()
    with torch.no_grad():
        for n, p in t.module.named_parameters():
            if n.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
    return t


def kl_decreases_run(backend: str = "torch", dtype: str = "float32", steps: int = 30) -> dict:
    """α = 1: the student is trained on a (bigram) teacher alone; T²·KL at the start and at
    the end."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _config(Path(tmp) / "run", max_steps=steps, alpha=1.0, lr=1e-2, lr_min=1e-3,
                      backend=backend, warmup_steps=2)
        run, res = _run(cfg, _bigram_teacher())
    return {"first": res.losses[0], "last5": float(np.mean(res.losses[-5:])),
            "finite": all(math.isfinite(x) for x in res.losses)}
