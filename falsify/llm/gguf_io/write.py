"""Writing our model as a llama.cpp LLaMA GGUF."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from falsify.harness.files import atomic_path
from falsify.llm import data as data_mod
from falsify.llm.gguf_io.common import (
    ARCH,
    WRITE_TYPES,
    GGUFError,
    _gguf,
    _heads_of,
    encode,
    gguf_name,
    permute_qk,
)
from falsify.llm.model import Transformer


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


class _FinalName(logging.Filter):
    """The gguf writer logs the name of the file it opens ("PATH: n_tensors = ..."), which is
    our temp file: its records name the file being written instead, the one the user asked
    for and the only one that exists once the write is done."""

    def __init__(self, tmp: Path, final: Path):
        super().__init__()
        self.tmp, self.final = str(tmp), str(final)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.tmp in message:
            record.msg, record.args = message.replace(self.tmp, self.final), None
        return True


def _write(writer_args, path: Path, fill) -> Path:
    gguf = _gguf()
    writer_log = logging.getLogger(gguf.GGUFWriter.__module__)

    def write(tmp: Path):
        rename = _FinalName(tmp, path)
        writer_log.addFilter(rename)
        try:
            w = gguf.GGUFWriter(tmp, ARCH, **writer_args)
            fill(w)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
        finally:
            writer_log.removeFilter(rename)

    path = Path(path)
    with atomic_path(path) as tmp:
        write(tmp)
    return path


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
