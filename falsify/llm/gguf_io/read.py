"""Reading a GGUF LLaMA model back as ours: config, tensors, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from falsify.llm.gguf_io.common import (
    ARCH,
    GGUFError,
    QuantTensor,
    _gguf,
    _heads_of,
    dequantize,
    expected_stored,
    our_names,
    unpermute_qk,
)
from falsify.llm.model import ModelConfig, Transformer, build_model

QUANT_NAMES = {"Q8_0": "q8_0", "Q4_K": "q4_k", "Q6_K": "q6_k"}


@dataclass
class GGUFModel:
    path: str
    config: ModelConfig
    tensors: dict  # our name -> torch tensor (f32/f16/bf16) or QuantTensor; q/k un-permuted
    tokenizer: object | None  # tokenizers.Tokenizer, None for a vocab-less file
    file_type: int | None = None


def open_reader(path: str | Path):
    gguf = _gguf()
    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"{p}: no such file")
    try:
        return gguf.GGUFReader(p)
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise GGUFError(f"{p}: not a readable GGUF file ({e})") from None


def field_value(reader, key: str, path, required: bool = True):
    f = reader.get_field(key)
    if f is None:
        if required:
            raise GGUFError(f"{path}: metadata key {key!r} is missing")
        return None
    return f.contents()


def _decimal(v: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not
    9.999999747e-06): the value the writer was given, whenever that was float32-representable
    to its printed precision, so a config survives the round trip unchanged."""
    return float(str(np.float32(v)))


def _config(reader, path) -> ModelConfig:
    gguf = _gguf()
    arch = field_value(reader, gguf.Keys.General.ARCHITECTURE, path)
    if arch != ARCH:
        raise GGUFError(f"{path}: general.architecture={arch!r}: only {ARCH!r} (LLaMA) models "
                        "are supported")
    gtype = field_value(reader, gguf.Keys.General.TYPE, path, required=False)
    if gtype not in (None, gguf.GGUFType.MODEL):
        raise GGUFError(f"{path}: general.type={gtype!r}: a model file is needed here")
    L = gguf.Keys.LLM
    A = gguf.Keys.Attention
    R = gguf.Keys.Rope

    def k(tmpl, required=True):
        return field_value(reader, tmpl.format(arch=ARCH), path, required)

    for key in (L.EXPERT_COUNT, R.SCALING_TYPE):
        v = k(key, required=False)
        if v not in (None, 0, "none"):
            raise GGUFError(f"{path}: {key.format(arch=ARCH)}={v!r} is not supported")
    heads = k(A.HEAD_COUNT)
    heads_kv = k(A.HEAD_COUNT_KV, required=False)
    for key, v in ((A.HEAD_COUNT, heads), (A.HEAD_COUNT_KV, heads_kv),
                   (L.FEED_FORWARD_LENGTH, k(L.FEED_FORWARD_LENGTH))):
        if isinstance(v, list):
            raise GGUFError(f"{path}: {key.format(arch=ARCH)} varies per layer: not supported")
    hidden = k(L.EMBEDDING_LENGTH)
    vocab = k(L.VOCAB_SIZE, required=False)
    if vocab is None:  # many files carry it only as the token list's length
        tokens = reader.get_field(gguf.Keys.Tokenizer.LIST)
        if tokens is None:
            raise GGUFError(f"{path}: neither {L.VOCAB_SIZE.format(arch=ARCH)!r} nor "
                            f"{gguf.Keys.Tokenizer.LIST!r} gives the vocabulary size")
        vocab = len(tokens.data)
    cfg = ModelConfig(vocab_size=int(vocab), hidden_size=int(hidden),
                      num_layers=int(k(L.BLOCK_COUNT)), num_heads=int(heads),
                      num_kv_heads=int(heads if heads_kv is None else heads_kv),
                      intermediate_size=int(k(L.FEED_FORWARD_LENGTH)),
                      max_seq_len=int(k(L.CONTEXT_LENGTH)),
                      # absent: llama.cpp's own LLaMA default, 10000
                      rope_theta=_decimal(k(R.FREQ_BASE, required=False) or 10000.0),
                      rms_norm_eps=_decimal(k(A.LAYERNORM_RMS_EPS)))
    try:
        cfg.validate()
    except ValueError as e:
        raise GGUFError(f"{path}: {e}") from None
    for key, want in ((R.DIMENSION_COUNT, cfg.head_dim), (A.KEY_LENGTH, cfg.head_dim),
                      (A.VALUE_LENGTH, cfg.head_dim)):
        v = k(key, required=False)
        if v is not None and v != want:
            raise GGUFError(f"{path}: {key.format(arch=ARCH)}={v} != embedding_length/"
                            f"head_count={want}: not supported")
    return cfg


def _tensor(t, path) -> torch.Tensor | QuantTensor:
    gguf = _gguf()
    T = gguf.GGMLQuantizationType
    rows_cols = tuple(int(d) for d in reversed(t.shape.tolist()))
    if t.tensor_type in (T.F32, T.F16):
        return torch.from_numpy(np.array(t.data)).reshape(rows_cols)
    if t.tensor_type == T.BF16:
        raw = np.array(t.data).view(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16).reshape(rows_cols)
    q = QUANT_NAMES.get(t.tensor_type.name)
    if q is None:
        raise GGUFError(f"{path}: tensor {t.name} has type {t.tensor_type.name}: unsupported "
                        f"(supported: F32, F16, BF16, {', '.join(QUANT_NAMES)})")
    if len(rows_cols) != 2:
        raise GGUFError(f"{path}: tensor {t.name}: quantized tensors must be 2-D, got "
                        f"{rows_cols}")
    blocks = torch.from_numpy(np.array(t.data)).reshape(rows_cols[0], -1)
    return QuantTensor(blocks, q, rows_cols)


def tokenizer_from_metadata(reader, path):
    """Our HF `tokenizers` byte-level BPE rebuilt from tokenizer.ggml.* (None for "none")."""
    gguf = _gguf()
    K = gguf.Keys.Tokenizer
    model = field_value(reader, K.MODEL, path)
    if model == "none":
        return None
    pre = field_value(reader, K.PRE, path, required=False)
    if model != "gpt2" or pre not in ("gpt-2", None):
        raise GGUFError(f"{path}: tokenizer.ggml.model={model!r} / pre={pre!r}: only the GPT-2 "
                        "byte-level BPE ('gpt2' / 'gpt-2') is rebuilt as an HF tokenizer")
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = field_value(reader, K.LIST, path)
    types = field_value(reader, K.TOKEN_TYPE, path, required=False) or \
        [int(gguf.TokenType.NORMAL)] * len(tokens)
    merges = field_value(reader, K.MERGES, path)
    if len(types) != len(tokens):
        raise GGUFError(f"{path}: {K.TOKEN_TYPE} has {len(types)} entries for {len(tokens)} "
                        "tokens")
    bad = [m for m in merges if len(m.split(" ")) != 2]
    if bad:
        raise GGUFError(f"{path}: {K.MERGES} entry {bad[0]!r} is not two space-separated tokens")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{path}: {K.LIST} repeats a token")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(tokens[i], special=(ty == gguf.TokenType.CONTROL), normalized=False)
             for i, ty in enumerate(types)
             if ty in (gguf.TokenType.CONTROL, gguf.TokenType.USER_DEFINED)]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    return tok


def read_gguf(path: str | Path) -> GGUFModel:
    """A GGUF LLaMA model file: config, our-named tensors (quantized ones kept as blocks, q/k
    back in rotate-half row order), tokenizer. Raises GGUFError naming the file and key/tensor."""
    gguf = _gguf()
    p = Path(path)
    reader = open_reader(p)
    cfg = _config(reader, p)
    names = our_names(cfg)
    found = {t.name: t for t in reader.tensors}
    out_w = found.pop("output.weight", None)
    emb = found.get("token_embd.weight")
    if out_w is not None and (emb is None or out_w.tensor_type != emb.tensor_type
                              or not np.array_equal(np.asarray(out_w.data),
                                                    np.asarray(emb.data))):
        raise GGUFError(f"{p}: tensor output.weight differs from token_embd.weight: only "
                        "tied-embedding models are supported")
    missing = sorted(set(names) - set(found))
    if missing:
        raise GGUFError(f"{p}: tensor {missing[0]} is missing ({len(missing)} missing)")
    extra = sorted(set(found) - set(names))
    if extra:
        raise GGUFError(f"{p}: tensor {extra[0]} is not part of a {ARCH} model we can build")
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Transformer(cfg, "torch").state_dict().items()}
    tensors = {}
    for gname, ours in names.items():
        t = _tensor(found[gname], p)
        shape = t.shape if isinstance(t, QuantTensor) else tuple(t.shape)
        if tuple(shape) != shapes[ours]:
            raise GGUFError(f"{p}: tensor {gname} has shape {tuple(shape)}, the config implies "
                            f"{shapes[ours]}")
        heads = _heads_of(ours, cfg)
        if heads is not None:
            if isinstance(t, QuantTensor):
                t = QuantTensor(unpermute_qk(t.blocks, heads).contiguous(), t.qtype, t.shape)
            else:
                t = unpermute_qk(t, heads).contiguous()
        tensors[ours] = t
    tok = tokenizer_from_metadata(reader, p)
    if tok is not None and tok.get_vocab_size() != cfg.vocab_size:
        raise GGUFError(f"{p}: {tok.get_vocab_size()} tokens but vocab_size {cfg.vocab_size}")
    ftype = field_value(reader, gguf.Keys.General.FILE_TYPE, p, required=False)
    return GGUFModel(str(p), cfg, tensors, tok, ftype)


def load_model(path: str | Path, backend: str = "auto") -> tuple[Transformer, object | None]:
    """(our Transformer with every tensor dequantized to float32, tokenizer) from a GGUF."""
    g = read_gguf(path)
    model = build_model(g.config, backend, seed=0)  # seeded: leaves the global RNG alone
    model.load_state_dict({k: dequantize(v) for k, v in g.tensors.items()}, strict=True)
    return model, g.tokenizer


def stored_mismatches(model: Transformer, path: str | Path, gtype: str) -> list[str]:
    """Our names whose tensor read back from `path` is not bit-identical to the source stored
    as `gtype` (f32: the source; f16: its fp16 rounding; q8_0: the contracted q8_0_quantize
    blocks; 1-D tensors always f32), plus "config" if the metadata gives another config."""
    g = read_gguf(path)
    bad = [] if g.config == model.cfg else ["config"]
    src = model.state_dict()
    for name in sorted(set(src) | set(g.tensors)):
        if name not in src or name not in g.tensors:
            bad.append(name)
            continue
        got = g.tensors[name]
        got = got.blocks if isinstance(got, QuantTensor) else got
        want = expected_stored(src[name], gtype)
        if got.dtype != want.dtype or not torch.equal(got, want):
            bad.append(name)
    return bad
