"""Our model as a llama.cpp GGUF LLaMA model, and a GGUF LLaMA model back as ours.

The container is the `gguf` package's (GGUFWriter / GGUFReader); names come from its LLaMA
tensor map (`model.layers.0.self_attn.q_proj.weight` -> `blk.0.attn_q.weight`) and its key
constants (`llama.context_length`, `tokenizer.ggml.tokens`, ...).

RoPE layout. GGML's LLaMA graph rotates adjacent pairs (2i, 2i+1) of each head (rope mode 0,
LLAMA_ROPE_TYPE_NORM); our model, like HF LLaMA, rotates (i, i + D/2) (rotate-half). Within a
head, `permute_qk` moves row i + D/2·j of q_proj/k_proj to row 2i + j — exactly what llama.cpp's
convert_hf_to_gguf.py does to HF checkpoints — so interleaved RoPE on the permuted rows yields
our rotated vector with its components in that same order. q and k are permuted alike, so every
q·k score, hence the attention output, is unchanged; v and o are untouched. Reading inverts it.
tests/test_gguf_io.py checks both RoPE conventions on the file's own weights.

The LM head is tied: there is no `output.weight` (llama.cpp then uses `token_embd.weight`). A
file whose output.weight differs from token_embd.weight is refused on reading.

Tensor types: f32, f16, q8_0 on writing (q8_0 through the contracted `q8_0_quantize`); 1-D
tensors (the norms) always f32, as llama.cpp writes them. Reading keeps q8_0 / q4_k / q6_k
tensors as raw blocks (`QuantTensor`); `dequantize` goes through the contracted torch
dequantizers (impl/torch/gguf_quants.py).

The tokenizer is our byte-level BPE (`tokenizers`): `tokenizer.ggml.model = "gpt2"`, pre
`"gpt-2"` (the GPT-2 split regex, which our pre-tokenizer uses), tokens, token types (special
tokens CONTROL, others NORMAL), merges, and <|endoftext|> as bos/eos/pad with nothing added
around a text (add_bos/add_eos false), the same choices as the HF export (impl/llm/hf.py).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from falsify.impl.llm import data as data_mod
from falsify.impl.llm.model import ModelConfig, Transformer, build_model
from falsify.impl.torch import gguf_quants as GQ

ARCH = "llama"
WRITE_TYPES = ("f32", "f16", "q8_0")


class GGUFError(ValueError):
    """A GGUF file we cannot read or write as our model; the message names the file and the
    key or tensor."""


def _gguf():
    try:
        import gguf
    except ImportError as e:  # the `interop` extra
        raise GGUFError("the `gguf` package is needed for GGUF files: pip install "
                        "'falsify[interop]'") from e
    return gguf


# ----------------------------------------------------------------------------------- names
def _name_map(n_layers: int):
    gguf = _gguf()
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)


def gguf_name(ours: str, n_layers: int) -> str:
    """Our parameter name (HF's without "model.") -> llama.cpp's tensor name."""
    name = _name_map(n_layers).get_name("model." + ours, try_suffixes=(".weight",))
    if name is None:
        raise GGUFError(f"no llama.cpp tensor name for parameter {ours!r}")
    return name  # the matched suffix (".weight") is kept


def our_names(cfg: ModelConfig) -> dict[str, str]:
    """llama.cpp tensor name -> our parameter name, for every tensor of a model of `cfg`."""
    with torch.device("meta"):
        names = list(Transformer(cfg, backend="torch").state_dict())
    return {gguf_name(n, cfg.num_layers): n for n in names}


def _heads_of(ours: str, cfg: ModelConfig) -> int | None:
    """Heads whose rows RoPE rotates: q_proj -> num_heads, k_proj -> num_kv_heads, else None."""
    if ours.endswith("self_attn.q_proj.weight"):
        return cfg.num_heads
    if ours.endswith("self_attn.k_proj.weight"):
        return cfg.num_kv_heads
    return None


def permute_qk(w, n_head: int):
    """Rows of a q/k projection (or its LoRA B) from rotate-half to GGML's interleaved order:
    row h·D + j·D/2 + i -> h·D + 2i + j (llama.cpp convert_hf_to_gguf's permute). Works on any
    row-major [rows, ...] tensor or array, raw quant blocks included (rows stay whole)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def unpermute_qk(w, n_head: int):
    """Inverse of permute_qk."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


# ----------------------------------------------------------------------------- quantized
@dataclass
class QuantTensor:
    """A tensor kept in a GGUF block format: `blocks` uint8 [rows, row_bytes] (each row whole
    blocks), `qtype` "q8_0" | "q4_k" | "q6_k", `shape` the logical (rows, cols)."""
    blocks: torch.Tensor
    qtype: str
    shape: tuple[int, int]


DEQUANT = {"q8_0": GQ.q8_0_dequantize, "q4_k": GQ.q4_k_dequantize, "q6_k": GQ.q6_k_dequantize}


def dequantize(t) -> torch.Tensor:
    """float32 values of a QuantTensor (contracted dequantizers), or of a plain tensor."""
    if isinstance(t, QuantTensor):
        out = DEQUANT[t.qtype](t.blocks)
        if tuple(out.shape) != tuple(t.shape):
            raise GGUFError(f"{t.qtype} blocks decode to {tuple(out.shape)}, expected {t.shape}")
        return out
    return t.float()


def quant_linear(x: torch.Tensor, blocks: torch.Tensor, qtype: str,
                 shape: tuple[int, int]) -> torch.Tensor:
    """y = x·dequant(W)ᵀ for a frozen GGUF-quantized weight: the contracted dequantizer, then
    F.linear. The one place a quantized GGUF projection is applied, so a fused
    dequantize-matmul kernel can replace this function alone. No gradient reaches W (uint8
    blocks); x's gradient flows through F.linear."""
    w = dequantize(QuantTensor(blocks, qtype, shape))
    return torch.nn.functional.linear(x, w.to(x.dtype))


def encode(w: torch.Tensor, gtype: str, name: str = "tensor"):
    """A float32 tensor as stored for `gtype` (1-D tensors always f32): (numpy array,
    GGMLQuantizationType or None for plain float arrays)."""
    gguf = _gguf()
    w = w.detach().to("cpu", torch.float32).contiguous()
    if w.dim() == 1 or gtype == "f32":
        return w.numpy(), None
    if gtype == "f16":
        return w.to(torch.float16).numpy(), None
    if gtype == "q8_0":
        if w.dim() != 2 or w.shape[1] % 32:
            raise GGUFError(f"tensor {name}: shape {tuple(w.shape)} has rows that are not whole "
                            "32-value q8_0 blocks; use --gguf-type f16 or f32")
        return GQ.q8_0_quantize(w).numpy(), gguf.GGMLQuantizationType.Q8_0
    raise GGUFError(f"GGUF tensor type {gtype!r} is not one we write (known: "
                    f"{', '.join(WRITE_TYPES)})")


def expected_stored(w: torch.Tensor, gtype: str) -> torch.Tensor:
    """What reading back a tensor written as `gtype` must give, bit for bit: the source for f32
    and 1-D tensors, its fp16 rounding for f16, the q8_0 blocks for q8_0."""
    arr, _ = encode(w, gtype)
    return torch.from_numpy(np.ascontiguousarray(arr))


# ---------------------------------------------------------------------------------- writing
def _tokenizer_metadata(writer, tokenizer_path, vocab_size: int, src: str) -> None:
    gguf = _gguf()
    if tokenizer_path is None:
        # llama.cpp's vocab-less mode: weights usable with token ids only
        writer.add_tokenizer_model("none")
        return
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    spec = json.loads(tok.to_str())
    model = spec.get("model", {})
    if model.get("type") != "BPE":
        raise GGUFError(f"{tokenizer_path}: model.type={model.get('type')!r}: only byte-level BPE "
                        "tokenizers are written to GGUF")
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) \
            or pre.get("add_prefix_space"):
        raise GGUFError(f"{tokenizer_path}: pre_tokenizer {pre.get('type')!r} is not the GPT-2 "
                        "byte-level split (ByteLevel, use_regex, no prefix space) that GGUF's "
                        "'gpt-2' pre-tokenizer means")
    vocab = tok.get_vocab(with_added_tokens=True)
    if len(vocab) != vocab_size or sorted(vocab.values()) != list(range(vocab_size)):
        raise GGUFError(f"{tokenizer_path}: {len(vocab)} tokens with ids not exactly "
                        f"0..{vocab_size - 1}, the model's vocab_size ({src})")
    tokens = [None] * vocab_size
    for t, i in vocab.items():
        tokens[i] = t
    special = {i for i, a in tok.get_added_tokens_decoder().items() if a.special}
    user = {i for i, a in tok.get_added_tokens_decoder().items() if not a.special}
    types = [gguf.TokenType.CONTROL if i in special else
             gguf.TokenType.USER_DEFINED if i in user else gguf.TokenType.NORMAL
             for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    eos = tok.token_to_id(data_mod.EOS)
    if eos is not None:
        writer.add_bos_token_id(eos)
        writer.add_eos_token_id(eos)
        writer.add_pad_token_id(eos)
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)
    K = gguf.Keys.Tokenizer
    for key, t in ((K.FIM_PRE_ID, data_mod.FIM_PREFIX), (K.FIM_SUF_ID, data_mod.FIM_SUFFIX),
                   (K.FIM_MID_ID, data_mod.FIM_MIDDLE)):
        if tok.token_to_id(t) is not None:
            writer.add_uint32(key, tok.token_to_id(t))


FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}


def gguf_tensors(model: Transformer, gtype: str) -> dict[str, tuple]:
    """llama.cpp name -> (array, raw type or None) for every parameter, q/k permuted."""
    cfg = model.cfg
    out = {}
    for ours, w in model.state_dict().items():
        name = gguf_name(ours, cfg.num_layers)
        arr, raw = encode(w, gtype, name)
        heads = _heads_of(ours, cfg)
        if heads is not None:
            arr = np.ascontiguousarray(permute_qk(arr, heads))
        out[name] = (arr, raw)
    return out


def _atomic_write(path: Path, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _write(writer_args, path: Path, fill) -> Path:
    gguf = _gguf()

    def write(tmp: Path):
        w = gguf.GGUFWriter(tmp, ARCH, **writer_args)
        fill(w)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    return _atomic_write(path, write)


def write_gguf(model: Transformer, path: str | Path, tokenizer_path: str | Path | None = None,
               gtype: str = "f32", name: str = "falsify") -> Path:
    """Write `model` (and its tokenizer) as a llama.cpp LLaMA GGUF at `path`, atomically."""
    gguf = _gguf()
    if gtype not in WRITE_TYPES:
        raise GGUFError(f"GGUF tensor type {gtype!r} unknown (known: {', '.join(WRITE_TYPES)})")
    cfg = model.cfg
    tensors = gguf_tensors(model, gtype)

    def fill(w):
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(name)
        w.add_context_length(cfg.max_seq_len)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_heads)
        w.add_head_count_kv(cfg.num_kv_heads)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_rope_freq_base(float(cfg.rope_theta))
        w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
        w.add_vocab_size(cfg.vocab_size)
        w.add_file_type(int(getattr(gguf.LlamaFileType, FILE_TYPES[gtype])))
        if gtype == "q8_0":
            w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _tokenizer_metadata(w, tokenizer_path, cfg.vocab_size, str(path))
        for n, (arr, raw) in tensors.items():
            w.add_tensor(n, arr, raw_dtype=raw)

    return _write({}, Path(path), fill)


# ---------------------------------------------------------------------------------- reading
QUANT_NAMES = {"Q8_0": "q8_0", "Q4_K": "q4_k", "Q6_K": "q6_k"}


@dataclass
class GGUFModel:
    path: str
    config: ModelConfig
    tensors: dict  # our name -> torch tensor (f32/f16/bf16) or QuantTensor; q/k un-permuted
    tokenizer: object | None  # tokenizers.Tokenizer, None for a vocab-less file
    file_type: int | None = None
    metadata: dict = field(default_factory=dict)


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
    model = build_model(g.config, backend)
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


# ---------------------------------------------------------------------------- LoRA adapter
ADAPTER_FILE = "adapter.gguf"


def lora_tensors(model) -> tuple[dict[str, np.ndarray], float]:
    """llama.cpp's adapter tensors for an adapted model, as convert_lora_to_gguf.py names and
    shapes them: `blk.N.attn_q.weight.lora_a` = A [r, in], `.lora_b` = B [out, r] (ggml dims
    reversed), B's rows permuted like the base's q/k rows (the delta B·A is a q/k weight), and
    the alpha llama.cpp needs to apply our scale as alpha / r (rsLoRA's α/√r: alpha = α·√r)."""
    from falsify.impl.llm import lora_model as LM

    cfg = model.cfg
    out, alphas = {}, set()
    for name, mod in LM.adapted_layers(model):
        if not mod.has_adapter:
            continue
        if mod.weight_mask is not None:
            raise GGUFError(f"{name}: a masked adapter (keep_masks) is not a LoRA adapter "
                            "llama.cpp can apply (M ⊙ (s·B·A) is not low rank)")
        base = gguf_name(name + ".weight", cfg.num_layers)
        a = mod.lora_A.weight.detach().to("cpu", torch.float32).contiguous().numpy()
        b = mod.lora_B.weight.detach().to("cpu", torch.float32).contiguous().numpy()
        heads = _heads_of(name + ".weight", cfg)
        if heads is not None:
            b = np.ascontiguousarray(permute_qk(b, heads))
        out[base + ".lora_a"], out[base + ".lora_b"] = a, b
        alphas.add(mod.alpha * math.sqrt(mod.r) if mod.rslora else mod.alpha)
    if not out:
        raise GGUFError("the model carries no LoRA adapter")
    if len(alphas) != 1:  # one adapter.lora.alpha per file
        raise GGUFError(f"the adapters' scales differ ({sorted(alphas)}): one GGUF alpha "
                        "cannot express them")
    return out, alphas.pop()


def write_lora_gguf(model, path: str | Path, name: str = "falsify-lora") -> Path:
    """Our LoRA adapters as a llama.cpp LoRA adapter GGUF (`llama-cli -m base.gguf --lora
    FILE`), f32, written atomically. The base is the GGUF export of the same base model."""
    gguf = _gguf()
    tensors, alpha = lora_tensors(model)

    def fill(w):
        w.add_type(gguf.GGUFType.ADAPTER)
        w.add_string(gguf.Keys.Adapter.TYPE, "lora")
        w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        w.add_name(name)
        w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
        for n, arr in tensors.items():
            w.add_tensor(n, arr)

    return _write({}, Path(path), fill)


def read_lora_gguf(path: str | Path) -> tuple[dict[str, torch.Tensor], float]:
    """(llama.cpp-named float32 tensors as stored, adapter.lora.alpha) of a LoRA adapter GGUF;
    checks the adapter keys and that every lora_a has its lora_b."""
    gguf = _gguf()
    p = Path(path)
    r = open_reader(p)
    for key, want in ((gguf.Keys.General.ARCHITECTURE, ARCH),
                      (gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER),
                      (gguf.Keys.Adapter.TYPE, "lora")):
        got = field_value(r, key, p)
        if got != want:
            raise GGUFError(f"{p}: {key}={got!r}, expected {want!r}")
    alpha = float(field_value(r, gguf.Keys.Adapter.LORA_ALPHA, p))
    tensors = {t.name: _tensor(t, p) for t in r.tensors}
    for n in tensors:
        if not n.endswith((".lora_a", ".lora_b")):
            raise GGUFError(f"{p}: tensor {n} is not a .lora_a / .lora_b tensor")
        twin = n[:-1] + ("b" if n.endswith("a") else "a")
        if twin not in tensors:
            raise GGUFError(f"{p}: tensor {twin} is missing (its pair {n} is present)")
    return {k: dequantize(v) for k, v in tensors.items()}, alpha


# ------------------------------------------------------------------------ a fine-tuning base
def tokenizer_file(tok) -> Path:
    """The rebuilt tokenizer as a tokenizer.json the rest of falsify reads (the HF/PEFT exports
    copy it): content-addressed under the temporary directory, written atomically, so the same
    GGUF always yields the same path."""
    import hashlib

    text = tok.to_str()
    d = Path(tempfile.gettempdir()) / "falsify-gguf-tokenizers"
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"
    if not f.is_file():
        _atomic_write(f, lambda tmp: tmp.write_text(text))
    return f


def base_model(path: str | Path, backend: str = "auto") -> tuple[Transformer, object | None]:
    """(model, tokenizer) for fine-tuning on a GGUF: our Transformer with every tensor as float32
    values (embedding and norms stay so, frozen), and `model.gguf_quant` naming the projection
    weights stored quantized in the file (their raw blocks), which lora_model.apply_lora keeps
    quantized instead of the float32 copy."""
    g = read_gguf(path)
    model = build_model(g.config, backend)
    model.load_state_dict({k: dequantize(v) for k, v in g.tensors.items()}, strict=True)
    model.gguf_quant = {k: v for k, v in g.tensors.items()
                        if isinstance(v, QuantTensor) and k.endswith("_proj.weight")}
    return model, g.tokenizer
