"""The pretraining loop: config -> preflight -> AdamW steps with accumulation and clipping ->
eval / checkpoints / Andon stops -> sample.

Config is a flat, strict dataclass: an unknown field, a wrong type or an impossible value is an
error naming the field, never a silent default (Albor ALB-070: a YAML key read from the wrong
name; ALB-034: max_steps ignored). Architecture fields left as null come from the named `model`
preset; that rule is the only source of values not written in the config, and the effective
config (with the resolved architecture) is saved with every run and every checkpoint.

Preflight runs before step 1 and raises: architecture divisibility, the training-config algebra
of C-TRAINCFG-001 (the seeds' "epochs=1 ran 43 of 5000 steps" bug), warmup <= 10 % of steps,
tokenizer vocab == model vocab, and the training-memory estimate against the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import random
import time
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import yaml

from falsify.impl.llm import checkpoint as ckpt_mod
from falsify.impl.llm import data as data_mod
from falsify.impl.llm.model import (
    ModelConfig,
    ModelConfigError,
    Transformer,
    build_model,
    generate,
    loss_sum,
    param_count,
    preset,
)
from falsify.impl.torch import lr_schedule

log = logging.getLogger("falsify.train")
IGNORE_INDEX = -100
ARCH_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
               "intermediate_size", "rope_theta", "rms_norm_eps", "init_std")


class ConfigError(ValueError):
    """A bad config field; the message names it."""


class PreflightError(RuntimeError):
    """The run would fail or silently not do what the config says; raised before step 1."""


class AndonStop(RuntimeError):
    """The run was stopped by an Andon rule; the last good checkpoint is kept."""

    def __init__(self, message: str, step: int, result: TrainResult | None = None):
        super().__init__(message)
        self.step = step
        self.result = result


@dataclass
class TrainConfig:
    # model: a preset, and per-field overrides (null = the preset's value)
    model: str = "tiny"
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    intermediate_size: int | None = None
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    init_std: float | None = None
    seq_len: int | None = None  # block length = the model's max_seq_len
    backend: str = "auto"  # torch | triton | auto (auto: triton only with a GPU; logged)
    # data
    corpus: str = "stdlib"  # stdlib | synthetic | none
    data_files: list[str] = field(default_factory=list)
    jsonl_field: str = "text"
    max_files: int | None = None
    max_bytes: int | None = None
    val_fraction: float = 0.05
    synthetic_tokens: int = 200_000
    fim_rate: float = 0.0  # Albor used 0.5 PSM; off by default so val ppl is plain left-to-right
    cache_dir: str = ".falsify/cache"
    # steps
    batch_size: int = 16
    grad_accum: int = 1
    epochs: int = 1
    max_steps: int = 300
    warmup_steps: int = 30
    # optimizer (Albor §6.1 values; lr scaled up for the tiny model)
    lr: float = 3e-3
    lr_min: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # always applied (ALB-071: a safety clip that can be off is a bug)
    # Andon stops
    andon_grad_norm: float = 100.0  # pre-clip global grad norm above this stops the run
    andon_loss_max: float | None = None  # loss above this stops the run (null: only non-finite)
    # runtime
    seed: int = 42
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (fp32 on CPU, bf16 autocast on CUDA) | fp32 | bf16
    threads: int | None = None  # null: all cores, or 1 when the machine is already loaded
    activation_checkpointing: bool = False
    memory_budget_gb: float | None = None  # null: the machine's RAM (CPU) / GPU memory
    # evaluation, logging, checkpoints
    eval_interval: int = 100
    eval_batches: int = 16
    log_interval: int = 10
    save_interval: int = 100
    keep_last: int = 2
    out_dir: str | None = None  # null: a new runs/<model>-<UTC time> per fresh run
    progress: bool = True
    # sample at the end
    sample_tokens: int = 120
    sample_prompt: str = "def"
    sample_temperature: float = 0.8
    sample_top_k: int = 40


# Fields that may differ between a checkpoint's config and the resumed run: they do not change
# the arithmetic of any step, so bit-identical continuation holds.
RESUME_MUTABLE = {"eval_interval", "eval_batches", "log_interval", "save_interval", "keep_last",
                  "out_dir", "progress", "sample_tokens", "sample_prompt", "sample_temperature",
                  "sample_top_k", "threads", "cache_dir", "andon_grad_norm", "andon_loss_max",
                  "memory_budget_gb"}


# ------------------------------------------------------------------------ config parsing
def _hints() -> dict[str, object]:
    return typing.get_type_hints(TrainConfig)


def _is_optional(tp) -> tuple[bool, object]:
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return True, rest[0]
    return False, tp


def _finite(name: str, x: int | float) -> float:
    """Every float field must be finite. inf passes each `> 0` check yet means "off"
    (`grad_clip=inf` silently skipped clipping, the seeds' ALB-071) or fails only once training
    starts (`lr=inf`: the schedule's error at step 1, after the data is built); a NaN fails every
    comparison, so a field without a range check would let it through."""
    try:
        f = float(x)  # an int beyond float range (YAML `lr: 1000…0`) raises OverflowError
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(f"config field {name!r} must be a finite number, got {x!r}")
    return f


def _coerce(name: str, tp, value, from_text: bool):
    optional, base = _is_optional(tp)
    if value is None or (from_text and str(value).lower() in ("null", "none", "~")):
        if optional:
            return None
        raise ConfigError(f"config field {name!r} may not be null")
    if typing.get_origin(base) is list:
        if from_text:
            value = [v for v in str(value).split(",") if v] if value != "" else []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"config field {name!r} must be a list of strings, got {value!r}")
        return list(value)
    if from_text:
        text = str(value)
        try:
            if base is bool:
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return text.lower() in ("true", "1", "yes")
            if base is int:
                return int(text.replace("_", ""))
            if base is float:
                parsed = float(text)
            else:
                return text
        except ValueError:
            raise ConfigError(f"config field {name!r}: cannot parse {text!r} as "
                              f"{base.__name__}") from None
        return _finite(name, parsed)
    if base is bool and not isinstance(value, bool):
        raise ConfigError(f"config field {name!r} must be true/false, got {value!r}")
    if base is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"config field {name!r} must be an int, got {value!r}")
    if base is float:
        if isinstance(value, str):
            # YAML 1.1 reads "3e-4" (no dot) as a string; accept it as the number it clearly is.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config field {name!r} must be a number, got {value!r}")
        return _finite(name, value)
    if base is str and not isinstance(value, str):
        raise ConfigError(f"config field {name!r} must be a string, got {value!r}")
    return value


def config_from_dict(d: dict, source: str = "config", base: TrainConfig | None = None,
                     from_text: bool = False) -> TrainConfig:
    """Strict: an unknown key is an error naming it (with the closest known names)."""
    hints = _hints()
    known = [f.name for f in fields(TrainConfig)]
    values = asdict(base) if base is not None else {}
    for k, v in d.items():
        if k not in hints:
            import difflib

            close = difflib.get_close_matches(k, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"{source}: unknown config field {k!r}{hint}")
        values[k] = _coerce(k, hints[k], v, from_text)
    cfg = TrainConfig(**values)
    validate_config(cfg)
    return cfg


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"override {it!r} is not key=value")
        k, v = it.split("=", 1)
        out[k.strip()] = v
    return out


def read_yaml_config(path: str | Path) -> dict:
    from falsify.impl.llm.config_file import read_config_file  # it imports this module

    return read_config_file(path)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: TrainConfig | None = None) -> TrainConfig:
    """YAML file (flat mapping of TrainConfig fields) then `key=value` overrides."""
    cfg = base or TrainConfig()
    if path is not None:
        cfg = config_from_dict(read_yaml_config(path), source=str(path), base=cfg)
    if overrides:
        cfg = config_from_dict(parse_overrides(list(overrides)), source="command line",
                               base=cfg, from_text=True)
    validate_config(cfg)
    return cfg


def validate_config(cfg: TrainConfig) -> None:
    """Value checks that need no data: each error names its field."""
    def need(cond: bool, name: str, why: str):
        if not cond:
            raise ConfigError(f"config field {name}={getattr(cfg, name)!r}: {why}")

    for name in ("batch_size", "grad_accum", "epochs", "max_steps", "eval_batches",
                 "log_interval", "eval_interval", "save_interval", "keep_last"):
        need(getattr(cfg, name) >= 1, name, "must be >= 1")
    for name in ("max_files", "max_bytes", "threads"):  # null: no limit / automatic
        need(getattr(cfg, name) is None or getattr(cfg, name) >= 1, name, "must be >= 1 or null")
    for name in ("andon_loss_max", "memory_budget_gb"):  # null: off / the machine's memory
        need(getattr(cfg, name) is None or getattr(cfg, name) > 0, name, "must be > 0 or null")
    need(cfg.synthetic_tokens >= 1, "synthetic_tokens", "must be >= 1")
    need(0 <= cfg.val_fraction < 1, "val_fraction", "must be in [0, 1)")
    need(cfg.sample_tokens >= 0, "sample_tokens", "must be >= 0")
    need(cfg.warmup_steps >= 0, "warmup_steps", "must be >= 0")
    need(cfg.lr > 0, "lr", "must be > 0")
    need(0 <= cfg.lr_min <= cfg.lr, "lr_min", "must be in [0, lr]")
    need(0 <= cfg.beta1 < 1, "beta1", "must be in [0, 1)")
    need(0 <= cfg.beta2 < 1, "beta2", "must be in [0, 1)")
    need(cfg.adam_eps > 0, "adam_eps", "must be > 0")
    need(cfg.weight_decay >= 0, "weight_decay", "must be >= 0")
    need(cfg.grad_clip > 0, "grad_clip", "must be > 0 (clipping is always on)")
    need(cfg.andon_grad_norm > 0, "andon_grad_norm", "must be > 0")
    need(cfg.backend in ("torch", "triton", "auto"), "backend", "must be torch, triton or auto")
    need(cfg.device in ("auto", "cpu", "cuda"), "device", "must be auto, cpu or cuda")
    need(cfg.precision in ("auto", "fp32", "bf16"), "precision", "must be auto, fp32 or bf16")
    need(0 <= cfg.fim_rate <= 1, "fim_rate", "must be in [0, 1]")
    need(cfg.sample_temperature >= 0, "sample_temperature", "must be >= 0")
    need(cfg.sample_top_k >= 1, "sample_top_k", "must be >= 1")
    try:
        model_config(cfg)
    except ModelConfigError as e:
        raise ConfigError(str(e)) from None


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The preset with the non-null architecture fields of `cfg` applied (validated)."""
    over = {k: getattr(cfg, k) for k in ARCH_FIELDS if getattr(cfg, k) is not None}
    if cfg.seq_len is not None:
        over["max_seq_len"] = cfg.seq_len
    return preset(cfg.model, **over)


def effective_config(cfg: TrainConfig, extra: dict | None = None) -> dict:
    return {"train": asdict(cfg), "model": model_config(cfg).to_dict(), **(extra or {})}


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------- preflight
def config_algebra(n_sequences: int, batch_size: int, grad_accum: int, epochs: int,
                   max_steps: int, warmup_steps: int, seq_len: int = 1) -> dict:
    """C-TRAINCFG-001's equations on plain ints (z3/CrossHair-friendly).

    steps_per_epoch = floor(n_sequences / batch_size / grad_accum)
    achievable      = epochs · steps_per_epoch        (must be >= max_steps)
    min_epochs      = ceil(max_steps / steps_per_epoch)
    warmup_fraction = warmup_steps / max_steps         (must be <= 0.10)
    total_tokens    = max_steps · batch_size · grad_accum · seq_len
    """
    spe = n_sequences // (batch_size * grad_accum)
    try:
        warmup_fraction = warmup_steps / max_steps
    except OverflowError:  # a quotient beyond float range (CrossHair found it): IEEE's inf
        warmup_fraction = math.inf
    return {"steps_per_epoch": spe, "achievable_steps": epochs * spe,
            "min_epochs": -(-max_steps // spe) if spe else None,
            "warmup_fraction": warmup_fraction,
            "total_tokens": max_steps * batch_size * grad_accum * seq_len,
            "ok": spe >= 1 and epochs * spe >= max_steps and 10 * warmup_steps <= max_steps}


def check_config_algebra(n_sequences: int, batch_size: int, grad_accum: int, epochs: int,
                         max_steps: int, warmup_steps: int, seq_len: int = 1) -> dict:
    """Raise PreflightError if max_steps is unreachable or warmup exceeds 10 % of the steps.
    FALSIFY-CFG-001: (22079, 4, 128, epochs=1, max_steps=5000) -> 43 steps per epoch: error."""
    a = config_algebra(n_sequences, batch_size, grad_accum, epochs, max_steps, warmup_steps,
                       seq_len)
    spe = a["steps_per_epoch"]
    if spe < 1:
        raise PreflightError(
            f"steps_per_epoch = floor({n_sequences} sequences / batch_size {batch_size} / "
            f"grad_accum {grad_accum}) = 0: not enough data for one optimizer step")
    if a["achievable_steps"] < max_steps:
        raise PreflightError(
            f"max_steps={max_steps} is unreachable: steps_per_epoch = floor({n_sequences} / "
            f"{batch_size} / {grad_accum}) = {spe}, epochs={epochs} gives "
            f"{a['achievable_steps']} steps; set epochs >= {a['min_epochs']} or lower max_steps")
    if 10 * warmup_steps > max_steps:
        raise PreflightError(
            f"warmup_steps={warmup_steps} is {a['warmup_fraction']:.1%} of max_steps="
            f"{max_steps}; must be <= 10% so warmup completes and the cosine phase dominates")
    return a


# Bytes of saved activations per token per layer, fp32, for our block (what autograd keeps):
# norm inputs 2H, norm outputs 2H, q and attention output 2·Hq·d = 2H, k and v 2·D_kv,
# gate and up 2I, SwiGLU output I; i.e. (6H + 2·D_kv + 3I) floats. Albor's K=10·H per layer
# undercounts the FFN when I = 4H; we report both and budget with ours.
def memory_estimate(mcfg: ModelConfig, batch_size: int, seq_len: int,
                    activation_checkpointing: bool = False, act_bytes: int = 4,
                    grad_accum: int = 1) -> dict:
    """Training-memory contract: weights 4P, grads 4P, AdamW 8P (fp32), + activations, + (with
    grad_accum > 1) 4P: from the second micro-batch on, autograd computes each gradient in a
    fresh buffer before adding it into .grad, and the torch profiler shows them coexisting
    (train-loop-v1, FALSIFY-TL-008). Outside the layers: the embedding output and the final
    norm's input and output (3·tokens·H), and the tied embedding's gradient, which arrives from
    the lookup and from the output projection and is summed in a second V·H buffer."""
    p = param_count(mcfg)
    h, i = mcfg.hidden_size, mcfg.intermediate_size
    d_kv = mcfg.num_kv_heads * mcfg.head_dim
    tokens = batch_size * seq_len
    per_layer = tokens * (6 * h + 2 * d_kv + 3 * i) * act_bytes
    if activation_checkpointing:  # block inputs kept, one block's internals live at a time
        acts = mcfg.num_layers * tokens * h * act_bytes + per_layer
    else:
        acts = mcfg.num_layers * per_layer
    # [tokens, V] fp32 buffers live at once at the loss's backward when the logits are built
    # (the autocast path): the logits, the saved log-softmax, the NLL's gradient, and
    # log-softmax backward's exp(output) temporary — the step's peak there (torch profiler).
    # The fp32 path fuses LM head + CE over token chunks and needs less: an upper bound there
    # (measured 3.66 MB vs 4.95 MB estimated on the tiny test config, train-loop-v1 TL-MEM-003).
    logits = 4 * tokens * mcfg.vocab_size * 4
    outside = 3 * tokens * h * act_bytes + mcfg.vocab_size * h * 4
    out = {"params": p, "weights": 4 * p, "grads": 4 * p, "optimizer": 8 * p,
           "accum_grads": 4 * p if grad_accum > 1 else 0,
           "activations": acts + outside + logits, "logits": logits,
           "activations_albor": mcfg.num_layers * seq_len * h * 10 * 4 * batch_size}
    out["total"] = (out["weights"] + out["grads"] + out["accum_grads"] + out["optimizer"]
                    + out["activations"])
    return out


def machine_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def preflight(cfg: TrainConfig, mcfg: ModelConfig, n_train_blocks: int, n_val_blocks: int,
              tokenizer_vocab: int, device: torch.device, parts: LoopParts | None = None) -> dict:
    """All pre-step-1 checks; returns the numbers for the run log, raises PreflightError."""
    parts = parts or LoopParts()
    try:
        mcfg.validate()
    except ModelConfigError as e:
        raise PreflightError(str(e)) from None
    if tokenizer_vocab != mcfg.vocab_size:
        raise PreflightError(f"tokenizer vocab {tokenizer_vocab} != model vocab_size "
                             f"{mcfg.vocab_size}")
    algebra = parts.check_config_algebra(n_train_blocks, cfg.batch_size, cfg.grad_accum,
                                         cfg.epochs, cfg.max_steps, cfg.warmup_steps,
                                         mcfg.max_seq_len)
    if cfg.val_fraction > 0 and n_val_blocks == 0:
        raise PreflightError(f"val_fraction={cfg.val_fraction} but the validation split has "
                             f"fewer than {mcfg.max_seq_len + 1} tokens (no full block)")
    mem = memory_estimate(mcfg, cfg.batch_size, mcfg.max_seq_len, cfg.activation_checkpointing,
                          grad_accum=cfg.grad_accum)
    budget = (cfg.memory_budget_gb * 2**30 if cfg.memory_budget_gb is not None
              else machine_memory_bytes(device))
    if mem["total"] > budget:
        raise PreflightError(
            f"estimated training memory {mem['total'] / 2**30:.2f} GiB (weights "
            f"{mem['weights'] / 2**30:.2f} + grads {mem['grads'] / 2**30:.2f} + AdamW "
            f"{mem['optimizer'] / 2**30:.2f} + activations {mem['activations'] / 2**30:.2f}) "
            f"exceeds the budget {budget / 2**30:.2f} GiB; lower batch_size or seq_len, or set "
            "activation_checkpointing=true")
    return {"algebra": algebra, "memory": mem, "memory_budget": budget}


# ---------------------------------------------------------------------- optimizer, schedule
def lr_at(step: int, lr: float, lr_min: float, warmup_steps: int, max_steps: int) -> float:
    """LR of update `step` (0-based: the number of updates already applied), from the
    contract-checked schedule impl/torch/lr_schedule.py: linear warmup lr·step/W (so update W
    is the first at the peak; Albor: 3e-4·43/2000 = 6.45e-6), then cosine from lr at W to
    lr_min at max_steps. Like HF's get_cosine_schedule_with_warmup, update 0 has lr 0 when
    W > 0 (it still fills AdamW's moments)."""
    return lr_schedule.lr_at_step(step, warmup_steps, max_steps, lr, lr_min)


def is_no_decay(name: str) -> bool:
    """Norm gains and the (tied) embedding are not decayed. Decaying a gain pulls it to 0, i.e.
    toward a zero output; decaying the embedding shrinks rows of rare tokens that get few
    gradient updates (OLMo and others exclude embeddings for this reason). Everything else — the
    projection matrices — gets decoupled weight decay."""
    return name.endswith("norm.weight") or name == "embed_tokens.weight"


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig):
    """AdamW with every hyperparameter explicit from the config (C-HYPERPARAMS-001);
    returns (optimizer, parameter names in optimizer order)."""
    decay, no_decay, dn, nn_ = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if is_no_decay(name) else decay).append(p)
        (nn_ if is_no_decay(name) else dn).append(name)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    # fused: one multithreaded C++ kernel per parameter instead of ~8 elementwise passes over
    # it (62M parameters, 1 CPU thread: 51 ms vs 304 ms per step with foreach=False); the same
    # update rule. transformers' Trainer defaults to it too (optim="adamw_torch_fused").
    fused = all(p.device.type in ("cpu", "cuda") for p in decay + no_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay, foreach=False if not fused else None,
                            fused=fused or None)
    return opt, dn + nn_


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> float:
    """Global-norm clip of the gradients in place, on every step (ALB-071: a safety clip behind
    an optional setting is a bug); returns the norm before clipping. torch's clip_grad_norm_:
    coef = min(1, c / (‖g‖ + 1e-6)), the same rule as impl/torch/grad_clip.py and
    reference/grad_clip.py. Not the former: its overflow-safe scaled norm makes ~4 passes over the
    gradients (0.78 s vs 0.05 s per step at 50m, 1 CPU thread). The price: ‖g‖ > ~1.8e19 reads as
    inf here, which the Andon check turns into a stop rather than a clip."""
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=False))


def micro_batch_divisors(token_counts: list[int]) -> list[int]:
    """What each micro-batch's loss sum is divided by before backward: the token count of the
    whole step, so Σ_m s_m / N is the loss of one batch holding every micro-batch (every token
    weighs the same; not the mean of per-micro-batch means, which over-weighs the tokens of
    short micro-batches)."""
    total = sum(token_counts)
    return [total] * len(token_counts)


# ------------------------------------------------------------------------------- the step
@dataclass
class StepStats:
    step: int
    loss: float
    grad_norm: float  # global L2 norm before clipping
    lr: float
    tokens: int
    params_finite: bool


class Trainer:
    """One optimizer step = grad_accum micro-batches, token-weighted, clipped, AdamW."""

    def __init__(self, model: Transformer, cfg: TrainConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None = None, parts: LoopParts | None = None):
        self.model, self.cfg, self.device = model, cfg, device
        self.parts = parts or LoopParts()
        self.optimizer, self.param_names = self.parts.build_optimizer(model, cfg)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.step = 0
        self.autocast_dtype = autocast_dtype

    def lr(self, step: int) -> float:
        """LR of the update with 0-based index `step`."""
        c = self.cfg
        return lr_at(step, c.lr, c.lr_min, c.warmup_steps, c.max_steps)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> StepStats:
        """Loss = Σ_micro Σ_tokens CE / (total non-ignored tokens of the whole step): every token
        weighs the same whatever micro-batch it is in (not a mean of per-micro means). Raises
        AndonStop, without applying the update, on a non-finite loss or grad norm or one above
        its threshold; after the update, if any parameter is non-finite."""
        t = self.step + 1
        lr = self.lr(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        counts = [int((y != IGNORE_INDEX).sum()) for _, y in micro_batches]
        n_tokens = sum(counts)
        if n_tokens == 0:
            raise ValueError(f"step {t}: every target is ignore_index; nothing to learn from")
        divisors = self.parts.micro_batch_divisors(counts)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        total = 0.0
        for (x, y), d in zip(micro_batches, divisors, strict=True):
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            if self.autocast_dtype is None:
                # fp32: LM head + CE fused over token chunks (Transformer.loss_sum), the same
                # Σ CE as the logits path below without building the [tokens, V] logits
                s, _ = self.model.loss_sum(x, y, IGNORE_INDEX)
            else:
                with self._autocast():
                    logits = self.model(x)
                s, _ = loss_sum(logits, y, IGNORE_INDEX)
            (s / d).backward()
            total += float(s.detach())
        loss = total / n_tokens
        if not math.isfinite(loss):
            raise AndonStop(f"Andon: non-finite loss ({loss}) at step {t}", t)
        if self.cfg.andon_loss_max is not None and loss > self.cfg.andon_loss_max:
            raise AndonStop(f"Andon: loss {loss:.4f} > andon_loss_max="
                            f"{self.cfg.andon_loss_max} at step {t}", t)
        gn = self.parts.clip_gradients(self.params, self.cfg.grad_clip)
        if not math.isfinite(gn):
            raise AndonStop(f"Andon: non-finite gradient norm ({gn}) at step {t}", t)
        if gn > self.cfg.andon_grad_norm:
            raise AndonStop(f"Andon: gradient norm {gn:.3g} > andon_grad_norm="
                            f"{self.cfg.andon_grad_norm} at step {t} (update not applied)", t)
        self.optimizer.step()
        self.step = t
        # One read-only pass: a sum is NaN/inf iff an element is (or the sum overflows,
        # |θ| ~ 1e38, which deserves a stop as much). isfinite().all() per tensor costs 25x more.
        finite = bool(torch.isfinite(torch.stack([p.detach().sum() for p in self.params])).all())
        if not finite:
            bad = [n for n, p in zip(self.param_names, self.params)
                   if not bool(torch.isfinite(p).all())]
            raise AndonStop(f"Andon: non-finite parameters after step {t}: {bad[:5]}", t)
        return StepStats(t, loss, gn, lr, n_tokens, finite)

    @torch.no_grad()
    def evaluate(self, batches) -> tuple[float, float]:
        """(mean token CE, perplexity = exp(mean CE)) over the given batches."""
        self.model.eval()
        total, n = 0.0, 0
        for x, y in batches:
            with self._autocast():
                logits = self.model(x.to(self.device))
            s, c = loss_sum(logits, y.to(self.device), IGNORE_INDEX)
            total, n = total + float(s), n + c
        self.model.train()
        if n == 0:
            raise ValueError("evaluation got no tokens")
        loss = total / n
        return loss, math.exp(min(loss, 700.0))


def restore_position(trainer: Trainer, sampler: data_mod.BatchSampler, state: dict) -> None:
    """After the weights, optimizer and RNG states are loaded: the step counter (which is also
    the LR schedule's position) and the data position, so a resumed run continues the same
    schedule on the same next batch instead of restarting warmup or replaying data."""
    trainer.step = int(state["step"])
    sampler.load_state_dict(state["data"])


@dataclass(frozen=True)
class LoopParts:
    """The loop's swappable pieces. contracts/train-loop-v1.yaml binds each one, and its mutants
    (falsify/mutants/train.py) replace one at a time in the real loop; a run uses the defaults."""

    build_optimizer: Callable = build_optimizer
    clip_gradients: Callable = clip_gradients
    micro_batch_divisors: Callable = micro_batch_divisors
    sampler: Callable = data_mod.BatchSampler
    check_config_algebra: Callable = check_config_algebra
    restore_position: Callable = restore_position


# ------------------------------------------------------------------------------- the run
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


def resolve_device(cfg: TrainConfig) -> tuple[torch.device, torch.dtype | None]:
    """(device, autocast dtype or None for fp32)."""
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("config field device='cuda' but no CUDA device is available")
    dev = torch.device("cuda" if cfg.device == "cuda" or
                       (cfg.device == "auto" and torch.cuda.is_available()) else "cpu")
    if cfg.precision == "bf16" and dev.type != "cuda":
        raise ConfigError("config field precision='bf16' needs a CUDA device (CPU trains fp32)")
    if cfg.precision == "bf16" or (cfg.precision == "auto" and dev.type == "cuda"):
        return dev, torch.bfloat16
    return dev, None


def data_spec(cfg: TrainConfig, vocab_size: int) -> data_mod.DataSpec:
    return data_mod.DataSpec(corpus=cfg.corpus, data_files=tuple(cfg.data_files),
                             jsonl_field=cfg.jsonl_field, max_files=cfg.max_files,
                             max_bytes=cfg.max_bytes, val_fraction=cfg.val_fraction,
                             vocab_size=vocab_size, synthetic_tokens=cfg.synthetic_tokens,
                             seed=cfg.seed)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


RUNS_ROOT = Path("runs")


def new_run_dir(model: str, root: Path = RUNS_ROOT) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path, n = root / f"{model}-{stamp}", 1
    while path.exists():
        n += 1
        path = root / f"{model}-{stamp}-{n}"
    return path


def find_resume_checkpoint(resume: str | Path, out_dir: str | None,
                           root: Path = RUNS_ROOT) -> Path:
    """`resume`: a checkpoint or run directory, or "auto": the latest checkpoint of out_dir, or
    with out_dir unset, of the most recently written run under runs/. The checkpoint is verified
    (checkpoint.verify_checkpoint); "auto" falls back to the newest intact one with a warning,
    a named one that is damaged is an error offering it. Orphaned temp dirs are removed."""
    if str(resume) != "auto":  # a named checkpoint/run: a damaged one is refused, never swapped
        found = ckpt_mod.find_checkpoint(resume, for_resume=True)
    elif out_dir is not None:
        found = ckpt_mod.find_checkpoint(out_dir, fallback=True, for_resume=True)
    else:
        latest = [c for r in (root.iterdir() if root.is_dir() else [])
                  if (c := ckpt_mod.latest_checkpoint(r)) is not None]
        if not latest:
            raise ckpt_mod.CheckpointError(f"--resume: no run with a checkpoint under {root}/")
        run = max(latest, key=lambda c: (c / ckpt_mod.STATE).stat().st_mtime).parent.parent
        found = ckpt_mod.find_checkpoint(run, fallback=True, for_resume=True)
    ckpt_mod.remove_orphans(found.parent.parent)
    return found


def _check_resume_config(saved: dict, cfg: TrainConfig, where: Path) -> None:
    now = asdict(cfg)
    diff = [k for k in now if k not in RESUME_MUTABLE and saved.get(k) != now[k]]
    if diff:
        k = diff[0]
        raise ConfigError(f"config field {k!r} is {now[k]!r} but checkpoint {where} was written "
                          f"with {saved.get(k)!r}; resuming with a different {k} would not "
                          "continue the same run")


class _Progress:
    """Rich progress bar with loss, lr, grad norm, tokens/s and ETA; a no-op when disabled."""

    def __init__(self, enabled: bool, total: int, start: int):
        self.bar = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, stats="")
        self.bar.start()

    def update(self, step: int, stats: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, stats=stats)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def train(cfg: TrainConfig, *, resume: str | Path | None = None,
          data: data_mod.PreparedData | None = None, stop_after: int | None = None,
          keep_model: bool = False, parts: LoopParts | None = None) -> TrainResult:
    """Run (or resume) a training run as configured. `resume`: a run or checkpoint directory,
    or "auto" for the latest checkpoint in cfg.out_dir. `stop_after`: stop once this optimizer
    step is done (and checkpointed), as if killed there: the schedule still runs to max_steps."""
    threads = torch.get_num_threads()
    try:
        n, why = resolve_threads(cfg.threads)
        log.info("torch threads: %d (%s)", n, why)
        torch.set_num_threads(n)
        return _train(cfg, resume, data, stop_after, keep_model, parts or LoopParts())
    finally:  # the thread count is process-global: do not leak it to the caller
        torch.set_num_threads(threads)


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


def _train(cfg: TrainConfig, resume, data, stop_after, keep_model,
           parts: LoopParts) -> TrainResult:
    t_start = time.perf_counter()
    validate_config(cfg)
    device, autocast = resolve_device(cfg)
    mcfg = model_config(cfg)
    ckpt_path = None
    if resume is not None:
        ckpt_path = find_resume_checkpoint(resume, cfg.out_dir)
        saved = ckpt_mod.read_state(ckpt_path)["config"]["train"]
        _check_resume_config(saved, cfg, ckpt_path)
        if cfg.out_dir is None:
            cfg = dataclasses.replace(cfg, out_dir=str(ckpt_path.parent.parent))
    elif cfg.out_dir is None:
        cfg = dataclasses.replace(cfg, out_dir=str(new_run_dir(cfg.model)))
    elif ckpt_mod.list_checkpoints(cfg.out_dir):
        raise ConfigError(f"out_dir={cfg.out_dir!r} already holds checkpoints; pass --resume "
                          "to continue that run or choose another out_dir")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)

    if data is None:
        data = data_mod.prepare_data(data_spec(cfg, mcfg.vocab_size), cfg.cache_dir)
    eos = data.special_ids[data_mod.EOS]
    train_stream = data_mod.token_stream(data.train, eos, cfg.fim_rate, cfg.seed,
                                         data.special_ids)
    val_stream = data_mod.token_stream(data.val, eos)  # no FIM: val ppl is left-to-right
    sampler = parts.sampler(train_stream, mcfg.max_seq_len, cfg.batch_size, cfg.grad_accum,
                            cfg.epochs, cfg.seed, data.key)
    pre = preflight(cfg, mcfg, sampler.n_blocks,
                    data_mod.num_blocks(len(val_stream), mcfg.max_seq_len), data.vocab_size,
                    device, parts)

    model = build_model(mcfg, cfg.backend, device, seed=cfg.seed)
    model.activation_checkpointing = cfg.activation_checkpointing
    trainer = Trainer(model, cfg, device, autocast, parts)
    log.info("backend=%s kernels=%s", model.ops.backend, model.ops.provenance)
    extra = {"backend": model.ops.backend, "kernels": model.ops.provenance,
             "threads": torch.get_num_threads(),
             "device": str(device), "autocast": str(autocast), "data": data.info,
             "preflight": pre}
    _atomic_write_text(out / "config.json",
                       json.dumps(effective_config(cfg, extra), indent=1, default=str))
    _atomic_write_text(out / "config.yaml", yaml.safe_dump(asdict(cfg), sort_keys=False))

    result = TrainResult(out_dir=str(out), preflight=pre, data_info=data.info)
    best_val = None
    metrics_path = out / "metrics.jsonl"
    if ckpt_path is not None:
        state = ckpt_mod.load_checkpoint(ckpt_path, model, trainer.optimizer,
                                         trainer.param_names)
        parts.restore_position(trainer, sampler, state)
        best_val = state.get("best_val_loss")
        result.resumed_from = str(ckpt_path)
        _truncate_metrics(metrics_path, trainer.step)
        log.info("resumed from %s at step %d", ckpt_path, trainer.step)

    def save(metrics: dict | None = None) -> Path:
        return ckpt_mod.save_checkpoint(
            out, trainer.step, model, trainer.optimizer, trainer.param_names,
            data_state=sampler.state_dict(), config=effective_config(cfg),
            metrics=metrics, extra={"best_val_loss": best_val}, keep_last=cfg.keep_last)

    def do_eval() -> tuple[float, float]:
        return trainer.evaluate(data_mod.eval_batches(val_stream, mcfg.max_seq_len,
                                                      cfg.batch_size, cfg.eval_batches))

    progress = _Progress(cfg.progress, cfg.max_steps, trainer.step)
    mf = metrics_path.open("a", buffering=1)
    t_loop, tokens0 = time.perf_counter(), 0
    try:
        while trainer.step < cfg.max_steps:
            micro = sampler.next_step()
            t0 = time.perf_counter()
            try:
                st = trainer.train_step(micro)
            except AndonStop as e:
                e.result = result
                _atomic_write_text(out / "andon.json", json.dumps(
                    {"step": e.step, "reason": str(e),
                     "last_good_checkpoint": str(ckpt_mod.latest_checkpoint(out))}))
                raise
            dt = time.perf_counter() - t0
            tokens0 += st.tokens
            tps = tokens0 / (time.perf_counter() - t_loop)
            for lst, v in ((result.steps, st.step), (result.losses, st.loss),
                           (result.grad_norms, st.grad_norm), (result.lrs, st.lr),
                           (result.params_finite, st.params_finite)):
                lst.append(v)
            mf.write(json.dumps({"step": st.step, "loss": st.loss, "lr": st.lr,
                                 "grad_norm": st.grad_norm, "tokens": st.tokens,
                                 "step_s": dt, "tok_s": tps}) + "\n")
            progress.update(st.step, f"loss {st.loss:.3f} lr {st.lr:.2e} gnorm "
                                     f"{st.grad_norm:.2f} {tps:,.0f} tok/s")
            if st.step % cfg.log_interval == 0 and not cfg.progress:
                log.info("step %d loss %.4f lr %.3e gnorm %.3f %.0f tok/s", st.step, st.loss,
                         st.lr, st.grad_norm, tps)
            metrics = None
            if cfg.val_fraction > 0 and (st.step % cfg.eval_interval == 0
                                         or st.step == cfg.max_steps):
                vl, vp = do_eval()
                best_val = vl if best_val is None else min(best_val, vl)
                result.evals.append({"step": st.step, "val_loss": vl, "val_ppl": vp})
                mf.write(json.dumps({"step": st.step, "val_loss": vl, "val_ppl": vp}) + "\n")
                metrics = {"val_loss": vl, "val_ppl": vp}
            stopping = stop_after is not None and st.step >= stop_after
            if st.step % cfg.save_interval == 0 or st.step == cfg.max_steps or stopping:
                result.checkpoint = str(save(metrics))
            if stopping:
                result.stopped = f"stop_after={stop_after}"
                break
    finally:
        progress.close()
        mf.close()
    result.final_step = trainer.step
    result.tokens = tokens0
    result.tokens_per_s = tokens0 / max(1e-9, time.perf_counter() - t_loop)
    if not result.stopped:
        result.stopped = "max_steps"
        if result.evals and result.evals[-1]["step"] == trainer.step:
            result.val_loss, result.val_ppl = (result.evals[-1]["val_loss"],
                                               result.evals[-1]["val_ppl"])
        result.sample = _sample(model, cfg, data, device)
        _atomic_write_text(out / "summary.json", json.dumps(
            {k: v for k, v in asdict(result).items() if k not in ("model",)}, default=str))
    result.elapsed_s = time.perf_counter() - t_start
    if keep_model:
        result.model = model
    return result


def _truncate_metrics(path: Path, step: int) -> None:
    """After resuming at `step`, drop records a killed run wrote for later steps."""
    ckpt_mod.truncate_metrics(path, step)


def _sample(model: Transformer, cfg: TrainConfig, data: data_mod.PreparedData,
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
    import tempfile

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = tiny_config(out_dir or tmp, max_steps=steps, seed=seed,
                          warmup_steps=overrides.pop("warmup_steps", max(0, steps // 10)),
                          save_interval=overrides.pop("save_interval", steps),
                          eval_interval=overrides.pop("eval_interval", steps), **overrides)
        validate_config(cfg)
        torch.set_num_threads(resolve_threads(cfg.threads)[0])
        try:
            return _run_steps(cfg, steps, parts or LoopParts())
        finally:
            torch.set_num_threads(threads)


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
                 "grad_flow": {}, "config": effective_config(cfg)}
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

