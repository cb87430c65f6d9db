"""The pretraining run: config -> config-only preflight -> data -> data preflight -> model and
trainer -> steps with eval / checkpoints / Andon stops -> sample. Also the setup the fine-tuning
run shares (threads, device, seeding); the step loop, metrics, progress and Andon records are
falsify/llm/run_base.py's, re-exported here.

The effective config (config.json) and every checkpoint record the kernels that ran: the
model's and the training step's (AdamW update, clip, schedule), from `Ops.provenance`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import data as data_mod
from falsify.llm import dispatch, distributed
from falsify.llm.checkpoint_load import load_checkpoint
from falsify.llm.config import (
    RESUME_MUTABLE,
    ConfigError,
    LoopConfig,
    TrainConfig,
    check_resume_config,
    config_from_dict,
    effective_config,
    model_config,
)
from falsify.llm.model import Transformer, build_model, generate, param_count
from falsify.llm.ops import resolve_backend
from falsify.llm.preflight import preflight, preflight_config
from falsify.llm.run_base import (  # noqa: F401  (the run plumbing's API: R.Progress, ...)
    METRICS_RECORDS,
    MetricsLog,
    OneProcess,
    Progress,
    RunBase,
    drive,
    metrics_extra,
    step_or_andon,
    truncate_metrics,
)
from falsify.llm.trainer import LoopParts, StepStats, Trainer

log = logging.getLogger("falsify.train")
RUNS_ROOT = Path("runs")


# -------------------------------------------------------------------------- run plumbing
def resolve_threads(requested: int | None) -> tuple[int, str]:
    """Intra-op threads. Measured on a 2-core machine shared with other jobs (load average 7):
    tiny preset, batch 16x128, 1 thread 2,268 tok/s, 2 threads 325 tok/s — OpenMP's barriers
    stall whenever one of its threads is descheduled. On an idle machine 2 threads were 1.8x
    faster than 1. So null picks all cores unless the load average already fills them."""
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"config field threads={requested}: must be >= 1")
        return requested, "configured"
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if cores > 1 and load >= cores - 0.5:
        return 1, f"threads=null and load average {load:.1f} on {cores} cores: 1 thread"
    return cores, f"threads=null: all {cores} cores (load average {load:.1f})"


@contextlib.contextmanager
def torch_threads(requested: int | None):
    """Run with the configured thread count; the count is process-global, so restore it."""
    before = torch.get_num_threads()
    n, why = resolve_threads(requested)
    log.info("torch threads: %d (%s)", n, why)
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def resolve_device(cfg: LoopConfig) -> tuple[torch.device, torch.dtype | None]:
    """(device, autocast dtype or None for fp32)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config field device='cuda' but no CUDA device is available")
    dev = torch.device("cuda" if cfg.device == "cuda" or
                       (cfg.device == "auto" and torch.cuda.is_available()) else "cpu")
    if cfg.precision == "bf16" and dev.type != "cuda":
        raise ConfigError("config field precision='bf16' needs a CUDA device (CPU trains fp32)")
    if cfg.precision == "bf16" and cfg.backend == "torch":
        raise ConfigError("config field precision='bf16' with backend='torch': the torch kernels "
                          "refuse bfloat16 activations (their contracts check float32 and float16 "
                          "only); use backend='triton' on the GPU, or precision='fp32'")
    if dev.type == "cuda":
        deterministic_cuda()
    # `auto` is fp32 on every device: bf16 autocast would hand the kernels a dtype that no
    # contract of the torch backend checks, so it runs only when asked for
    autocast = torch.bfloat16 if cfg.precision == "bf16" else None
    configure_kernels(cfg, dev, autocast)
    return dev, autocast


def configure_kernels(cfg: LoopConfig, dev: torch.device, autocast) -> None:
    """Under a dispatch policy, choose each kernel's backend now, before any work, from the
    ledger for this run's dtype and device (falsify/llm/dispatch.py); the model built afterwards
    runs that bundle. A kernel no backend is verified for stops the run here."""
    if not dispatch.is_policy(cfg.backend):
        return
    ctx = dispatch.Context(
        ledger=Path(cfg.ledger) if cfg.ledger else dispatch.default_ledger(),
        baseline=Path(cfg.bench_baseline) if cfg.bench_baseline else None,
        dtype="bfloat16" if autocast == torch.bfloat16 else "float32",
        gpu=torch.cuda.get_device_name(dev) if dev.type == "cuda" else None)
    try:
        dispatch.configure(cfg.backend, ctx)
    except dispatch.DispatchError as e:
        raise ConfigError(f"config field backend={cfg.backend!r}: {e}") from None


def deterministic_cuda() -> None:
    """The loop promises bit-identical resume and seed-for-seed equal runs; on CUDA that holds
    only with deterministic kernels (the atomics of embedding and attention backward add in
    arrival order). cuBLAS needs its workspace pinned for that, before its first handle."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def kernel_record(model: Transformer) -> dict:
    """What the run config and every checkpoint say ran: the backend and each kernel's
    implementation, model and training step alike."""
    rec = {"backend": model.ops.backend, "kernels": dict(model.ops.provenance)}
    if model.ops.dispatch is not None:
        rec["dispatch"] = model.ops.dispatch
    return rec


# ----------------------------------------------------------------------------- the result
@dataclass
class TrainResult:
    out_dir: str
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    params_finite: list[bool] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    final_step: int = 0
    val_loss: float | None = None
    val_ppl: float | None = None
    sample: str | None = None
    stopped: str = ""
    elapsed_s: float = 0.0
    tokens: int = 0
    tokens_per_s: float = 0.0
    preflight: dict = field(default_factory=dict)
    data_info: dict = field(default_factory=dict)
    resumed_from: str | None = None
    checkpoint: str | None = None
    model: Transformer | None = field(default=None, repr=False)


def data_spec(cfg: TrainConfig, vocab_size: int) -> data_mod.DataSpec:
    return data_mod.DataSpec(corpus=cfg.corpus, data_files=tuple(cfg.data_files),
                             jsonl_field=cfg.jsonl_field, max_files=cfg.max_files,
                             max_bytes=cfg.max_bytes, val_fraction=cfg.val_fraction,
                             vocab_size=vocab_size, synthetic_tokens=cfg.synthetic_tokens,
                             seed=cfg.seed)


def new_run_dir(model: str, root: Path = RUNS_ROOT) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path, n = root / f"{model}-{stamp}", 1
    while path.exists():
        n += 1
        path = root / f"{model}-{stamp}-{n}"
    return path


# The loops that write runs under runs/: a checkpoint's config says which one wrote it (the
# fine-tuning loop records the config it was asked for, the pretraining loop its `train`).
PRETRAINING, FINETUNING = "pretraining", "fine-tuning"


def run_kind(checkpoint: Path) -> str:
    """Which loop wrote this checkpoint (PRETRAINING covers distillation: the same loop)."""
    config = ckpt_mod.read_state(checkpoint)["config"]
    return FINETUNING if "finetune_requested" in config else PRETRAINING


def find_resume_checkpoint(resume: str | Path, out_dir: str | None,
                           root: Path = RUNS_ROOT, kind: str = PRETRAINING) -> Path:
    """`resume`: a checkpoint or run directory, or "auto": the latest checkpoint of out_dir, or
    with out_dir unset, of the most recently written `kind` run under runs/. The checkpoint is
    verified (checkpoint.verify_checkpoint); "auto" falls back to the newest intact one with a
    warning, a named one that is damaged is an error offering it. Orphaned temp dirs are
    removed."""
    if str(resume) != "auto":  # a named checkpoint/run: a damaged one is refused, never swapped
        found = ckpt_mod.find_checkpoint(resume, for_resume=True)
    else:
        run = resume_run_dir(resume, out_dir, root, kind)
        found = ckpt_mod.find_checkpoint(run, fallback=True, for_resume=True)
    ckpt_mod.remove_orphans(found.parent.parent)
    return found


def resume_run_dir(resume: str | Path, out_dir: str | None, root: Path = RUNS_ROOT,
                   kind: str = PRETRAINING) -> Path:
    """The run directory a resume writes, found without verifying or touching anything: the
    run lock is taken on it before its checkpoints are read. With out_dir unset, "auto" is the
    most recently written run of this `kind` under `root`: `falsify train --resume auto` after
    a fine-tuning run still continues the pretraining run, and the other way round."""
    if str(resume) != "auto":
        return ckpt_mod.run_dir_of(resume)
    if out_dir is not None:
        return Path(out_dir)
    latest = [c for r in (sorted(root.iterdir()) if root.is_dir() else [])
              if (c := ckpt_mod.latest_checkpoint(r)) is not None and _run_kind(r) == kind]
    if not latest:
        raise ckpt_mod.CheckpointError(f"--resume: no {kind} run with a checkpoint under "
                                       f"{root}/")
    return max(latest, key=lambda c: (c / ckpt_mod.STATE).stat().st_mtime).parent.parent


def _run_kind(run: Path) -> str | None:
    """The kind of the run's newest checkpoint whose state can be read (a damaged latest one
    leaves the run a candidate: the resume then offers its newest intact checkpoint); None
    when none can."""
    for c in reversed(ckpt_mod.list_checkpoints(run)):
        try:
            return run_kind(c)
        except ckpt_mod.CheckpointError:
            continue
    return None


# -------------------------------------------------------------------------------- the run
def train(cfg: TrainConfig, *, resume: str | Path | None = None,
          data: data_mod.PreparedData | None = None, stop_after: int | None = None,
          keep_model: bool = False, parts: LoopParts | None = None) -> TrainResult:
    """Run (or resume) a training run as configured. `resume`: a run or checkpoint directory,
    or "auto" for the latest checkpoint in cfg.out_dir. `stop_after`: stop once this optimizer
    step is done (and checkpointed), as if killed there: the schedule still runs to max_steps."""
    # one rank of a torchrun job, or the whole run
    parallel = (distributed.DataParallel() if distributed.launched_world_size() > 1
                else OneProcess())
    with torch_threads(cfg.threads):
        return drive(parallel, lambda: PretrainRun(cfg, parts or LoopParts(), parallel),
                     lambda run: run.prepare(data), resume, stop_after, keep_model)


def resume_batch(state: dict, cfg: TrainConfig, world_size: int, where: Path) -> dict:
    """The checkpoint's train config as this run compares it: a run may resume on another
    number of processes when batch_size × processes (the global batch, which the data position
    counts) stays the same; then its batch_size is the one to compare."""
    saved = state["train"]
    was = int(state.get("world_size", 1))
    if was == world_size:
        return saved
    then, now = saved["batch_size"] * was, cfg.batch_size * world_size
    if then != now:
        raise ConfigError(f"checkpoint {where} was written by {was} process(es) × batch_size "
                          f"{saved['batch_size']} (global batch {then}); this run is "
                          f"{world_size} × {cfg.batch_size} = {now}: keep batch_size × "
                          "processes equal to continue the same data and arithmetic")
    return {**saved, "batch_size": cfg.batch_size}


class PretrainRun(RunBase):
    """One run's state, built in stages (open -> prepare -> build -> loop), each a method; the
    loop, cadences and files are RunBase's (falsify/llm/run_base.py)."""

    shards_state = True  # under FSDP each rank holds 1/W of the weights and AdamW moments

    def __init__(self, cfg: TrainConfig, parts: LoopParts, parallel: OneProcess | None = None):
        super().__init__(parallel)
        cfg.validate()
        self.cfg, self.parts = cfg, parts
        self.device, self.autocast = resolve_device(cfg)
        self.mcfg = model_config(cfg)
        resolve_backend(cfg.backend)  # a backend that cannot run is refused before any work
        # config-only preflight: before a run directory or any data exists
        self.early = preflight_config(cfg, self.mcfg, self.device)
        self.device = self.parallel.attach(self.device)  # a rank: its GPU, the group joined

    def open(self, resume) -> None:
        """The run directory: a resumed run's (its config checked against ours) or a new one."""
        cfg = self.cfg
        if resume is not None:
            run_dir = resume_run_dir(resume, cfg.out_dir)
            # the directory this run writes: out_dir when given, else the resumed run's
            self.lock_run(Path(cfg.out_dir) if cfg.out_dir is not None else run_dir)
            self.ckpt_path = find_resume_checkpoint(resume, str(run_dir))
            state = ckpt_mod.read_state(self.ckpt_path)["config"]
            saved = resume_batch(state, cfg, self.world_size, self.ckpt_path)
            check_resume_config(saved, cfg, self.ckpt_path, RESUME_MUTABLE)
            if cfg.out_dir is None:
                cfg = dataclasses.replace(cfg, out_dir=str(self.ckpt_path.parent.parent))
        else:
            if cfg.out_dir is None:  # ranks: rank 0 names it
                cfg = dataclasses.replace(cfg, out_dir=self.parallel.agree(
                    lambda: str(new_run_dir(cfg.model))))
            self.lock_run(Path(cfg.out_dir))
            if ckpt_mod.list_checkpoints(cfg.out_dir):
                raise ConfigError(f"out_dir={cfg.out_dir!r} already holds checkpoints; pass "
                                  "--resume to continue that run or choose another out_dir")
        self.cfg = cfg
        self.out = Path(cfg.out_dir)

    def prepare(self, data: data_mod.PreparedData | None) -> None:
        """Data, token streams, the sampler, and the preflight that needs them; drawn as the
        global batch (a data-parallel run's batch_size × W), rank 0 building the data first."""
        local, self.cfg = self.cfg, self.parallel.global_batch(self.cfg)
        try:
            with self.parallel.main_first():
                self.prepare_data(data)
        finally:
            self.cfg = local

    def prepare_data(self, data: data_mod.PreparedData | None) -> None:
        cfg, mcfg = self.cfg, self.mcfg
        seed_everything(cfg.seed)
        if data is None:
            data = data_mod.prepare_data(data_spec(cfg, mcfg.vocab_size), cfg.cache_dir)
        self.data = data
        eos = data.special_ids[data_mod.EOS]
        train_stream = data_mod.token_stream(data.train, eos, cfg.fim_rate, cfg.seed,
                                             data.special_ids)
        self.val_stream = data_mod.token_stream(data.val, eos)  # no FIM: left-to-right ppl
        self.sampler = self.parts.sampler(train_stream, mcfg.max_seq_len, cfg.batch_size,
                                          cfg.grad_accum, cfg.epochs, cfg.seed, data.key)
        self.pre = preflight(cfg, mcfg, self.sampler.n_blocks,
                             data_mod.num_blocks(len(self.val_stream), mcfg.max_seq_len),
                             data.vocab_size, self.device, self.parts)

    def build(self) -> None:
        """Model, trainer, the effective config on disk, and the resumed state if any."""
        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        self.model = build_model(self.mcfg, cfg.backend, self.device, seed=cfg.seed)
        self.model.activation_checkpointing = cfg.activation_checkpointing
        self.trainer = self.parallel.trainer(self)
        self.kernels = {**kernel_record(self.model), "world_size": self.world_size}
        log.info("backend=%s kernels=%s", self.kernels["backend"], self.kernels["kernels"])
        extra = {**self.kernels, "threads": torch.get_num_threads(),
                 "device": str(self.device), "autocast": str(self.autocast),
                 "data": self.data.info, "preflight": self.pre}
        self.write_config(effective_config(cfg, extra))
        self.result = TrainResult(out_dir=str(self.out), preflight=self.pre,
                                  data_info=self.data.info)
        self.metrics_path = self.out / "metrics.jsonl"
        if self.ckpt_path is not None:
            state = load_checkpoint(self.ckpt_path, self.model, self.trainer.optimizer,
                                             self.trainer.param_names)
            self.parts.restore_position(self.trainer, self.sampler, state)
            self.best_val = state.get("best_val_loss")
            self.resumed(state)
            log.info("resumed from %s at step %d", self.ckpt_path, self.trainer.step)

    def next_micro(self) -> list:
        """The step's micro-batches (a data-parallel rank reads its shard of them)."""
        return self.parallel.shard_blocks(self.sampler.next_step())

    def make_trainer(self) -> Trainer:
        """The step: plain next-token cross-entropy (falsify/llm/distill.py overrides it)."""
        return Trainer(self.model, self.cfg, self.device, self.autocast, self.parts)

    def make_parallel_trainer(self, world, dparts) -> Trainer:
        """The step with DDP or FSDP (cfg.parallel) underneath."""
        return distributed.DistributedTrainer(self.model, self.cfg, self.device, self.autocast,
                                              self.parts, world=world, dparts=dparts,
                                              parallel=self.cfg.parallel)

    def checkpoint_config(self) -> dict:
        return effective_config(self.cfg, self.kernels)

    def eval_due(self, step: int, last: bool) -> bool:
        return self.cfg.val_fraction > 0 and (step % self.cfg.eval_interval == 0 or last)

    def save_due(self, step: int) -> bool:
        return step % self.cfg.save_interval == 0

    def evaluate(self, step: int) -> dict:
        cfg = self.cfg
        vl, vp = self.trainer.evaluate(data_mod.eval_batches(
            self.val_stream, self.mcfg.max_seq_len, cfg.batch_size, cfg.eval_batches))
        self.best_val = vl if self.best_val is None else min(self.best_val, vl)
        self.result.evals.append({"step": step, "val_loss": vl, "val_ppl": vp})
        self.mf.write(json.dumps({"step": step, "val_loss": vl, "val_ppl": vp}) + "\n")
        return {"val_loss": vl, "val_ppl": vp}

    def record(self, st: StepStats, step_s: float, fetch_s: float, tps: float) -> None:
        r = self.result
        for lst, v in ((r.steps, st.step), (r.losses, st.loss), (r.grad_norms, st.grad_norm),
                       (r.lrs, st.lr), (r.params_finite, st.params_finite)):
            lst.append(v)
        self.mf.write(json.dumps({"step": st.step, "loss": st.loss, "lr": st.lr,
                                  "grad_norm": st.grad_norm, "tokens": st.tokens,
                                  "step_s": step_s, "tok_s": tps}) + "\n")

    def finish(self) -> None:
        """A completed run: final eval numbers, the sample, summary.json."""
        result = self.result
        result.stopped = "max_steps"
        if result.evals and result.evals[-1]["step"] == self.trainer.step:
            result.val_loss = result.evals[-1]["val_loss"]
            result.val_ppl = result.evals[-1]["val_ppl"]
        # every rank samples: under FSDP each forward gathers weights from all of them
        result.sample = sample(self.trainer.forward_model, self.cfg, self.data, self.device)
        if self.writes:
            self.write_run_summary()
        self.parallel.settle(self.trainer)


def sample(model: Transformer, cfg: TrainConfig, data: data_mod.PreparedData,
           device: torch.device) -> str | None:
    if cfg.sample_tokens <= 0:
        return None
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    eos = data.special_ids[data_mod.EOS]
    if data.tokenizer is not None:
        prompt = data_mod.encode(data.tokenizer, cfg.sample_prompt) or [eos]
    else:
        prompt = [eos]
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    out = generate(model, ids, cfg.sample_tokens, cfg.sample_temperature, cfg.sample_top_k,
                   gen, stop_id=eos)[0].tolist()
    if out[-1] == eos:
        out = out[:-1]
    if data.tokenizer is None:
        return " ".join(map(str, out))
    return data_mod.decode(data.tokenizer, out)


# --------------------------------------------------------------- helpers for loop contracts
TINY_TEST = {"model": "tiny", "vocab_size": 512, "hidden_size": 64, "num_layers": 2,
             "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 192, "seq_len": 32,
             "corpus": "synthetic", "synthetic_tokens": 60_000, "batch_size": 4,
             "grad_accum": 2, "max_steps": 20, "warmup_steps": 2, "lr": 3e-3, "lr_min": 3e-4,
             "eval_interval": 10, "eval_batches": 2, "save_interval": 10, "progress": False,
             "sample_tokens": 0, "threads": 1}


def tiny_config(out_dir: str | Path, **overrides) -> TrainConfig:
    """A seconds-long config on synthetic data (no tokenizer) for tests and loop contracts."""
    d = dict(TINY_TEST, out_dir=str(out_dir))
    d.update(overrides)
    return config_from_dict(d, source="tiny_config")


def run_steps(steps: int = 20, seed: int = 0, out_dir: str | Path | None = None,
              parts: LoopParts | None = None, **overrides) -> dict:
    """Loop-level contract entry point: train `steps` optimizer steps of the tiny synthetic
    config and return plain data — per-step loss / grad norm / lr / parameter finiteness, the
    max |grad| of every parameter after the first step (gradient flow), the optimizer's
    hyperparameters as applied (hyperparameter propagation), and the effective config."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = tiny_config(out_dir or tmp, max_steps=steps, seed=seed,
                          warmup_steps=overrides.pop("warmup_steps", max(0, steps // 10)),
                          save_interval=overrides.pop("save_interval", steps),
                          eval_interval=overrides.pop("eval_interval", steps), **overrides)
        with torch_threads(cfg.threads):
            return _run_steps(cfg, steps, parts or LoopParts())


def _run_steps(cfg: TrainConfig, steps: int, parts: LoopParts) -> dict:
    device, autocast = resolve_device(cfg)
    mcfg = model_config(cfg)
    seed_everything(cfg.seed)
    data = data_mod.prepare_data(data_spec(cfg, mcfg.vocab_size), cfg.cache_dir)
    stream = data_mod.token_stream(data.train, data.special_ids[data_mod.EOS],
                                   cfg.fim_rate, cfg.seed, data.special_ids)
    sampler = parts.sampler(stream, mcfg.max_seq_len, cfg.batch_size, cfg.grad_accum,
                            cfg.epochs, cfg.seed, data.key)
    parts.check_config_algebra(sampler.n_blocks, cfg.batch_size, cfg.grad_accum, cfg.epochs,
                               cfg.max_steps, cfg.warmup_steps, mcfg.max_seq_len)
    model = build_model(mcfg, cfg.backend, device, seed=cfg.seed)
    trainer = Trainer(model, cfg, device, autocast, parts)
    out: dict = {"losses": [], "grad_norms": [], "lrs": [], "params_finite": [],
                 "grad_flow": {}, "config": effective_config(cfg, kernel_record(model))}
    # every parameter of the model, not only those the optimizer was given: a parameter left
    # out of the optimizer shows up as never changing
    named = dict(model.named_parameters())
    init = {n: p.detach().clone() for n, p in named.items()}
    for _ in range(steps):
        st = trainer.train_step(sampler.next_step())
        if st.step == 1:
            out["grad_flow"] = {n: float(p.grad.abs().max()) if p.grad is not None else 0.0
                                for n, p in named.items()}
        out["losses"].append(st.loss)
        out["grad_norms"].append(st.grad_norm)
        out["lrs"].append(st.lr)
        out["params_finite"].append(st.params_finite)
    names = iter(trainer.param_names)
    out["optimizer_groups"] = [{**{k: (list(v) if isinstance(v, tuple) else v)
                                   for k, v in g.items() if k != "params"},
                                "param_names": [next(names) for _ in g["params"]]}
                               for g in trainer.optimizer.param_groups]
    out["params_changed"] = {n: bool((p.detach() != init[n]).any()) for n, p in named.items()}
    out["param_count"] = sum(p.numel() for p in named.values())
    out["param_count_formula"] = param_count(mcfg)
    return out


def resume_equivalence(total_steps: int, kill_at: int, workdir: str | Path,
                       parts: LoopParts | None = None, **overrides) -> dict:
    """Checkpoint/resume contract: train `total_steps` straight; separately train to `kill_at`,
    stop, resume from the checkpoint and continue to `total_steps`. Returns both loss
    sequences and whether the final weights are bit-identical."""
    workdir = Path(workdir)
    kw = dict(max_steps=total_steps, warmup_steps=max(0, total_steps // 10), **overrides)
    a = train(tiny_config(workdir / "straight", **kw), keep_model=True, parts=parts)
    cfg_b = tiny_config(workdir / "killed", **kw)
    b1 = train(cfg_b, stop_after=kill_at, parts=parts)
    b2 = train(cfg_b, resume="auto", keep_model=True, parts=parts)
    sa = a.model.state_dict()
    sb = b2.model.state_dict()
    diffs = {k: float((sa[k] - sb[k]).abs().max()) for k in sa}
    return {"losses_straight": a.losses, "losses_killed": b1.losses,
            "losses_resumed": b2.losses, "resumed_from": b2.resumed_from,
            "bit_identical": all(torch.equal(sa[k], sb[k]) for k in sa),
            "max_abs_diff": max(diffs.values()), "val_straight": a.val_loss,
            "val_resumed": b2.val_loss}
