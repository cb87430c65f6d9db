"""The optimizer step both training loops share: schedule -> forward/backward over the
micro-batches -> Andon checks -> clip -> AdamW step -> finiteness check.

What runs is what the kernel contracts check. The learning rate is set by
falsify/kernels/torch/lr_schedule.py:set_lr (lr-schedule-kernel-v1), the gradients are clipped by
the
model backend's falsify/kernels/<backend>/grad_clip.py:clip_grad_norm_ (grad-clip-kernel-v1), and
the
update is falsify/kernels/<backend>/adamw.py:adamw_multi (adamw-kernel-v1) driven by the AdamW
optimizer
class; all three come from the model's `Ops` bundle (falsify/llm/ops.py), whose `provenance` the
run config and every checkpoint record. The contracts' bindings (adamw_step, clip_grad_norm,
lr_at) are thin wrappers over these same functions.

Pretraining and fine-tuning differ only in what one micro-batch contributes: `micro_loss`
(the loss numerator and its stats) and `count` (its share of the step's normaliser). The
fine-tuning trainer (falsify/llm/finetune.py) overrides those two; the update is this one.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from falsify.kernels.torch import lr_schedule
from falsify.kernels.torch.adamw import AdamW
from falsify.llm import data as data_mod
from falsify.llm.config import LoopConfig
from falsify.llm.model import Transformer, loss_sum
from falsify.llm.preflight import check_config_algebra

IGNORE_INDEX = -100
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s eps: coef = c / (‖g‖ + 1e-6)


class AndonStop(RuntimeError):
    """The run was stopped by an Andon rule; the last good checkpoint is kept."""

    def __init__(self, message: str, step: int, result=None):
        super().__init__(message)
        self.step = step
        self.result = result


# ---------------------------------------------------------------------- optimizer, schedule
def lr_at(step: int, lr: float, lr_min: float, warmup_steps: int, max_steps: int) -> float:
    """LR of update `step` (0-based: the number of updates already applied), from the
    contract-checked schedule falsify/kernels/torch/lr_schedule.py: linear warmup lr·step/W (so
    update W
    is the first at the peak; W = 2000: 3e-4·43/2000 = 6.45e-6), then cosine from lr at W to
    lr_min at max_steps. Like HF's get_cosine_schedule_with_warmup, update 0 has lr 0 when
    W > 0 (it still fills AdamW's moments)."""
    return lr_schedule.lr_at_step(step, warmup_steps, max_steps, lr, lr_min)


def is_no_decay(name: str) -> bool:
    """Norm gains and the (tied) embedding are not decayed. Decaying a gain pulls it to 0, i.e.
    toward a zero output; decaying the embedding shrinks rows of rare tokens that get few
    gradient updates (OLMo and others exclude embeddings for this reason). Everything else — the
    projection matrices — gets decoupled weight decay."""
    return name.endswith("norm.weight") or name == "embed_tokens.weight"


def build_optimizer(model: Transformer, cfg: LoopConfig):
    """AdamW over the trainable parameters with every hyperparameter explicit from the config,
    running the model backend's contract-checked update (`model.ops`);
    returns (optimizer, parameter names in optimizer order)."""
    decay, no_decay, dn, nn_ = [], [], [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if is_no_decay(name) else decay).append(p)
        (nn_ if is_no_decay(name) else dn).append(name)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    opt = AdamW(groups, lr=cfg.lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.adam_eps,
                weight_decay=cfg.weight_decay, backend=model.ops.backend_of("adamw"),
                update=model.ops.adamw)
    return opt, dn + nn_


def clip_gradients(params: list[torch.Tensor], max_norm: float, ops) -> float:
    """Global-norm clip of the gradients in place, on every step (a safety clip behind
    an optional setting is a bug), by the backend's contract-checked clip (`ops.grad_clip`):
    coef = min(1, c / (‖g‖ + 1e-6)), as torch's clip_grad_norm_, with an overflow-safe norm.
    Returns the norm before clipping; a non-finite norm leaves the gradients untouched (the
    Andon check then stops the run)."""
    grads = [p.grad for p in params if p.grad is not None]
    return float(ops.grad_clip(grads, max_norm, CLIP_EPS, False))


def micro_batch_divisors(token_counts: list[int]) -> list[int]:
    """What each micro-batch's loss sum is divided by before backward: the token count of the
    whole step, so Σ_m s_m / N is the loss of one batch holding every micro-batch (every token
    weighs the same; not the mean of per-micro-batch means, which over-weighs the tokens of
    short micro-batches)."""
    total = sum(token_counts)
    return [total] * len(token_counts)


def restore_position(trainer: Trainer, sampler: data_mod.BatchSampler, state: dict) -> None:
    """After the weights, optimizer and RNG states are loaded: the step counter (which is also
    the LR schedule's position) and the data position, so a resumed run continues the same
    schedule on the same next batch instead of restarting warmup or replaying data."""
    trainer.step = int(state["step"])
    sampler.load_state_dict(state["data"])


# ------------------------------------------------------------------------------ evaluation
@contextlib.contextmanager
def eval_mode(module: torch.nn.Module):
    """Every submodule of `module` in eval mode (no dropout) for the duration, then each one
    put back in the mode it had: a model evaluated in the middle of training goes on training,
    one held in eval mode stays there."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training


def evaluate(trainer: Trainer, batches) -> tuple[float, float]:
    """(mean token CE, perplexity) over `batches` as inference computes it: eval mode (the
    loss must not depend on a dropout draw) and no autograd graph (nothing is trained, and a
    graph per batch holds every activation alive)."""
    with torch.no_grad(), eval_mode(trainer.forward_model):
        return mean_token_ce(trainer, batches)


def mean_token_ce(trainer: Trainer, batches) -> tuple[float, float]:
    """(Σ CE / Σ counted targets, exp of it) of the trainer's forward model over (inputs,
    targets) batches, in whatever mode and grad state the caller set."""
    total, n = 0.0, 0
    for x, y in batches:
        with trainer._autocast():
            logits = trainer.forward_model(x.to(trainer.device))
        s, c = loss_sum(logits, y.to(trainer.device), IGNORE_INDEX)
        total, n = total + float(s), n + c
    if n == 0:
        raise ValueError("evaluation got no tokens")
    loss = total / n
    return loss, math.exp(min(loss, 700.0))


@dataclass(frozen=True)
class LoopParts:
    """The loop's swappable pieces. falsify/contracts/train-loop-v1.yaml binds each one, and its
    mutants (falsify/mutants/train_loop.py) replace one at a time in the real loop; a run uses the
    defaults."""

    build_optimizer: Callable = build_optimizer
    clip_gradients: Callable = clip_gradients
    micro_batch_divisors: Callable = micro_batch_divisors
    sampler: Callable = data_mod.BatchSampler
    check_config_algebra: Callable = check_config_algebra
    restore_position: Callable = restore_position
    evaluate: Callable = evaluate


# ------------------------------------------------------------------------------- the step
@dataclass
class StepStats:
    step: int
    loss: float
    grad_norm: float  # global L2 norm before clipping
    lr: float
    tokens: int  # the step's normaliser: counted targets (pretraining, SFT) or pairs (DPO)
    params_finite: bool
    extra: dict = field(default_factory=dict)  # micro_loss stats summed over the step


class Trainer:
    """One optimizer step = grad_accum micro-batches, count-weighted, clipped, AdamW."""

    def __init__(self, model: Transformer, cfg: LoopConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None = None, parts: LoopParts | None = None):
        self.model, self.cfg, self.device = model, cfg, device
        self.ops = model.ops
        self.parts = parts or LoopParts()
        self.optimizer, self.param_names = self.parts.build_optimizer(model, cfg)
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.step = 0
        self.autocast_dtype = autocast_dtype
        # what evaluation and sampling call for logits (a data-parallel trainer's wrapper, so
        # FSDP gathers the sharded weights for them)
        self.forward_model = model

    def lr(self, step: int) -> float:
        """LR of the update with 0-based index `step`."""
        c = self.cfg
        return lr_at(step, c.lr, c.lr_min, c.warmup_steps, c.max_steps)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    # the hook: what one micro-batch contributes ------------------------------------------
    def count(self, micro) -> int:
        """The micro-batch's share of the step's normaliser: its non-ignored targets."""
        return int((micro[1] != IGNORE_INDEX).sum())

    def micro_loss(self, micro) -> tuple[torch.Tensor, dict]:
        """(Σ CE over the micro-batch's targets, stats) for a micro-batch (inputs, targets)."""
        x = micro[0].to(self.device, non_blocking=True)
        y = micro[1].to(self.device, non_blocking=True)
        if self.autocast_dtype is None:
            # fp32: LM head + CE fused over token chunks (Transformer.loss_sum), the same
            # Σ CE as the logits path below without building the [tokens, V] logits
            s, _ = self.model.loss_sum(x, y, IGNORE_INDEX)
        else:
            with self._autocast():
                logits = self.model(x)
            s, _ = loss_sum(logits, y, IGNORE_INDEX)
        return s, {}

    # one optimizer step -----------------------------------------------------------------
    def train_step(self, micro_batches: list) -> StepStats:
        """Loss = Σ_micro numerator / (the whole step's count): every token (pair) weighs the
        same whatever micro-batch it is in (not a mean of per-micro means). Raises AndonStop,
        without applying the update, on a non-finite loss or grad norm or one above its
        threshold; after the update, if any parameter is non-finite."""
        c = self.cfg
        lr = self.ops.lr_schedule(self.optimizer, self.step, c.warmup_steps, c.max_steps,
                                  c.lr, c.lr_min)
        loss, n, stats = self.forward_backward(micro_batches)
        return self.apply_update(loss, n, lr, stats)

    def forward_backward(self, micro_batches: list) -> tuple[float, int, dict]:
        """Accumulate the gradient of Σ_m s_m / d_m into .grad; returns (loss, count, summed
        stats)."""
        counts = [self.count(m) for m in micro_batches]
        n = sum(counts)
        if n == 0:
            raise ValueError(f"step {self.step + 1}: no trained target in any micro-batch "
                             "(every target is ignore_index); nothing to learn from")
        divisors = self.parts.micro_batch_divisors(counts)
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        total, stats = 0.0, {}
        for m, d in zip(micro_batches, divisors, strict=True):
            s, st = self.micro_loss(m)
            (s / d).backward()
            total += float(s.detach())
            for k, v in st.items():
                stats[k] = stats.get(k, 0) + v
        return total / n, n, stats

    def apply_update(self, loss: float, n: int, lr: float, stats: dict) -> StepStats:
        """Andon checks, clip, AdamW step, finiteness check: the tail of every step."""
        t, c = self.step + 1, self.cfg
        if not math.isfinite(loss):
            raise AndonStop(f"Andon: non-finite loss ({loss}) at step {t}", t)
        if c.andon_loss_max is not None and loss > c.andon_loss_max:
            raise AndonStop(f"Andon: loss {loss:.4f} > andon_loss_max={c.andon_loss_max} at "
                            f"step {t}", t)
        gn = self.parts.clip_gradients(self.params, c.grad_clip, self.ops)
        if not math.isfinite(gn):
            raise AndonStop(f"Andon: non-finite gradient norm ({gn}) at step {t}", t)
        if gn > c.andon_grad_norm:
            raise AndonStop(f"Andon: gradient norm {gn:.3g} > andon_grad_norm="
                            f"{c.andon_grad_norm} at step {t} (update not applied)", t)
        self.optimizer.step()
        self.step = t
        # One read-only pass: a sum is NaN/inf iff an element is (or the sum overflows,
        # |θ| ~ 1e38, which deserves a stop as much). isfinite().all() per tensor costs 25x more.
        finite = bool(torch.isfinite(torch.stack([p.detach().sum() for p in self.params])).all())
        if not finite:
            bad = [nm for nm, p in zip(self.param_names, self.params)
                   if not bool(torch.isfinite(p).all())]
            raise AndonStop(f"Andon: non-finite parameters after step {t}: {bad[:5]}", t)
        return StepStats(t, loss, gn, lr, n, finite, stats)

    def evaluate(self, batches) -> tuple[float, float]:
        """(mean token CE, perplexity = exp(mean CE)) over the given batches, in eval mode
        without autograd; every module's mode is restored afterwards."""
        return self.parts.evaluate(self, batches)
