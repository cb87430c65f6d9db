"""The frozen base a fine-tuning run adapts: loaded from one of our checkpoints, `falsify merge`
output or an HF LLaMA directory, or the built-in base (the pretraining loop's tiny preset on the
stdlib, trained once and cached); its fingerprint; and the adapter-only view a fine-tuning
checkpoint stores.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from falsify.harness.files import atomic_path
from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import data as data_mod
from falsify.llm import lora_model as LM
from falsify.llm import run as R
from falsify.llm.config import (
    QUICK_MAX_BYTES,
    ConfigError,
    FinetuneConfigError,
    TrainConfig,
    model_config,
)
from falsify.llm.config import config_from_dict as train_config_from_dict
from falsify.llm.finetune_config import FinetuneConfig, load_config
from falsify.llm.model import ModelConfig, Transformer, build_model


@dataclass
class Base:
    model: Transformer
    tokenizer: object | None
    tokenizer_path: str | None
    source: str  # what was loaded: path, or "built-in ..."
    layout: str  # "ours" | "hf" | "gguf" | "memory"
    info: dict = field(default_factory=dict)
    path: str | None = None  # a directory load_base() reloads it from (None: in memory)
    # pruning masks (masks.safetensors next to the weights, `falsify prune`): projection name
    # -> bool mask, True = kept; None: the base carries none
    masks: dict | None = None
    masks_path: str | None = None


def _find_tokenizer(paths: list[Path]) -> Path | None:
    for p in paths:
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
    return None


def load_base(path: str | Path, backend: str = "auto", need_tokenizer: bool = True,
              tokenizer: str | Path | None = None) -> Base:
    """Our checkpoint (a checkpoint dir, a run dir = its latest checkpoint, or the directory
    `falsify merge`, `prune` or `quantize` wrote: its ours/ layout, the same weights as its
    hf/ copy), an HF LLaMA directory (config.json + model.safetensors, falsify/llm/hf.py) or a
    llama.cpp GGUF LLaMA file (falsify/llm/gguf_io/read.py: quantized projections stay
    quantized). Its tokenizer is found (or, for a pretraining checkpoint, recovered) whenever it
    has one; `need_tokenizer`: one that has none is an error (a synthetic-corpus run has none).
    `tokenizer`: a tokenizer.json given in place of the base's own (no search, no recovery)."""
    from safetensors.torch import load_file

    from falsify.llm import hf

    p = Path(path)
    if not p.exists():
        raise FinetuneConfigError(f"config field model={str(path)!r}: no such file or directory")
    if p.is_file():
        return _gguf_base(p, backend, need_tokenizer, tokenizer)
    if not (p / "config.json").is_file() and (p / "ours" / ckpt_mod.STATE).is_file():
        p = p / "ours"
    if (p / "config.json").is_file() and (p / "model.safetensors").is_file() and \
            json.loads((p / "config.json").read_text()).get("model_type") == "llama":
        model = hf.import_hf(p, backend)
        layout, where = "hf", [p]
        masks_dir = p
    else:
        try:
            ck = ckpt_mod.find_checkpoint(p)
        except ckpt_mod.CheckpointError as e:
            raise FinetuneConfigError(
                f"config field model={str(path)!r}: neither an HF LLaMA directory "
                f"(config.json + model.safetensors) nor one of our checkpoints ({e})") from None
        state = ckpt_mod.read_state(ck)
        mcfg = ModelConfig(**state["config"]["model"])
        model = build_model(mcfg, backend, seed=0)
        weights = load_file(str(ck / "model.safetensors"))
        own = model.state_dict()
        if set(weights) != set(own):
            raise FinetuneConfigError(f"{ck}: weights do not match the model config (missing "
                                      f"{sorted(set(own) - set(weights))[:3]}, unexpected "
                                      f"{sorted(set(weights) - set(own))[:3]})")
        model.load_state_dict(weights, strict=True)
        layout, where = "ours", [ck, ck.parent.parent, p]
        tok_path = Path(tokenizer) if tokenizer else _find_tokenizer(where)
        if tok_path is None and "train" in state["config"]:
            # whether or not the caller needs one: an export or a merge ships it when it exists
            tok_path = _tokenizer_from_train_config(state["config"]["train"], mcfg)
        base = _base(model, tok_path, str(p), layout, need_tokenizer)
        base.info["corpus"] = state["config"].get("train", {}).get("corpus")
        return _with_masks(base, ck)
    tok_path = Path(tokenizer) if tokenizer else _find_tokenizer(where)
    return _with_masks(_base(model, tok_path, str(p), layout, need_tokenizer), masks_dir)


def _gguf_base(p: Path, backend: str, need_tokenizer: bool, tokenizer=None) -> Base:
    from falsify.llm import gguf_io

    with p.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise FinetuneConfigError(f"config field model={str(p)!r}: a file that is not GGUF "
                                  "(a base is a GGUF file or a model directory)")
    try:
        model, tok = gguf_io.base_model(p, backend)
    except gguf_io.GGUFError as e:
        raise FinetuneConfigError(f"config field model: {e}") from None
    tok_path = Path(tokenizer) if tokenizer else \
        gguf_io.tokenizer_file(tok) if tok is not None else None
    base = _base(model, tok_path, str(p), "gguf", need_tokenizer)
    base.info["gguf_quantized"] = {k: v.qtype for k, v in model.gguf_quant.items()}
    return base


def _with_masks(base: Base, weights_dir: Path) -> Base:
    """Attach the masks.safetensors that lies next to the weights, checked against them: it
    names exactly the model's projections, each mask has its weight's shape, and every pruned
    position is 0 in the weights (else the file describes another model, or the weights were
    changed after pruning — e.g. a merge without masks refilled them)."""
    f = Path(weights_dir) / LM.MASKS_FILE
    if not f.is_file():
        return base
    from falsify.llm.prune import projection_weights

    masks = LM.read_masks(f)
    weights = projection_weights(base.model)
    missing, extra = sorted(set(weights) - set(masks)), sorted(set(masks) - set(weights))
    if missing or extra:
        raise FinetuneConfigError(f"{f}: the masks do not name this model's projections "
                                  f"(missing {missing[:3]}, unexpected {extra[:3]})")
    for name, w in weights.items():
        m = masks[name]
        if tuple(m.shape) != tuple(w.shape):
            raise FinetuneConfigError(f"{f}: mask {name} has shape {tuple(m.shape)}, the weight "
                                      f"{tuple(w.shape)}")
        live = int((w.detach()[~m] != 0).sum())
        if live:
            raise FinetuneConfigError(f"{f}: {live} weight(s) of {name} that the mask prunes are "
                                      "not 0: the weights changed after pruning (or the masks "
                                      "belong to another model)")
    base.masks, base.masks_path = masks, str(f)
    return base


def _base(model, tok_path, source, layout, need_tokenizer) -> Base:
    if tok_path is None and need_tokenizer:
        raise FinetuneConfigError(f"base {source}: no tokenizer.json found next to it (text data "
                                  "needs the base's tokenizer)")
    tok = data_mod.load_tokenizer(tok_path) if tok_path is not None else None
    if tok is not None and tok.get_vocab_size() != model.cfg.vocab_size:
        raise FinetuneConfigError(f"base {source}: tokenizer vocab {tok.get_vocab_size()} != "
                                  f"model vocab_size {model.cfg.vocab_size}")
    return Base(model, tok, str(tok_path) if tok_path else None, source, layout,
                {"params": sum(p.numel() for p in model.parameters())},
                path=str(Path(source).resolve()))


def _tokenizer_from_train_config(train_cfg: dict, mcfg: ModelConfig) -> Path | None:
    """A pretraining checkpoint does not store its tokenizer; it is the (deterministic, cached)
    tokenizer of the training corpus, found again through the same data spec."""
    if train_cfg.get("corpus") == "synthetic":
        return None
    tcfg = train_config_from_dict(train_cfg, source="checkpoint train config")
    prepared = data_mod.prepare_data(R.data_spec(tcfg, mcfg.vocab_size), tcfg.cache_dir)
    return prepared.cache_path / "tokenizer.json"


def builtin_base_config(cfg: FinetuneConfig, out_dir: Path, data: dict | None = None
                        ) -> TrainConfig:
    """The built-in base: the pretraining loop's `tiny` preset on the quick demo corpus, the
    first ~2 MB of the stdlib (the shipped SFT data is derived from the same corpus), about a
    minute on 2 CPU cores. `data`: TrainConfig data fields (config.DATA_FIELDS) that replace
    that corpus (a distillation student's, so the built-in teacher shares its tokenizer)."""
    return train_config_from_dict({
        "model": "tiny", "corpus": "stdlib", "max_bytes": QUICK_MAX_BYTES, "val_fraction": 0.05,
        "batch_size": 8, "grad_accum": 1, "max_steps": cfg.base_steps,
        "warmup_steps": max(1, cfg.base_steps // 20), "lr": 3e-3, "lr_min": 3e-4,
        "eval_interval": cfg.base_steps, "eval_batches": 4, "save_interval": cfg.base_steps,
        "keep_last": 1, "sample_tokens": 0, "seed": cfg.seed, "cache_dir": cfg.cache_dir,
        "out_dir": str(out_dir), "progress": cfg.progress, "backend": cfg.backend,
        "ledger": cfg.ledger, "bench_baseline": cfg.bench_baseline,  # a policy's evidence
        "device": cfg.device, "threads": cfg.threads, **(data or {})}, source="built-in base")


def builtin_base(cfg: FinetuneConfig, console=None, data: dict | None = None) -> Base:
    """Train the built-in base with the pretraining loop (falsify/llm/run.py), or reuse it from
    cache_dir (keyed by its config and the Python version, whose stdlib is the corpus).
    `data`: builtin_base_config's."""
    import sys

    probe = builtin_base_config(cfg, Path("."), data)
    key_src = {k: v for k, v in asdict(probe).items()
               if k not in ("out_dir", "progress", "cache_dir", "threads", "ledger",
                            "bench_baseline")}
    key_src["python"] = sys.version.split()[0]
    key = hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(cfg.cache_dir) / "finetune-base" / key
    tcfg = builtin_base_config(cfg, out, data)
    done = out / "summary.json"
    if not done.is_file():
        if console is not None:
            console.print(f"built-in base: training the tiny preset on the stdlib for "
                          f"{tcfg.max_steps} steps -> {out} (cached for later runs)")
        resume = "auto" if ckpt_mod.list_checkpoints(out) else None
        R.train(tcfg, resume=resume)
    elif console is not None:
        console.print(f"built-in base: reusing {out}")
    mcfg = model_config(tcfg)
    tok = out / "tokenizer.json"
    if not tok.is_file():
        src = data_mod.prepare_data(R.data_spec(tcfg, mcfg.vocab_size), tcfg.cache_dir)
        _atomic_copy(src.cache_path / "tokenizer.json", tok)
    base = load_base(out, cfg.backend)
    base.source = f"built-in base ({out})"
    summary = json.loads(done.read_text())
    base.info.update({"builtin": True, "base_val_loss": summary.get("val_loss"),
                      "base_steps": summary.get("final_step")})
    return base


def base_or_builtin(model: str | None, backend: str = "auto", console=None,
                    data: dict | None = None) -> Base:
    """The model a command works on: `model` (load_base) or, given none, the built-in base
    that `falsify finetune` uses (trained once, then reused from the cache); `data`:
    builtin_base_config's."""
    if model:
        return load_base(model, backend)
    return builtin_base(load_config(None, [f"backend={backend}", "progress=false"]), console,
                        data)


def _atomic_copy(src: Path, dst: Path) -> None:
    import shutil

    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)


def base_fingerprint(model: Transformer) -> str:
    """sha256 of the base's tensors (names, shapes, bytes): a resume must continue on the same
    base, and an adapter records which base it was trained on."""
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        if LM.is_adapter_param(k):
            continue
        h.update(f"{k}{tuple(v.shape)}{v.dtype}".encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class AdapterView:
    """What a fine-tuning checkpoint stores as "model": the adapters only (the base is frozen
    and identified by its fingerprint). Duck-types the state_dict API falsify/llm/checkpoint.py
    uses."""

    def __init__(self, model):
        self.model = model

    def state_dict(self) -> dict:
        return {k: v.detach() for k, v in LM.adapter_parameters(self.model).items()}

    def load_state_dict(self, sd: dict, strict: bool = True) -> None:
        own = LM.adapter_parameters(self.model)
        if strict and set(sd) != set(own):
            raise ckpt_mod.CheckpointError("adapter names differ from the checkpoint's")
        with torch.no_grad():
            for k, p in own.items():
                p.copy_(sd[k])


def load_adapted(adapter: str | Path, model_path: str | None, backend: str, console=None):
    """(base+adapter model, Base, sidecar): the base is checked against the adapter's record."""
    side = json.loads((Path(adapter) / LM.FALSIFY_META).read_text()) \
        if (Path(adapter) / LM.FALSIFY_META).is_file() else None
    if side is None:
        raise LM.LoraConfigError(f"{adapter}: {LM.FALSIFY_META} is missing (not an adapter "
                                 "written by `falsify finetune`)")
    path = model_path or side.get("base_path")
    if not path:
        raise ConfigError(f"{adapter} does not record its base; pass --model")
    if model_path is None and console is not None:
        console.print(f"base: {path} (recorded in the adapter)")
    base = load_base(path, backend, need_tokenizer=False)
    fp = base_fingerprint(base.model)
    if side.get("base_fingerprint") and fp != side["base_fingerprint"]:
        raise ConfigError(f"base {path} is not the base adapter {adapter} was trained on "
                          "(fingerprints differ)")
    model = LM.load_adapter(base.model, adapter)
    return model, base, side
