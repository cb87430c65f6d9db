"""Knowledge distillation: a frozen teacher trains a smaller student on the same tokenizer with

    L = α·T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)) + (1 − α)·CE(y, z_s)       (Hinton et al. 2015)

per token, averaged over the step's counted targets exactly as pretraining averages its CE. The
run is the pretraining run (falsify/llm/run.py: data, preflight, schedule, AdamW, clipping, Andon
stops, checkpoints, resume) with one different step: the student's loss goes through the fused
linear-KD kernel (falsify/kernels/<backend>/fused_linear_kd.py, fused-linear-kd-kernel-v1), so the
student's [tokens, V] logits are never built.

The teacher is one of our checkpoints, an HF-layout causal LM directory (any architecture
transformers loads) or, by default, the built-in base of `falsify finetune` trained on the
student's corpus (cached per corpus), so that the two share one tokenizer. Its signal is
either its full logits, computed on the fly, or its top-k (values, indices) per token, computed
on the fly or read from a cache of safetensors shards written once before training
(`teacher_cache`). The top-k form renormalises the teacher over its k largest logits; the
kernel contract bounds that error against the full logits.

What the loop contract (falsify/contracts/distill-v1.yaml) holds it to: the teacher is frozen (eval
mode, no gradient, bit-identical weights after training: checked again at the end of every
run), α = 0 is plain pretraining step for step, and a teacher whose vocabulary or tokenizer
differs from the student's is refused before step 1.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from safetensors.torch import load_file

from falsify.harness.files import atomic_write
from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import data as data_mod
from falsify.llm import finetune_base as FB
from falsify.llm import run as R
from falsify.llm.checkpoint import save_file
from falsify.llm.config import DATA_FIELDS, ConfigError, TrainConfig
from falsify.llm.run_base import OneProcess, drive
from falsify.llm.trainer import IGNORE_INDEX, LoopParts, Trainer

log = logging.getLogger("falsify.distill")

KD_MODULE = "fused_linear_kd"  # falsify.kernels.<backend>.fused_linear_kd
CACHE_FORMAT = "falsify-teacher-topk-v1"


class DistillConfigError(ConfigError):
    """A bad distillation config field or teacher; the message names it."""


# ------------------------------------------------------------------------------- config
@dataclass
class DistillConfig(TrainConfig):
    """TrainConfig (the student and its data) plus the teacher and the KD loss. Defaults: the
    usual KD recipe (T = 4, α = 0.5, [hinton2015]), a student half the tiny preset's width and
    depth, on `falsify train`'s default data (TrainConfig's data fields, not restated here), so
    that the student of a default pretraining run's teacher shares its tokenizer. The built-in
    teacher is trained on the student's corpus (load_teacher), so it shares it too."""

    error: ClassVar[type[ConfigError]] = DistillConfigError

    teacher: str | None = None  # our checkpoint / run dir or an HF causal-LM dir; null: built-in
    alpha: float = 0.5  # weight of the soft (KD) term; 1 − α weighs the hard-label CE
    temperature: float = 4.0
    teacher_topk: int | None = None  # null: full teacher logits; k: the teacher's top-k
    teacher_cache: str | None = None  # top-k shards directory: read if it matches, else written
    kd_chunk: int | None = None  # tokens per chunk of the fused linear-KD kernel (null: its own)
    # the student: architecture overrides of the `tiny` preset (its data: TrainConfig's)
    hidden_size: int | None = 64
    num_layers: int | None = 2
    intermediate_size: int | None = 192
    max_steps: int = 300
    warmup_steps: int = 15
    batch_size: int = 8
    eval_interval: int = 300
    eval_batches: int = 8
    save_interval: int = 300
    sample_tokens: int = 0

    rules: ClassVar[dict] = {
        **TrainConfig.rules,
        "alpha": (lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
        "temperature": (lambda v: v > 0, "must be > 0"),
        "teacher_topk": (lambda v: v >= 1, "must be >= 1"),
        "kd_chunk": (lambda v: v >= 1, "must be >= 1"),
    }

    def extra_rules(self):
        yield from super().extra_rules()
        yield (self.teacher_cache is None or self.teacher_topk is not None, "teacher_cache",
               "a teacher cache stores the top-k; set teacher_topk as well")
        # the KD loss kernel (fused-linear-kd) is outside the model's dispatcher: its backend
        # is the model's, named
        yield (self.backend in ("torch", "triton", "auto"), "backend",
               "distillation takes torch, triton or auto (its KD kernel has no dispatch policy)")


def load_config(path=None, overrides=()) -> DistillConfig:
    return DistillConfig.load(path, overrides)


# ------------------------------------------------------------------------------ teacher
@dataclass
class Teacher:
    """A frozen teacher: `logits(ids)` -> fp32 [B, S, V], no graph."""

    module: torch.nn.Module
    vocab_size: int
    source: str
    tokenizer_path: str | None
    hf: bool  # a transformers model (else our Transformer)
    fingerprint: str = ""
    info: dict = field(default_factory=dict)

    @torch.no_grad()
    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.module(input_ids=ids).logits if self.hf else self.module(ids)
        return out.float()


def weights_fingerprint(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer (names, shapes, dtypes, bytes)."""
    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(f"{k}{tuple(v.shape)}{v.dtype}".encode())
        h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def freeze(module: torch.nn.Module) -> None:
    """Eval mode (no dropout; the teacher's distribution is its inference distribution) and no
    gradient for any parameter. A LoopParts-style seam: the loop contract's mutant replaces it."""
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)


def teacher_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What the teacher reads: the student's inputs, so teacher position t predicts the same
    target y_t as student position t."""
    return x


def micro_numerator(loss_mean: torch.Tensor, n: int) -> torch.Tensor:
    """The micro-batch's loss numerator: its mean over n counted targets times n, so that the
    step divides the sum over every micro-batch by the step's count, as pretraining does."""
    return loss_mean * n


def load_teacher(path: str | None, backend: str, console=None, data: dict | None = None
                 ) -> Teacher:
    """Our checkpoint or HF LLaMA dir (falsify/llm/finetune_base.py:load_base: our kernels), any
    other HF-layout causal LM (transformers' AutoModelForCausalLM, fp32), or the built-in base,
    trained on `data` (the student's config.DATA_FIELDS) so that it shares the student's
    tokenizer by construction (cached per corpus, as `falsify finetune`'s is)."""
    if path is not None:
        p = Path(path)
        cfg_file = p / "config.json"
        if cfg_file.is_file() and not (p / "checkpoints").exists() and \
                json.loads(cfg_file.read_text()).get("model_type") not in (None, "llama"):
            return _hf_teacher(p)
    try:
        if path is None:
            base = FB.base_or_builtin(None, backend, console, data)
        else:
            # a teacher trained on synthetic ids has no tokenizer; whether one is needed is
            # check_teacher's business, once the student's data is known
            base = FB.load_base(path, backend, need_tokenizer=False)
    except ConfigError as e:
        raise DistillConfigError(f"config field teacher={path!r}: {e}") from None
    return Teacher(base.model, base.model.cfg.vocab_size, base.source, base.tokenizer_path,
                   hf=False, info={"layout": base.layout})


def _hf_teacher(p: Path) -> Teacher:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - reported with the path
        raise DistillConfigError(f"config field teacher={str(p)!r}: transformers cannot load it "
                                 f"as a causal LM ({type(e).__name__}: {e})") from None
    tok = p / "tokenizer.json"
    return Teacher(model, int(model.config.vocab_size), str(p),
                   str(tok) if tok.is_file() else None, hf=True,
                   info={"layout": "hf", "model_type": model.config.model_type})


def tokenizer_identity(tok) -> dict:
    """What makes two byte-level BPEs encode alike: vocabulary, merges, added tokens,
    pre-tokenizer and normalizer."""
    js = json.loads(tok.to_str())
    return {k: js.get(k) for k in ("model", "added_tokens", "pre_tokenizer", "normalizer")}


def check_teacher(teacher: Teacher, student_vocab: int, data: data_mod.PreparedData) -> None:
    """Before step 1: one vocabulary, one tokenizer. A teacher over another vocabulary
    distributes its probability over other tokens; a KL between them compares unrelated
    indices and trains the student on noise."""
    if teacher.vocab_size != student_vocab:
        raise DistillConfigError(
            f"teacher {teacher.source}: vocabulary size {teacher.vocab_size} != the student's "
            f"vocab_size {student_vocab}; distillation compares distributions over one "
            "vocabulary")
    if data.tokenizer is None:
        return  # synthetic token data: no tokenizer on either side, ids are the vocabulary
    if teacher.tokenizer_path is None:
        raise DistillConfigError(f"teacher {teacher.source}: no tokenizer.json next to it, so "
                                 "it cannot be shown to share the student's tokenizer")
    theirs = tokenizer_identity(data_mod.load_tokenizer(teacher.tokenizer_path))
    if theirs != tokenizer_identity(data.tokenizer):
        raise DistillConfigError(
            f"teacher {teacher.source}: its tokenizer ({teacher.tokenizer_path}) differs from "
            f"the student's ({data.cache_path / 'tokenizer.json'}); the same ids would mean "
            "different text. Train the student on the teacher's corpus and vocab_size, or give "
            "a teacher trained with this tokenizer")


# -------------------------------------------------------------------------- top-k cache
def topk_stable(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest logits per row, ties to the lower index (a stable descending sort), as
    kd-loss-kernel-v1's top-k variant selects them: the cache and the on-the-fly path agree."""
    vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
    return vals[..., :k].contiguous(), idx[..., :k].contiguous()


def blocks_visited(sampler_args: dict, steps: int) -> np.ndarray:
    """The training blocks of the first `steps` steps, in the order the seeded sampler
    draws them (a fresh sampler with the run's arguments)."""
    s = data_mod.BatchSampler(**sampler_args)
    seen: list[np.ndarray] = []
    for _ in range(min(steps, s.total_steps)):
        s.next_step()
        seen.extend(s.last_blocks)
    return np.unique(np.concatenate(seen)) if seen else np.zeros(0, np.int64)


class TopkCache:
    """Precomputed teacher top-k per training block: `shard-NNNNN.safetensors` files holding
    `blocks` int64 [n], `values` fp32 [n, S, k] and `indices` int32 [n, S, k], and a
    `manifest.json` naming the teacher's weight fingerprint, the data key, seq_len and k (a
    cache written for anything else is refused, never silently reused) with every shard's
    sha256. Written into a temporary directory and renamed into place."""

    SHARD_BLOCKS = 256

    def __init__(self, rows: dict[int, int], values: torch.Tensor, indices: torch.Tensor):
        self.rows, self.values, self.indices = rows, values, indices

    @staticmethod
    def identity(teacher: Teacher, data_key: str, seq_len: int, k: int) -> dict:
        return {"format": CACHE_FORMAT, "teacher": teacher.fingerprint, "data_key": data_key,
                "seq_len": seq_len, "k": k}

    @classmethod
    def build(cls, out: Path, teacher: Teacher, stream: np.ndarray, blocks: np.ndarray,
              seq_len: int, k: int, ident: dict, batch: int = 16) -> Path:
        device = next(teacher.module.parameters()).device

        def fill(tmp: Path):
            shards = []
            for a in range(0, len(blocks), cls.SHARD_BLOCKS):
                part = blocks[a:a + cls.SHARD_BLOCKS]
                vals, idx = [], []
                for b in range(0, len(part), batch):
                    ids = torch.from_numpy(np.stack(
                        [data_mod.block(stream, int(i), seq_len)[0] for i in part[b:b + batch]]
                    ).astype(np.int64)).to(device)
                    v, i = topk_stable(teacher.logits(ids), k)
                    vals.append(v.cpu())
                    idx.append(i.to(torch.int32).cpu())
                name = f"shard-{len(shards):05d}.safetensors"
                save_file({"blocks": torch.from_numpy(part.astype(np.int64)),
                           "values": torch.cat(vals), "indices": torch.cat(idx)},
                          str(tmp / name))
                shards.append({"file": name, "sha256": ckpt_mod._sha256(tmp / name),
                               "blocks": len(part)})
            (tmp / "manifest.json").write_text(json.dumps({**ident, "shards": shards},
                                                          indent=1))

        return ckpt_mod.atomic_dir(out, fill)

    @classmethod
    def load(cls, path: Path, ident: dict) -> TopkCache:
        man_path = path / "manifest.json"
        try:
            man = json.loads(man_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DistillConfigError(f"teacher cache {man_path}: unreadable ({e})") from None
        for key, want in ident.items():
            if man.get(key) != want:
                raise DistillConfigError(
                    f"teacher cache {path}: {key} is {man.get(key)!r}, this run needs {want!r}; "
                    "it was written for another teacher, corpus or k. Remove it or name another "
                    "teacher_cache")
        blocks, values, indices = [], [], []
        for sh in man["shards"]:
            f = path / sh["file"]
            if ckpt_mod._sha256(f) != sh["sha256"]:
                raise DistillConfigError(f"teacher cache {f}: sha256 differs from the manifest "
                                         "(damaged or edited)")
            t = load_file(str(f))
            blocks.append(t["blocks"])
            values.append(t["values"])
            indices.append(t["indices"])
        b = torch.cat(blocks)
        return cls({int(x): r for r, x in enumerate(b.tolist())}, torch.cat(values),
                   torch.cat(indices))

    def lookup(self, blocks: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            rows = torch.tensor([self.rows[int(b)] for b in blocks])
        except KeyError as e:
            raise DistillConfigError(f"teacher cache: block {e.args[0]} is not cached (the "
                                     "cache covers the blocks of max_steps steps)") from None
        return self.values[rows].to(device), self.indices[rows].long().to(device)


# ------------------------------------------------------------------------------ the step
@dataclass(frozen=True)
class DistillParts:
    """The distillation loop's swappable pieces (falsify/contracts/distill-v1.yaml's mutants replace
    one at a time)."""

    freeze: Callable = freeze
    teacher_input: Callable = teacher_input
    micro_numerator: Callable = micro_numerator
    check_teacher: Callable = check_teacher


def kd_kernel(backend: str, name: str) -> Callable:
    mod = importlib.import_module(f"falsify.kernels.{backend}.{KD_MODULE}")
    return getattr(mod, name)


class DistillTrainer(Trainer):
    """The pretraining step with the KD loss: Σ over the micro-batch's counted targets of
    α·T²·KL + (1 − α)·CE, divided by the step's count like pretraining's Σ CE."""

    def __init__(self, *a, teacher: Teacher, cfg_kd: DistillConfig,
                 cache: TopkCache | None, dparts: DistillParts, **kw):
        super().__init__(*a, **kw)
        self.teacher, self.kd, self.cache, self.dparts = teacher, cfg_kd, cache, dparts
        b = self.ops.backend
        self.kd_full = kd_kernel(b, "fused_linear_kd")
        self.kd_topk = kd_kernel(b, "fused_linear_kd_topk")

    def teacher_signal(self, micro) -> tuple:
        c = self.kd
        if self.cache is not None:
            v, i = self.cache.lookup(micro[2], self.device)
            return v.reshape(-1, v.shape[-1]), i.reshape(-1, i.shape[-1])
        x_t = self.dparts.teacher_input(micro[0], micro[1]).to(self.device)
        z = self.teacher.logits(x_t)
        z = z.reshape(-1, z.shape[-1])
        return (z,) if c.teacher_topk is None else topk_stable(z, c.teacher_topk)

    def micro_loss(self, micro) -> tuple[torch.Tensor, dict]:
        c = self.kd
        x = micro[0].to(self.device, non_blocking=True)
        y = micro[1].to(self.device, non_blocking=True).reshape(-1)
        with self._autocast():
            h = self.model.hidden(x)
        h = h.reshape(-1, h.shape[-1]).float()
        n = int((y != IGNORE_INDEX).sum())
        if n == 0:  # the kernel's mean over no token is NaN; nothing to learn, nothing to add
            return h.sum() * 0.0, {}
        sig = self.teacher_signal(micro)
        fn = self.kd_full if len(sig) == 1 else self.kd_topk
        loss, kl, ce = fn(h, self.model.embed_tokens.weight, *sig, y,
                          temperature=c.temperature, alpha=c.alpha, ignore_index=IGNORE_INDEX,
                          chunk_size=c.kd_chunk)
        stats = {"kl_sum": float(kl) * n, "ce_sum": float(ce) * n}
        return self.dparts.micro_numerator(loss, n), stats


# ------------------------------------------------------------------------------- the run
class DistillRun(R.PretrainRun):
    """PretrainRun with a teacher: loaded and frozen once the run directory is locked and
    before the data, checked against the student's vocabulary and tokenizer in the preflight
    (before step 1), fingerprinted before and after training."""

    def __init__(self, cfg: DistillConfig, parts: LoopParts, dparts: DistillParts,
                 teacher: Teacher | None = None, console=None):
        super().__init__(cfg, parts)
        self.dparts = dparts
        self.teacher = teacher
        self.console = console
        self.cache: TopkCache | None = None

    def open(self, resume) -> None:
        # after the lock: loading the teacher can mean training the built-in base (a minute),
        # which a run refused for a live directory must not spend
        super().open(resume)
        cfg = self.cfg
        if self.teacher is None:
            self.teacher = load_teacher(cfg.teacher, cfg.backend, self.console,
                                        {k: getattr(cfg, k) for k in DATA_FIELDS})
        self.teacher.module.to(self.device)
        self.dparts.freeze(self.teacher.module)
        self.teacher.fingerprint = weights_fingerprint(self.teacher.module)

    def prepare(self, data) -> None:
        super().prepare(data)
        self.dparts.check_teacher(self.teacher, self.mcfg.vocab_size, self.data)
        cfg = self.cfg
        if cfg.teacher_cache is not None:
            self.cache = self.open_cache(Path(cfg.teacher_cache))

    def open_cache(self, path: Path) -> TopkCache:
        cfg, s = self.cfg, self.sampler
        ident = TopkCache.identity(self.teacher, self.data.key, self.mcfg.max_seq_len,
                                   cfg.teacher_topk)
        if not path.exists():
            blocks = blocks_visited(dict(stream=s.stream, seq_len=s.seq_len,
                                         batch_size=s.batch_size, grad_accum=s.grad_accum,
                                         epochs=s.epochs, seed=s.seed, data_key=s.data_key),
                                    cfg.max_steps)
            log.info("teacher cache: top-%d of %d blocks -> %s", cfg.teacher_topk,
                     len(blocks), path)
            TopkCache.build(path, self.teacher, s.stream, blocks, s.seq_len, cfg.teacher_topk,
                            ident)
        return TopkCache.load(path, ident)

    def make_trainer(self) -> Trainer:
        if self.data.cache_path is not None:
            # the student's checkpoints carry their tokenizer: load_base finds it in the run
            # directory (a distillation config is not a pretraining config to re-derive it from)
            tok = self.out / "tokenizer.json"
            atomic_write(tok, (self.data.cache_path / "tokenizer.json").read_text())
        self.sampler = BlockTagged(self.sampler)
        return DistillTrainer(self.model, self.cfg, self.device, self.autocast, self.parts,
                              teacher=self.teacher, cfg_kd=self.cfg, cache=self.cache,
                              dparts=self.dparts)

    def finish(self) -> None:
        check_frozen(self.teacher)
        super().finish()
        self.write_summary()

    def write_summary(self) -> None:
        t = self.teacher
        atomic_write(self.out / "distill.json", json.dumps({
            "teacher": t.source, "teacher_layout": t.info.get("layout"),
            "teacher_fingerprint": t.fingerprint, "teacher_params":
                sum(p.numel() for p in t.module.parameters()),
            "student_params": sum(p.numel() for p in self.model.parameters()),
            "alpha": self.cfg.alpha, "temperature": self.cfg.temperature,
            "teacher_topk": self.cfg.teacher_topk, "teacher_cache": self.cfg.teacher_cache,
            "kd_kernel": f"falsify.kernels.{self.model.ops.backend}.{KD_MODULE}",
            "val_loss": self.result.val_loss, "val_ppl": self.result.val_ppl}, indent=1))


def check_frozen(teacher: Teacher) -> None:
    """After training: the teacher's weights are bit-identical to what was loaded."""
    now = weights_fingerprint(teacher.module)
    if now != teacher.fingerprint:
        raise RuntimeError(f"teacher {teacher.source}: its weights changed during distillation "
                           f"(fingerprint {teacher.fingerprint[:12]} -> {now[:12]})")


class BlockTagged:
    """The run's BatchSampler, each micro-batch tagged with its block indices (x, y, blocks)
    so a cached teacher can be looked up; position state is the sampler's own."""

    def __init__(self, inner: data_mod.BatchSampler):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def next_step(self):
        micro = self.inner.next_step()
        return [(x, y, torch.from_numpy(np.asarray(b, np.int64)))
                for (x, y), b in zip(micro, self.inner.last_blocks, strict=True)]


def distill(cfg: DistillConfig, *, resume=None, data=None, stop_after=None,
            keep_model: bool = False, parts: LoopParts | None = None,
            dparts: DistillParts | None = None, teacher: Teacher | None = None,
            console=None) -> R.TrainResult:
    """Run (or resume) a distillation run, as falsify/llm/run.py:train runs pretraining."""
    with R.torch_threads(cfg.threads):
        return drive(OneProcess(), lambda: DistillRun(cfg, parts or LoopParts(),
                                                      dparts or DistillParts(), teacher,
                                                      console),
                     lambda run: run.prepare(data), resume, stop_after, keep_model)
