"""The fine-tuning loop: a frozen base (fp32 or NF4) + trained LoRA adapters, on SFT,
reward-weighted SFT or DPO data, on the pretraining loop's core.

Shared with pretraining (imported, not copied): the config base with its parsing and value
rules (falsify/llm/config.py's `LoopConfig`, which falsify/llm/finetune_config.py's
`FinetuneConfig` extends), the optimizer step
(falsify/llm/trainer.py: warmup + cosine schedule, clip, AdamW over the requires_grad parameters —
i.e. the adapters —, Andon stops; the kernels come from the model's Ops bundle and are the ones
the adamw, grad-clip and lr-schedule contracts check), the config algebra
(falsify/llm/preflight.py), the setup (falsify/llm/run.py: threads, device, seeding) and the
run itself (falsify/llm/run_base.py: the step loop, cadences, stops, metrics, progress, summary;
`FinetuneRun` fills in its hooks); from falsify/llm/checkpoint.py the atomic checkpoints with
optimizer, RNG and data position. What is ours: the objectives (below) as the trainer's
micro-batch hook, the example sampler (falsify/llm/sft_data.py) and adapter export.

Objectives, all normalised per optimizer step (so grad_accum changes nothing but memory):

    SFT     L = Σ_i w_i · Σ_t m_it · CE_it / Σ_i Σ_t m_it
            m: response-only mask (every token with train_on_prompt); w_i = 1, or the sample's
            reward weight (clip to [−1, 1], min-max over the epoch). The denominator counts
            every masked token whatever its weight, so w ≡ 1 is exactly plain SFT and w_i = 0
            removes sample i's terms (llama.cpp scales the label, i.e. the same thing).
    DPO     L = mean over pairs of −log σ(β·[(log π(y_c|x) − log π_ref(y_c|x))
                                            − (log π(y_r|x) − log π_ref(y_r|x))])
            π_ref = the frozen base (adapters disabled); log π(y|x) sums the response tokens.
            With B = 0 the policy is the reference, so the first loss is exactly ln 2.

`FinetuneTrainer.micro_loss` is the one place the objective runs and `count` its normaliser;
the rest of the step is falsify/llm/trainer.Trainer's. GRPO (`method: grpo`, on code problems
with a reward) is falsify/llm/grpo.py: its config, run and trainer extend the ones here, so
`finetune()`, which picks the run for the config's method, and `load_config`, which picks the
config class, sit above both (falsify/llm/finetune_stage.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import typing
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import data as data_mod
from falsify.llm import distributed, gguf_io, hf
from falsify.llm import lora_model as LM
from falsify.llm import run as R
from falsify.llm import sft_data as SD
from falsify.llm.checkpoint_load import load_checkpoint
from falsify.llm.config import FinetuneConfigError, check_resume_config
from falsify.llm.finetune_base import (  # noqa: F401  (the API: FT.load_base, ...)
    AdapterView,
    Base,
    base_fingerprint,
    base_or_builtin,
    builtin_base,
    builtin_base_config,
    load_base,
)
from falsify.llm.finetune_config import (  # noqa: F401  (the API: FT.load_config, ...)
    METHODS,
    FinetuneConfig,
    config_from_dict,
    load_config,
    lora_spec,
    validate_config,
)
from falsify.llm.gguf_io import lora as gguf_lora
from falsify.llm.model import Transformer, generate
from falsify.llm.preflight import PreflightError, check_config, check_config_algebra
from falsify.llm.run_base import OneProcess, RunBase
from falsify.llm.trainer import StepStats, Trainer, eval_mode

log = logging.getLogger("falsify.finetune")


RESUME_MUTABLE = {"eval_interval", "early_stopping_patience", "log_interval", "save_every",
                  "keep_last", "out_dir", "progress", "threads", "cache_dir", "andon_grad_norm",
                  "andon_loss_max", "sample_tokens", "sample_count", "sample_temperature",
                  "sample_top_k"}
SHIPPED = str(SD.SHIPPED_DATASET)


# -------------------------------------------------------------------------- objectives
def sft_loss(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
             weights: torch.Tensor):
    """(Σ_i w_i Σ_t m_it CE_it, Σ_i Σ_t m_it) for logits [b, s, V], labels [b, s] (next-token
    ids, IGNORE_INDEX at padding), mask [b, s] (trained targets), weights [b]. CE in fp32;
    positions outside the mask contribute exactly 0 to the sum and its gradient."""
    b, s, v = logits.shape
    m = mask.bool() & (labels != SD.IGNORE_INDEX)
    tgt = labels.masked_fill(~m, 0).long()
    ce = F.cross_entropy(logits.reshape(-1, v).float(), tgt.reshape(-1), reduction="none")
    ce = torch.where(m.reshape(-1), ce, torch.zeros_like(ce)).view(b, s)
    per_sample = ce.sum(dim=1)
    return (per_sample * weights.to(per_sample.dtype)).sum(), m.sum()


def counted_logits(model: Transformer, b: SD.Batch):
    """(logits [b, s', V], labels [b, s'], mask [b, s']) at the positions whose targets count,
    left-aligned per sample (s' = the most any sample has; the rest is IGNORE_INDEX, mask 0).

    `sft_loss` of these equals `sft_loss(model(b.x), b.labels, b.mask, w)`: the positions left
    out contribute exactly 0 to every per-sample sum and its gradient, and each sample keeps
    its own row, so per-sample weights and counts are unchanged. The LM head and the
    cross-entropy (the [rows, V] GEMMs forward and backward, the log-softmax) then run on the
    counted rows only: a response-only SFT batch skips its prompt and padding rows (a third of
    the rows of `falsify bench finetune`'s batch)."""
    m = b.mask.bool() & (b.labels != SD.IGNORE_INDEX)
    n = m.sum(dim=1)
    s = int(n.max()) if m.numel() else 0
    # a stable sort on "not counted" puts each row's counted positions first, in order
    pos = torch.sort((~m).to(torch.uint8), dim=1, stable=True).indices[:, :s]
    keep = torch.arange(s, device=m.device) < n[:, None]
    h = model.hidden(b.x)
    h = h.gather(1, pos[..., None].expand(-1, -1, h.shape[-1]))
    labels = b.labels.gather(1, pos).masked_fill(~keep, SD.IGNORE_INDEX)
    return model.head(h), labels, keep


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor):
    """Σ_t m_it log p(labels_it) per sample ([b]): a response's log-likelihood."""
    b, s, v = logits.shape
    m = mask.bool() & (labels != SD.IGNORE_INDEX)
    logp = torch.log_softmax(logits.float(), dim=-1)
    tok = logp.gather(-1, labels.masked_fill(~m, 0).long().unsqueeze(-1)).squeeze(-1)
    return torch.where(m, tok, torch.zeros_like(tok)).sum(dim=1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
             ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float):
    """Per-pair DPO loss −log σ(β·Δ), Δ = (π_c − ref_c) − (π_r − ref_r), plus the implicit
    rewards β·(π − ref) of chosen and rejected (Rafailov et al. 2023, eq. 7)."""
    chosen = beta * (policy_chosen - ref_chosen)
    rejected = beta * (policy_rejected - ref_rejected)
    return -F.logsigmoid(chosen - rejected), chosen.detach(), rejected.detach()


@torch.no_grad()
def reference_logps(trainer, ch: SD.Batch, rj: SD.Batch):
    """log π_ref of each pair's chosen and rejected responses: the frozen base, every adapter
    off, in eval mode (no dropout: the reference is a fixed function). Once the adapters have
    moved, the policy with its adapters on is not the reference."""
    with eval_mode(trainer.model), LM.adapters_disabled(trainer.model):
        return trainer._policy_logps(ch, rj)


def evaluate_examples(trainer, batches: list) -> dict:
    """Validation as inference computes it: eval mode (the score must not depend on a
    lora_dropout draw), no autograd graph; every module's mode restored afterwards."""
    with torch.no_grad(), eval_mode(trainer.model):
        return score_examples(trainer, batches)


def score_examples(trainer, batches: list) -> dict:
    """Response-token mean CE (unweighted) and perplexity for SFT; mean DPO loss and
    preference accuracy for pairs; in whatever mode and grad state the caller set."""
    total, n, acc = 0.0, 0, 0.0
    for m in batches:
        if trainer.kind == "sft":
            b = m.to(trainer.device)
            with trainer._autocast():
                logits, labels, mask = counted_logits(trainer.model, b)
            s, c = sft_loss(logits, labels, mask, torch.ones_like(b.weights))
            total, n = total + float(s), n + int(c)
        else:
            s, st = trainer.micro_loss(m)
            total, n, acc = total + float(s), n + st["pairs"], acc + st["accuracy"]
    if n == 0:
        raise ValueError("validation got nothing to score")
    out = {"val_loss": total / n}
    if trainer.kind == "sft":
        out["val_ppl"] = math.exp(min(total / n, 700.0))
    else:
        out["val_accuracy"] = acc / n
    return out


@dataclass
class Objectives:
    """The swappable pieces (contract bindings; mutants replace one at a time)."""

    sft_loss: typing.Callable = sft_loss
    dpo_loss: typing.Callable = dpo_loss
    reward_weights: typing.Callable = SD.reward_weights
    lora_init: typing.Callable | None = None  # None: falsify/kernels/torch/lora.py's lora_init
    freeze_base: typing.Callable | None = None  # None: lora_model.freeze_base
    reference_logps: typing.Callable = reference_logps
    evaluate_examples: typing.Callable = evaluate_examples


# ------------------------------------------------------------------------------ trainer
class FinetuneTrainer(Trainer):
    """falsify/llm/trainer.Trainer (AdamW over the requires_grad parameters = the adapters,
    warmup + cosine, clipping, Andon) with a fine-tuning objective as its micro-batch hook."""

    def __init__(self, model: Transformer, cfg: FinetuneConfig, device, autocast_dtype,
                 kind: str, objectives: Objectives | None = None):
        super().__init__(model, cfg, device, autocast_dtype)
        if not self.params:
            raise FinetuneConfigError("no trainable parameter: every adapter is frozen")
        self.kind = kind  # "sft" | "preference"
        self.obj = objectives or Objectives()
        self.ref_cache: dict[int, tuple[float, float]] = {}

    # one micro-batch ------------------------------------------------------------------
    def micro_loss(self, micro) -> tuple[torch.Tensor, dict]:
        """(loss numerator, stats) of one micro-batch: an SFT Batch or a (chosen, rejected)
        pair of Batches."""
        if self.kind == "sft":
            b = micro.to(self.device)
            with self._autocast():
                logits, labels, mask = counted_logits(self.model, b)
            s, n = self.obj.sft_loss(logits, labels, mask, b.weights)
            return s, {"tokens": int(n)}
        ch, rj = (m.to(self.device) for m in micro)
        pc, pr = self._policy_logps(ch, rj)
        rc, rr = self.reference_logps(ch, rj)
        losses, cr, rr_ = self.obj.dpo_loss(pc, pr, rc, rr, self.cfg.dpo_beta)
        return losses.sum(), {"pairs": len(losses), "chosen_reward": float(cr.sum()),
                              "rejected_reward": float(rr_.sum()),
                              "accuracy": float((cr > rr_).float().sum()),
                              "chosen_logratio": float((pc - rc).detach().sum())}

    def _policy_logps(self, ch: SD.Batch, rj: SD.Batch):
        """One forward over chosen and rejected together (padded to the longer)."""
        s = max(ch.x.shape[1], rj.x.shape[1])
        x = torch.cat([_pad(ch.x, s, 0), _pad(rj.x, s, 0)])
        lab = torch.cat([_pad(ch.labels, s, SD.IGNORE_INDEX), _pad(rj.labels, s,
                                                                   SD.IGNORE_INDEX)])
        msk = torch.cat([_pad(ch.mask, s, False), _pad(rj.mask, s, False)])
        with self._autocast():
            logits = self.model(x)
        lp = sequence_logps(logits, lab, msk)
        return lp[: len(ch.x)], lp[len(ch.x):]

    @torch.no_grad()
    def reference_logps(self, ch: SD.Batch, rj: SD.Batch):
        """log π_ref of each pair's responses under the frozen base. The base never changes, so
        each example's value is computed once and cached (TRL's precompute_ref_log_probs)."""
        idx = [int(i) for i in ch.index]
        todo = [k for k, i in enumerate(idx) if i not in self.ref_cache]
        if todo:
            sub = torch.tensor(todo)
            c = SD.Batch(ch.x[sub], ch.labels[sub], ch.mask[sub], ch.weights[sub],
                         ch.index[sub])
            r = SD.Batch(rj.x[sub], rj.labels[sub], rj.mask[sub], rj.weights[sub],
                         rj.index[sub])
            pc, pr = self.obj.reference_logps(self, c, r)
            for j, k in enumerate(todo):
                self.ref_cache[idx[k]] = (float(pc[j]), float(pr[j]))
        rc = torch.tensor([self.ref_cache[i][0] for i in idx], device=self.device)
        rr = torch.tensor([self.ref_cache[i][1] for i in idx], device=self.device)
        return rc, rr

    def count(self, micro) -> int:
        """What one micro-batch adds to the step's normaliser: masked tokens (SFT) or pairs."""
        if isinstance(micro, SD.Batch):
            return micro.n_tokens
        return len(micro[0].x)

    def evaluate_examples(self, batches: list) -> dict:
        """Validation: response-token mean CE (unweighted) for SFT; mean DPO loss and
        preference accuracy for pairs; in eval mode without autograd."""
        return self.obj.evaluate_examples(self, batches)




class DataParallelFinetuneTrainer(distributed.DataParallelStep, FinetuneTrainer):
    """The fine-tuning step as one rank of a DDP job: the objective's micro_loss under DDP
    (distributed.ddp_over_objective), global counts, one gradient reduction per step. The
    replicas stay bit-identical, so rank 0's checkpoints are the one-process layout."""

    def __init__(self, model: Transformer, cfg: FinetuneConfig, device, autocast_dtype,
                 kind: str, objectives: Objectives | None, *, world: distributed.World,
                 dparts: distributed.DistParts):
        FinetuneTrainer.__init__(self, model, cfg, device, autocast_dtype, kind, objectives)
        self.world, self.dparts, self.parallel = world, dparts, "ddp"
        self.wrapped = distributed.ddp_over_objective(self)

    def parallel_loss(self, micro):
        return self.wrapped(micro)


def _pad(t: torch.Tensor, s: int, value) -> torch.Tensor:
    if t.shape[1] == s:
        return t
    return torch.cat([t, torch.full((t.shape[0], s - t.shape[1]), value, dtype=t.dtype,
                                    device=t.device)], dim=1)


# ------------------------------------------------------------------------------ batches
def make_micro(examples: list, idx, kind: str, pad_id: int, weights: np.ndarray | None,
               key_offset: int = 0):
    """Example indices -> an SFT Batch, or a (chosen, rejected) pair of Batches. Each batch
    carries index + key_offset per row: the key of the DPO reference cache, so the validation
    split (offset by the training split's size) never reads a training example's entry."""
    idx = [int(i) for i in idx]
    keys = [i + key_offset for i in idx]
    if kind == "sft":
        w = None if weights is None else weights[idx]
        return SD.collate([examples[i] for i in idx], pad_id, w, keys)
    return (SD.collate([examples[i].chosen for i in idx], pad_id, None, keys),
            SD.collate([examples[i].rejected for i in idx], pad_id, None, keys))


def val_batches(examples: list, kind: str, pad_id: int, batch_size: int,
                key_offset: int) -> list:
    return [make_micro(examples, range(a, min(a + batch_size, len(examples))), kind, pad_id,
                       None, key_offset) for a in range(0, len(examples), batch_size)]


# ------------------------------------------------------------------------------ the run
@dataclass
class FinetuneResult:
    out_dir: str
    kind: str = "sft"
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    final_step: int = 0
    max_steps: int = 0
    stopped: str = ""
    elapsed_s: float = 0.0
    tokens: int = 0
    tokens_per_s: float = 0.0
    adapter_dir: str | None = None
    adapter_gguf: str | None = None  # the same adapter for llama.cpp (None: masked, no gguf)
    checkpoint: str | None = None
    resumed_from: str | None = None
    data_info: dict = field(default_factory=dict)
    base_info: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # GRPO: mean reward per batch
    model: Transformer | None = field(default=None, repr=False)


def resolve_steps(cfg: FinetuneConfig, n_train: int) -> FinetuneConfig:
    """Concrete max_steps / warmup_steps (recorded in the effective config), checked by the
    pretraining loop's config algebra: max_steps must be reachable with the configured epochs."""
    spe = n_train // (cfg.batch_size * cfg.grad_accum)
    if spe < 1:
        raise PreflightError(f"{n_train} training examples < batch_size {cfg.batch_size} x "
                             f"grad_accum {cfg.grad_accum}: not one optimizer step")
    max_steps = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * spe
    warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max_steps // 20
    check_config_algebra(n_train, cfg.batch_size, cfg.grad_accum, cfg.epochs, max_steps, warmup)
    return replace(cfg, max_steps=max_steps, warmup_steps=warmup)


def run_dir(cfg: FinetuneConfig, resume=None) -> Path:
    """The directory a fine-tuning run writes: `out_dir` when set; on a resume, the resumed
    run's (with "auto", the newest fine-tuning run under runs/); else a new
    runs/<method>-<UTC time>, named as `falsify train` names its runs, so that a second
    `falsify finetune` never meets the first one's checkpoints."""
    if cfg.out_dir is not None:
        return Path(cfg.out_dir)
    if resume is not None:
        return R.resume_run_dir(resume, None, kind=R.FINETUNING)
    return R.new_run_dir(cfg.method)


class FinetuneRun(RunBase):
    """One fine-tuning run's state, built in stages (open -> load -> build -> loop); the loop,
    cadences and files are RunBase's (falsify/llm/run_base.py). What is ours: the base and
    adapters, the example data, epoch-end evaluation with early stopping, the adapter export."""

    progress_log = log

    def __init__(self, cfg: FinetuneConfig, obj: Objectives, parallel: OneProcess | None = None):
        super().__init__(parallel)
        check_config(cfg)  # before any base or data work
        self.cfg, self.obj = cfg, obj
        self.device, self.autocast = R.resolve_device(cfg)
        self.out: Path | None = None  # open(): the run directory
        self.bad_evals = 0
        self.console = None
        self.val_batches: list = []
        self.device = self.parallel.attach(self.device)  # a rank: its GPU, the group joined

    @property
    def max_steps(self) -> int:
        return self.rcfg.max_steps  # resolved from the data (resolve_steps)

    def open(self, resume) -> None:
        self.out = self.parallel.agree(lambda: run_dir(self.cfg, resume))
        self.lock_run(self.out)  # one writer per run directory, before its checkpoints are read
        if resume is not None:
            self.ckpt_path = ckpt_mod.find_checkpoint(self.out if str(resume) == "auto"
                                                      else resume)
            config = ckpt_mod.read_state(self.ckpt_path)["config"]
            check_resume_config(config["finetune_requested"], self.cfg, self.ckpt_path,
                                RESUME_MUTABLE)
            was = int(config.get("world_size", 1))
            if was != self.world_size:
                # the data position counts global batches of batch_size × processes
                raise FinetuneConfigError(
                    f"checkpoint {self.ckpt_path} was written by {was} process(es); this run "
                    f"has {self.world_size}: resume a fine-tuning run on as many processes")
        elif ckpt_mod.list_checkpoints(self.out):
            raise FinetuneConfigError(f"out_dir={str(self.out)!r} already holds checkpoints; "
                                      "pass --resume to continue that run or choose another "
                                      "out_dir")
        R.seed_everything(self.cfg.seed)

    def load(self, base: Base | None, dataset: SD.Dataset | None, console) -> None:
        """The base model and the examples: split, reward weights, steps, sampler; the sampler
        and the step count run on the global batch (a data-parallel run's batch_size × W)."""
        local, self.cfg = self.cfg, self.parallel.global_batch(self.cfg)
        try:
            self.load_data(base, dataset, console)
        finally:
            self.cfg = local

    def load_data(self, base: Base | None, dataset: SD.Dataset | None, console) -> None:
        cfg = self.cfg
        self.console = console
        if base is None and cfg.keep_masks and not cfg.model:
            # before the built-in base is trained: it is never pruned
            raise FinetuneConfigError("config field keep_masks=true needs a pruned base: set "
                                      "model to a `falsify prune` output (the built-in base "
                                      "carries no masks)")
        if base is None:
            base = load_base(cfg.model, cfg.backend) if cfg.model else builtin_base(cfg, console)
        self.base, model = base, base.model
        self.seq_len = cfg.seq_len or model.cfg.max_seq_len
        if self.seq_len > model.cfg.max_seq_len:
            raise FinetuneConfigError(f"config field seq_len={self.seq_len}: the base's "
                                      f"max_seq_len is {model.cfg.max_seq_len}")
        if dataset is None:
            if base.tokenizer is None:
                raise FinetuneConfigError(f"base {base.source} has no tokenizer: cannot read "
                                          "text data")
            dataset = SD.load_dataset(cfg.data or [SHIPPED], base.tokenizer, self.seq_len,
                                      cfg.train_on_prompt, cfg.overlong)
        self.dataset = dataset
        self.examples = (dataset.examples[: cfg.max_examples] if cfg.max_examples
                         else dataset.examples)
        self.train_ex, self.val_ex = SD.split_examples(self.examples, cfg.val_split, cfg.seed)
        self.weights = None
        if dataset.reward_weighted:
            rw = self.obj.reward_weights(torch.tensor([e.reward for e in self.train_ex],
                                                      dtype=torch.float64))
            self.weights = rw.numpy().astype(np.float32)
        self.rcfg = resolve_steps(cfg, len(self.train_ex))
        lengths = [len(e.ids) if hasattr(e, "ids") else len(e.chosen.ids) for e in self.examples]
        data_key = hashlib.sha256(json.dumps([dataset.files, len(self.examples), lengths])
                                  .encode()).hexdigest()[:16]
        self.sampler = SD.ExampleSampler(len(self.train_ex), cfg.batch_size, cfg.grad_accum,
                                         cfg.epochs, cfg.seed, cfg.shuffle, data_key)
        self.pad_id = data_mod.SPECIAL_TOKENS.index(data_mod.EOS)

    def data_info(self) -> dict:
        ds, train_ex = self.dataset, self.train_ex
        info = {"files": ds.files, "formats": ds.formats, "kind": ds.kind,
                "reward_weighted": ds.reward_weighted, **ds.stats,
                "used": len(self.examples), "train": len(train_ex), "val": len(self.val_ex),
                "steps_per_epoch": self.sampler.steps_per_epoch, "seq_len": self.seq_len,
                "trained_tokens_per_epoch": (sum(sum(e.mask[1:]) for e in train_ex)
                                             if ds.kind == "sft" else None)}
        w = self.weights
        if w is not None:
            info["reward_weights"] = {"min": float(w.min()), "max": float(w.max()),
                                      "mean": float(w.mean()), "zero": int((w == 0).sum())}
        return info

    def build(self) -> None:
        """Adapters on the base, the trainer, the effective config on disk, resumed state."""
        cfg, base, model = self.cfg, self.base, self.base.model
        self.fingerprint = base_fingerprint(model)
        spec = lora_spec(cfg)
        if cfg.keep_masks and base.masks is None:
            raise FinetuneConfigError(
                f"config field keep_masks=true: base {base.source} carries no pruning masks "
                f"(no {LM.MASKS_FILE} next to its weights; `falsify prune` writes one)")
        LM.apply_lora(model, spec, init=self.obj.lora_init, freeze=self.obj.freeze_base)
        masks_info = None
        if cfg.keep_masks:
            LM.attach_masks(model, base.masks, base.masks_path or base.source)
            masks_info = {"path": base.masks_path, "sha256": LM.masks_digest(base.masks)}
        elif base.masks is not None:
            log.warning("base %s carries pruning masks but keep_masks=false: the adapter's "
                        "delta is dense and a merge refills the pruned weights", base.source)
        model.activation_checkpointing = cfg.activation_checkpointing
        model.to(self.device)
        self.model = model
        self.trainer = self.parallel.trainer(self)
        mem = LM.memory_bytes(model)
        data_info = self.data_info()
        base_info = {"source": base.source, "layout": base.layout,
                     "fingerprint": self.fingerprint, "model": model.cfg.to_dict(), **base.info}
        self.effective = {
            "finetune_requested": asdict(cfg), "finetune": asdict(self.rcfg),
            "lora": {**asdict(spec), "targets": list(spec.targets), "scale": spec.scale},
            "model": model.cfg.to_dict(), "base": base_info, "data": data_info,
            "trainable_params": sum(p.numel() for p in self.trainer.params), "memory": mem,
            "masks": masks_info, "world_size": self.world_size,
            "device": str(self.device), **R.kernel_record(model)}
        self.out.mkdir(parents=True, exist_ok=True)
        self.write_config(self.effective)
        self.result = FinetuneResult(out_dir=str(self.out), kind=self.dataset.kind,
                                     max_steps=self.rcfg.max_steps, data_info=data_info,
                                     base_info=base_info, memory=mem)
        self.metrics_path = self.out / "metrics.jsonl"
        self.view = AdapterView(model)
        if self.ckpt_path is not None:
            self.restore()

    def make_trainer(self) -> FinetuneTrainer:
        return FinetuneTrainer(self.model, self.rcfg, self.device, self.autocast,
                               self.dataset.kind, self.obj)

    def make_parallel_trainer(self, world, dparts) -> FinetuneTrainer:
        """DDP over the adapters (not FSDP: they are a small share of the model, over a frozen
        base every rank loads whole)."""
        return DataParallelFinetuneTrainer(self.model, self.rcfg, self.device, self.autocast,
                                           self.dataset.kind, self.obj, world=world,
                                           dparts=dparts)

    def next_micro(self) -> list:
        """The step's micro-batches (a data-parallel rank builds its shard of them)."""
        return [make_micro(self.train_ex, self.parallel.local_rows(idx, self.cfg.batch_size),
                           self.dataset.kind, self.pad_id, self.weights)
                for idx in self.sampler.next_step()]

    def restore(self) -> None:
        state = ckpt_mod.read_state(self.ckpt_path)
        if state["config"]["base"]["fingerprint"] != self.fingerprint:
            raise ckpt_mod.CheckpointError(f"{self.ckpt_path} was trained on another base (its "
                                           "fingerprint differs from this base's)")
        tr = self.trainer
        state = load_checkpoint(self.ckpt_path, self.view, tr.optimizer,
                                         tr.param_names)
        tr.step = int(state["step"])
        self.sampler.load_state_dict(state["data"])
        self.best_val, self.bad_evals = state.get("best_val_loss"), int(state.get("bad_evals", 0))
        self.resumed(state)

    def checkpoint_module(self):
        return self.view  # the adapters: the frozen base is the base's, fingerprinted

    def checkpoint_config(self) -> dict:
        return self.effective

    def checkpoint_extra(self) -> dict:
        return {"best_val_loss": self.best_val, "bad_evals": self.bad_evals}

    def before_loop(self) -> None:
        kind = self.dataset.kind
        self.val_batches = (val_batches(self.val_ex, kind, self.pad_id, self.cfg.batch_size,
                                        len(self.train_ex)) if self.val_ex else [])
        if self.val_batches and self.ckpt_path is None:
            # step 0: the frozen base itself (B = 0), the baseline every later evaluation is
            # compared with (and the first "best" for early stopping)
            self.best_val = None
            self.evaluate(0)

    def eval_due(self, step: int, last: bool) -> bool:
        epoch_end = self.sampler.step_in_epoch == 0
        due = epoch_end if self.cfg.eval_interval is None else step % self.cfg.eval_interval == 0
        return bool(self.val_batches) and (due or last)

    def save_due(self, step: int) -> bool:
        return bool(self.cfg.save_every) and step % self.cfg.save_every == 0

    def early_stop(self) -> str | None:
        patience = self.cfg.early_stopping_patience
        if patience is None or self.bad_evals < patience:
            return None
        return (f"early stopping: {self.bad_evals} evaluation(s) without a new best val_loss "
                f"({self.best_val:.4f})")

    def evaluate(self, step: int) -> dict:
        ev = self.trainer.evaluate_examples(self.val_batches)
        improved = self.best_val is None or ev["val_loss"] < self.best_val
        self.best_val = ev["val_loss"] if improved else self.best_val
        self.bad_evals = 0 if improved else self.bad_evals + 1
        self.result.evals.append({"step": step, **ev})
        self.mf.write(json.dumps({"step": step, **ev}) + "\n")
        return ev

    def micro_tokens(self, st: StepStats, micro: list) -> int:
        """Every position of the step's batches, padding included (tokens/s of the work)."""
        return sum(int((m.mask if isinstance(m, SD.Batch) else m[0].mask).numel())
                   for m in micro)

    def record(self, st: StepStats, step_s: float, fetch_s: float, tps: float) -> None:
        r = self.result
        r.steps.append(st.step)
        r.losses.append(st.loss)
        r.grad_norms.append(st.grad_norm)
        r.lrs.append(st.lr)
        rec = {"step": st.step, "loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm,
               "count": st.tokens, "step_s": step_s, "tok_s": tps, "epoch": self.sampler.epoch}
        if self.dataset.kind == "preference":
            p = st.extra["pairs"]
            rec.update({k: st.extra[k] / p for k in ("chosen_reward", "rejected_reward",
                                                    "accuracy", "chosen_logratio")})
        self.mf.write(json.dumps(rec) + "\n")

    def finish(self) -> None:
        """A completed (or early-stopped) run: the adapter export, samples, summary.json."""
        cfg, base, result, model = self.cfg, self.base, self.result, self.model
        result.stopped = result.stopped or "max_steps"
        if not self.writes:
            return
        meta = {"base_fingerprint": self.fingerprint, "base_layout": base.layout,
                "base_path": base.path, "step": self.trainer.step,
                "train_on_prompt": cfg.train_on_prompt}
        result.adapter_dir, result.adapter_gguf = export_adapter(model, base, self.out, meta,
                                                                self.console)
        if base.tokenizer is not None and cfg.sample_count and cfg.sample_tokens:
            result.samples = compare_samples(model, base.tokenizer, (self.val_ex or self.train_ex)
                                             [: cfg.sample_count], cfg.sample_tokens,
                                             self.device, cfg.sample_temperature,
                                             cfg.sample_top_k, cfg.seed)
        self.write_run_summary()


# ------------------------------------------------------------------------ adapter export
def export_adapter(model: Transformer, base: Base, out: Path, meta: dict,
                   console) -> tuple[str, str | None]:
    """A finished run's OUT/adapter, and OUT/adapter.gguf where llama.cpp can apply it:
    (adapter directory, GGUF adapter or None)."""
    if LM.model_masks(model) is not None:
        # not PEFT (lora_model.export_peft says why): our masked adapter layout, which
        # `falsify merge --adapter` turns into an exact merged model
        return str(LM.export_masked(model, out / "adapter", base.tokenizer_path,
                                    meta=meta)), None
    adapter = LM.export_peft(model, out / "adapter", hf_base(model, base, out),
                             base.tokenizer_path, meta=meta)
    return str(adapter), gguf_adapter(model, out, console)


def hf_base(model: Transformer, base: Base, out: Path) -> str:
    """The adapter's base_model_name_or_path: an HF-layout directory with the weights the
    adapter was trained against, so `AutoPeftModelForCausalLM.from_pretrained(adapter)`
    computes what we do. A LoRA run on an HF base names that base; otherwise (our
    checkpoint, the built-in base, or QLoRA, whose base is the NF4 dequantization) the
    run writes OUT/base-hf. An absolute path: PEFT resolves it from the loader's working
    directory, not the adapter's."""
    if base.layout == "hf" and model.lora_spec.method == "lora" and base.path:
        return base.path
    return str(hf.export_hf(LM.base_as_trained(model), out / "base-hf",
                            base.tokenizer_path).resolve())


def gguf_adapter(model: Transformer, out: Path, console) -> str | None:
    """OUT/adapter.gguf, the adapter as llama.cpp applies it (`--lora`) on the base it was
    trained against: the GGUF base itself, or the GGUF export of OUT/base-hf (for QLoRA
    the NF4 dequantization). Needs the `gguf` package (the interop extra); without it the
    run says so and writes the PEFT adapter only."""
    try:
        return str(gguf_lora.write_lora_gguf(model, out / gguf_lora.ADAPTER_FILE))
    except gguf_io.GGUFError as e:
        if console is not None:
            console.print(f"note: no {gguf_lora.ADAPTER_FILE}: {e}")
        return None


def prompt_ids(e) -> list[int]:
    """The untrained prefix of an example: what the model is given at generation time."""
    e = e.chosen if isinstance(e, SD.PreferenceExample) else e
    first = next((i for i, m in enumerate(e.mask) if m), len(e.ids))
    return e.ids[:max(1, first)]


@torch.no_grad()
def compare_samples(model: Transformer, tok, examples: list, max_new: int, device,
                    temperature: float = 0.0, top_k: int | None = None,
                    seed: int = 0) -> list[dict]:
    """Continuations of held-out prompts from the frozen base and from base+adapter, each with
    a generator seeded alike (so at temperature 0 both are greedy and comparable)."""
    eos = tok.token_to_id(data_mod.EOS)
    out = []
    for i, e in enumerate(examples):
        ids = torch.tensor([prompt_ids(e)], device=device)
        room = model.cfg.max_seq_len - ids.shape[1]
        n = min(max_new, max(0, room))

        def gen(ids=ids, n=n, i=i):
            g = torch.Generator(device=device).manual_seed(seed + i)
            return generate(model, ids, n, temperature, top_k, g,
                            stop_id=eos)[0, ids.shape[1]:].tolist()

        with LM.adapters_disabled(model):
            b = gen()
        a = gen()
        ref = e.chosen if isinstance(e, SD.PreferenceExample) else e
        first = len(prompt_ids(e))
        out.append({"prompt": data_mod.decode(tok, ids[0].tolist()[1:]),
                    "reference": data_mod.decode(tok, [t for t in ref.ids[first:]
                                                       if t != eos]),
                    "base": data_mod.decode(tok, [t for t in b if t != eos]),
                    "adapted": data_mod.decode(tok, [t for t in a if t != eos])})
    return out
