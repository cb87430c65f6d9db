"""Loop configs: one strict base (`LoopConfig`) that pretraining (`TrainConfig`) and fine-tuning
(falsify/llm/finetune_config.py's `FinetuneConfig`, and falsify/llm/grpo.py's `GrpoConfig` on it)
extend, with one set of parsing and value rules.

A config is a flat dataclass: an unknown field, a wrong type or an impossible value is an error
naming the field, never a silent default (a YAML key read under the wrong name, or max_steps
ignored, otherwise trains the wrong run without a word). A field typed `X | None` takes null,
meaning what its comment says (automatic, off, the preset's value); every value rule skips null
and only null. Architecture fields of TrainConfig left as null come from the named `model`
preset; that is the only source of values not written in the config, and the effective config
(with the resolved architecture) is saved with every run and every checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from falsify.llm.config_file import ConfigError, read_config_file
from falsify.llm.model import ModelConfig, ModelConfigError, preset

ARCH_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
               "intermediate_size", "rope_theta", "rms_norm_eps", "init_std")
# The TrainConfig fields that decide the corpus and so the tokenizer trained on it (run.data_spec
# reads them, and the seed for the synthetic corpus). Two runs that agree on them share one
# tokenizer: a distillation student and its teacher, the pipeline's pretrain and distill stages.
DATA_FIELDS = ("corpus", "data_files", "jsonl_field", "max_files", "max_bytes", "val_fraction",
               "synthetic_tokens", "vocab_size")
# The quick demo corpus: the first ~2 MB of the stdlib, enough for the tiny preset's few hundred
# steps and tokenized in seconds. The built-in base and the default pipeline train on it; a plain
# `falsify train` (and `falsify distill`) reads the whole corpus (TrainConfig.max_bytes = null).
QUICK_MAX_BYTES = 2_000_000


class FinetuneConfigError(ConfigError):
    """A bad fine-tuning config field (or base model); the message names it."""


# ------------------------------------------------------------------------ value parsing
def _is_optional(tp) -> tuple[bool, object]:
    args = typing.get_args(tp)
    if (typing.get_origin(tp) in (typing.Union, types.UnionType)) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return True, rest[0]
    return False, tp


def _finite(name: str, x: int | float) -> float:
    """Every float field must be finite. inf passes each `> 0` check yet means "off"
    (`grad_clip=inf` silently skipped clipping) or fails only once training
    starts (`lr=inf`: the schedule's error at step 1, after the data is built); a NaN fails every
    comparison, so a field without a range check would let it through."""
    try:
        f = float(x)  # an int beyond float range (YAML `lr: 1000…0`) raises OverflowError
    except OverflowError:
        f = math.inf
    if not math.isfinite(f):
        raise ConfigError(f"config field {name!r} must be a finite number, got {x!r}")
    return f


def _parse_text(name: str, base, value):
    """A command-line `key=value` string as the field's type."""
    if typing.get_origin(base) is list:
        return [v for v in str(value).split(",") if v] if value != "" else []
    text = str(value)
    try:
        if base is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if base is int:
            return int(text.replace("_", ""))
        if base is not float:
            return text
        parsed = float(text)
    except ValueError:
        raise ConfigError(f"config field {name!r}: cannot parse {text!r} as "
                          f"{base.__name__}") from None
    return _finite(name, parsed)


def coerce_value(name: str, tp, value, from_text: bool):
    """`value` (from YAML, a dict, or command-line text) as field `name` of type `tp`."""
    optional, base = _is_optional(tp)
    # on the command line null is `null` or `~`, and `none` too where a field takes null; a
    # field that does not is given the word itself (corpus=none: "no built-in corpus")
    nulls = ("null", "none", "~") if optional else ("null", "~")
    if value is None or (from_text and str(value).lower() in nulls):
        if optional:
            return None
        raise ConfigError(f"config field {name!r} may not be null")
    if from_text:
        value = _parse_text(name, base, value)
        if typing.get_origin(base) is not list:
            return value
    if typing.get_origin(base) is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"config field {name!r} must be a list of strings, got {value!r}")
        return list(value)
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


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"override {it!r} is not key=value")
        k, v = it.split("=", 1)
        out[k.strip()] = v
    return out


def read_yaml_config(path: str | Path) -> dict:
    return read_config_file(path)


# ------------------------------------------------------------------------ the base
# (rule, why) per field name; a field absent from a config class is skipped, null skips a rule.
AT_LEAST_1 = (lambda v: v >= 1, "must be >= 1")
POSITIVE = (lambda v: v > 0, "must be > 0")
NON_NEGATIVE = (lambda v: v >= 0, "must be >= 0")
UNIT_OPEN = (lambda v: 0 <= v < 1, "must be in [0, 1)")
# backend: a backend by name, `auto`, or a dispatch policy (falsify/llm/dispatch.py)
BACKEND_CHOICES = ("torch", "triton", "auto", "fastest-verified", "prefer:torch",
                   "prefer:triton", "reference")
CHOICES = {"backend": BACKEND_CHOICES, "device": ("auto", "cpu", "cuda"),
           "precision": ("auto", "fp32", "bf16"), "parallel": ("ddp", "fsdp")}
RULES = {
    **{k: AT_LEAST_1 for k in ("batch_size", "grad_accum", "epochs", "max_steps",
                               "eval_interval", "log_interval", "keep_last", "threads",
                               "sample_top_k", "seq_len")},
    **{k: NON_NEGATIVE for k in ("warmup_steps", "weight_decay", "sample_tokens",
                                 "sample_temperature")},
    **{k: POSITIVE for k in ("lr", "adam_eps", "andon_grad_norm", "andon_loss_max")},
    "grad_clip": (lambda v: v > 0, "must be > 0 (clipping is always on)"),
    "beta1": UNIT_OPEN, "beta2": UNIT_OPEN,
    **{k: (lambda v, c=c: v in c, f"must be {', '.join(c[:-1])} or {c[-1]}")
       for k, c in CHOICES.items()},
}


@dataclass
class LoopConfig:
    """What every training loop has: steps, AdamW, clipping, schedule, Andon stops, runtime,
    logging and sampling. Subclasses add their fields (and may give these other defaults)
    and their rules (`extra_rules`); parsing and the shared rules live here only."""

    error: ClassVar[type[ConfigError]] = ConfigError
    rules: ClassVar[dict] = RULES

    seq_len: int | None = None
    # torch | triton | auto (triton only with a GPU; logged) | a dispatch policy, per kernel from
    # the ledger: fastest-verified | prefer:torch | prefer:triton | reference (falsify/llm/dispatch)
    backend: str = "auto"
    ledger: str | None = None  # the policies' ledger (null: the working directory's project's)
    bench_baseline: str | None = None  # fastest-verified's timings (falsify bench kernels file)
    cache_dir: str = ".falsify/cache"
    # steps
    batch_size: int = 16
    grad_accum: int = 1
    epochs: int = 1
    max_steps: int | None = None
    warmup_steps: int | None = None
    # optimizer
    lr: float = 3e-3
    lr_min: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # always applied (a safety clip that can be off is a bug)
    # Andon stops
    andon_grad_norm: float = 100.0  # pre-clip global grad norm above this stops the run
    andon_loss_max: float | None = None  # loss above this stops the run (null: only non-finite)
    # runtime
    seed: int = 42
    device: str = "auto"  # auto | cpu | cuda
    precision: str = "auto"  # auto (fp32: what the kernels' contracts check) | fp32 | bf16 (CUDA)
    threads: int | None = None  # null: all cores, or 1 when the machine is already loaded
    activation_checkpointing: bool = False
    # evaluation, logging, checkpoints
    eval_interval: int | None = None
    log_interval: int = 10
    keep_last: int = 2
    out_dir: str | None = None
    progress: bool = True
    # sample at the end
    sample_tokens: int = 120
    sample_temperature: float = 0.8  # 0: greedy
    sample_top_k: int = 40

    # ---------------------------------------------------------------- parsing
    @classmethod
    def from_dict(cls, d: dict, source: str = "config", base: LoopConfig | None = None,
                  from_text: bool = False):
        """Strict: an unknown key is an error naming it (with the closest known names)."""
        hints = typing.get_type_hints(cls)
        known = [f.name for f in fields(cls)]
        values = asdict(base) if base is not None else {}
        lines = getattr(d, "lines", {})  # a config file's (config_file.FieldLines)

        def where(name: str) -> str:
            return f"{source}:{lines[name]}" if name in lines else source

        for k, v in d.items():
            if k not in known:
                close = difflib.get_close_matches(k, known, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise cls.error(f"{where(k)}: unknown config field {k!r}{hint}")
            try:
                values[k] = coerce_value(k, hints[k], v, from_text)
            except ConfigError as e:
                raise cls.error(f"{where(k)}: {e}") from None
        cfg = cls(**values)
        try:
            cfg.validate()
        except ConfigError as e:
            name = getattr(e, "field", None)
            if name in lines:  # a value this file set: say where
                raise cls.error(f"{where(name)}: {e}") from None
            raise
        return cfg

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: list[str] = (),
             base: LoopConfig | None = None):
        """YAML file (a flat mapping of fields), then `key=value` overrides."""
        cfg = base or cls()
        if path is not None:
            cfg = cls.from_dict(read_yaml_config(path), source=str(path), base=cfg)
        if overrides:
            cfg = cls.from_dict(parse_overrides(list(overrides)), source="command line",
                                base=cfg, from_text=True)
        cfg.validate()
        return cfg

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- rules
    def need(self, cond: bool, name: str, why: str) -> None:
        if not cond:
            err = self.error(f"config field {name}={getattr(self, name)!r}: {why}")
            err.field = name  # from_dict adds the file and line that set it
            raise err

    def extra_rules(self) -> Iterator[tuple[bool, str, str]]:
        """(holds, field, why) of rules beyond the per-field table (cross-field ones)."""
        yield 0 <= self.lr_min <= self.lr, "lr_min", "must be in [0, lr]"
        policy = self.backend not in ("torch", "triton", "auto")
        for name in ("ledger", "bench_baseline"):
            yield (policy or getattr(self, name) is None, name,
                   f"only a dispatch policy reads it; backend={self.backend!r} does not")

    def validate(self) -> None:
        """Value checks that need no data: each error names its field."""
        names = {f.name for f in fields(self)}
        for name, (ok, why) in self.rules.items():
            if name in names and getattr(self, name) is not None:
                self.need(ok(getattr(self, name)), name, why)
        for holds, name, why in self.extra_rules():
            self.need(holds, name, why)


# ------------------------------------------------------------------------ pretraining
@dataclass
class TrainConfig(LoopConfig):
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
    # data
    corpus: str = "stdlib"  # stdlib | synthetic | none
    data_files: list[str] = field(default_factory=list)
    jsonl_field: str = "text"
    max_files: int | None = None  # null: no limit
    max_bytes: int | None = None  # null: no limit
    val_fraction: float = 0.05
    synthetic_tokens: int = 200_000
    fim_rate: float = 0.0  # [bavarian2022] uses 0.5 PSM; off here so val ppl is left-to-right
    # steps (lr scaled up for the tiny model)
    max_steps: int = 300
    warmup_steps: int = 30
    memory_budget_gb: float | None = None  # null: the machine's RAM (CPU) / GPU memory
    # data parallelism, when launched as several processes (falsify train --nproc N): DDP
    # replicates the model, FSDP shards weights, gradients and AdamW state over the ranks
    parallel: str = "ddp"
    # evaluation, logging, checkpoints
    eval_interval: int = 100
    eval_batches: int = 16
    save_interval: int = 100
    out_dir: str | None = None  # null: a new runs/<model>-<UTC time> per fresh run
    # sample at the end
    sample_prompt: str = "def"

    rules: ClassVar[dict] = {
        **RULES,
        **{k: AT_LEAST_1 for k in ("eval_batches", "save_interval", "max_files", "max_bytes",
                                   "synthetic_tokens")},
        "memory_budget_gb": POSITIVE,
        "val_fraction": UNIT_OPEN,
        "fim_rate": (lambda v: 0 <= v <= 1, "must be in [0, 1]"),
    }

    def validate(self) -> None:
        super().validate()
        try:
            model_config(self)
        except ModelConfigError as e:
            err = ConfigError(str(e))
            named = re.match(r"model field (\w+)=", str(e))
            err.field = named.group(1) if named else "model"  # the preset, or a field it sets
            raise err from None


# Fields that may differ between a checkpoint's config and the resumed run: they do not change
# the arithmetic of any step, so bit-identical continuation holds.
RESUME_MUTABLE = {"eval_interval", "eval_batches", "log_interval", "save_interval", "keep_last",
                  "out_dir", "progress", "sample_tokens", "sample_prompt", "sample_temperature",
                  "sample_top_k", "threads", "cache_dir", "andon_grad_norm", "andon_loss_max",
                  "memory_budget_gb",
                  # how the ranks hold the state, not what it is: a checkpoint's shards are
                  # read back however the resuming ranks hold them (sharded_checkpoint.py)
                  "parallel"}


def config_from_dict(d: dict, source: str = "config", base: TrainConfig | None = None,
                     from_text: bool = False) -> TrainConfig:
    return TrainConfig.from_dict(d, source, base, from_text)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: TrainConfig | None = None) -> TrainConfig:
    return TrainConfig.load(path, overrides, base)


def validate_config(cfg: LoopConfig) -> None:
    cfg.validate()


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The preset with the non-null architecture fields of `cfg` applied (validated)."""
    over = {k: getattr(cfg, k) for k in ARCH_FIELDS if getattr(cfg, k) is not None}
    if cfg.seq_len is not None:
        over["max_seq_len"] = cfg.seq_len
    return preset(cfg.model, **over)


def effective_config(cfg: TrainConfig, extra: dict | None = None) -> dict:
    return {"train": asdict(cfg), "model": model_config(cfg).to_dict(), **(extra or {})}


def check_resume_config(saved: dict, cfg: LoopConfig, where: Path, mutable: set[str]) -> None:
    """A resumed run must continue the same arithmetic: every field outside `mutable` must
    equal the checkpoint's."""
    now = asdict(cfg)
    # a field the checkpoint's config lacks was added later; its default is what that run did
    defaults = {f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING
                         else f.default) for f in fields(cfg)}
    diff = [k for k in now if k not in mutable
            and saved.get(k, defaults[k]) != now[k]]
    if diff:
        k = diff[0]
        raise cfg.error(f"config field {k!r} is {now[k]!r} but checkpoint {where} was written "
                        f"with {saved.get(k)!r}; resuming with a different {k} would not "
                        "continue the same run")
