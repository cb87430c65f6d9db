"""The config of a fine-tuning run (`FinetuneConfig`, on falsify/llm/config.py's `LoopConfig`):
the base, the adapters, the data, steps, optimizer, evaluation and the end-of-run samples of
`falsify finetune --method lora|qlora`. GRPO's config (`--method grpo`) extends it with only
its own fields: falsify/llm/grpo.py's `GrpoConfig`; falsify/llm/finetune_stage.py reads a
config of either method (it picks the class by `method`).

Its own module because both the run (falsify/llm/finetune.py) and the frozen base's loader
(falsify/llm/finetune_base.py: the built-in base is trained from the config's fields) need it,
and the run imports the loader: here, below both, neither imports the other to reach it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from falsify.llm import lora_model as LM
from falsify.llm.config import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    RULES,
    UNIT_OPEN,
    ConfigError,
    FinetuneConfigError,
    LoopConfig,
)

# the objective: lora / qlora train SFT, reward-weighted SFT or DPO on an fp32 / NF4 base (which
# one the data decides: preference pairs are DPO), grpo runs GRPO on code problems
METHODS = ("lora", "qlora", "grpo")


@dataclass
class FinetuneConfig(LoopConfig):
    error: ClassVar[type[ConfigError]] = FinetuneConfigError
    # the methods this class configures (a subclass configures its own: GrpoConfig, grpo)
    configures: ClassVar[tuple[str, ...]] = ("lora", "qlora")

    method: str = "qlora"  # lora | qlora | grpo (the objective and, but for grpo, the adapter)
    model: str | None = None  # our checkpoint / run dir, or an HF LLaMA dir; null: built-in
    data: list[str] = field(default_factory=list)  # JSONL files; []: the shipped dataset
    # adapters
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(LM.DEFAULT_TARGETS))
    freeze_layers: int = 0
    double_quant: bool = True
    nf4_blocksize: int = 64
    rslora: bool = False
    # train the masked delta W + M ⊙ (s·B·A) with the base's pruning masks (masks.safetensors,
    # `falsify prune`), so the merged model keeps every pruned weight at exactly 0
    keep_masks: bool = False
    # data
    train_on_prompt: bool = False
    seq_len: int | None = None  # null: the base's max_seq_len
    overlong: str = "truncate"  # truncate | drop | error (counts are reported either way)
    val_split: float = 0.05
    shuffle: bool = True
    max_examples: int | None = None  # use the first N examples (after tokenizing)
    # steps
    batch_size: int = 8
    max_steps: int | None = None  # null: epochs x steps_per_epoch
    warmup_steps: int | None = None  # null: 5 % of max_steps (rounded down)
    # optimizer (the lr suits the tiny built-in base)
    lr: float = 2e-3
    lr_min: float = 2e-4
    beta2: float = 0.999
    weight_decay: float = 0.01
    dpo_beta: float = 0.1
    # evaluation, early stopping, checkpoints
    eval_interval: int | None = None  # null: at the end of every epoch and of the run
    early_stopping_patience: int | None = None  # evaluations without a new best val loss
    save_every: int = 0  # 0: only at the end (and on early stop)
    out_dir: str | None = None  # null: a new runs/<method>-<UTC time> per fresh run
    # the built-in base (only when model is null): steps of the pretraining loop on the stdlib
    base_steps: int = 200
    # sample at the end (base vs base+adapter on held-out prompts)
    sample_tokens: int = 64
    sample_count: int = 2
    sample_temperature: float = 0.7  # 0: greedy

    rules: ClassVar[dict] = {
        **RULES,
        **{k: AT_LEAST_1 for k in ("base_steps", "max_examples", "early_stopping_patience")},
        **{k: NON_NEGATIVE for k in ("save_every", "sample_count")},
        "dpo_beta": POSITIVE,
        "val_split": UNIT_OPEN,
        "overlong": (lambda v: v in ("truncate", "drop", "error"),
                     "must be truncate, drop or error"),
        "method": (lambda v: v in METHODS, "must be lora, qlora or grpo"),
    }

    @property
    def adapter(self) -> str:
        """The adapter trained: lora (fp32 base) or qlora (NF4 base)."""
        return self.method

    def extra_rules(self) -> Iterator[tuple[bool, str, str]]:
        yield from super().extra_rules()
        yield (self.early_stopping_patience is None or self.val_split > 0,
               "early_stopping_patience",
               "needs val_split > 0 (early stopping watches the validation loss)")
        # a method another class configures would run without that class's fields
        yield (self.method in self.configures, "method",
               f"{type(self).__name__} configures method {' or '.join(self.configures)}; "
               "falsify.llm.finetune_stage.load_config reads a config of any method")

    def validate(self) -> None:
        super().validate()
        lora_spec(self)


def config_from_dict(d: dict, source: str = "config", base: FinetuneConfig | None = None,
                     from_text: bool = False) -> FinetuneConfig:
    return FinetuneConfig.from_dict(d, source, base, from_text)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: FinetuneConfig | None = None) -> FinetuneConfig:
    return FinetuneConfig.load(path, overrides, base)


def validate_config(cfg: FinetuneConfig) -> None:
    cfg.validate()


def lora_spec(cfg: FinetuneConfig) -> LM.LoraSpec:
    try:
        return LM.LoraSpec(method=cfg.adapter, r=cfg.lora_r, alpha=cfg.lora_alpha,
                           dropout=cfg.lora_dropout, targets=LM.normalize_targets(cfg.targets),
                           freeze_layers=cfg.freeze_layers, double_quant=cfg.double_quant,
                           blocksize=cfg.nf4_blocksize, rslora=cfg.rslora,
                           seed=cfg.seed).validate()
    except LM.LoraConfigError as e:
        raise FinetuneConfigError(str(e).replace("field r=", "field lora_r=")
                                  .replace("field alpha=", "field lora_alpha=")
                                  .replace("field dropout=", "field lora_dropout=")
                                  .replace("field blocksize=", "field nf4_blocksize=")) from None
