"""Export to / import from the Hugging Face LLaMA layout (config.json + model.safetensors).

Our parameter names are HF's without the "model." prefix and weights are stored [out, in] like
HF, so the conversion is a rename. RoPE: HF LLaMA applies rotate-half (pairs (i, i + D/2)) to q
and k as produced by q_proj/k_proj — the same convention as falsify/llm/ops.py (and
falsify/kernels/torch/rope.py), so no
permutation of q_proj/k_proj rows is needed. (Meta's original checkpoints rotate interleaved pairs
(2i, 2i+1); HF's conversion script permutes q/k rows to turn that into rotate-half. A model
trained with interleaved RoPE would need that permutation here; ours does not, and
tests/test_hf.py checks logits against transformers to prove it.)

The LM head is tied: model.safetensors holds model.embed_tokens.weight only and config.json says
tie_word_embeddings=true; an lm_head.weight that differs from the embedding is refused on import.

With a tokenizer, the directory is what `AutoTokenizer.from_pretrained` reads as well:
tokenizer.json, tokenizer_config.json and special_tokens_map.json. Our tokenizer has one
document separator, <|endoftext|>, and no BOS or padding token of its own, so it serves as all
three (the GPT-2 convention); the FIM sentinels are additional special tokens. Nothing is added
around a text on encoding (add_bos/eos false), so `AutoTokenizer` gives exactly our ids.
generation_config.json names the same eos and pad ids for `generate`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from falsify.llm import data as data_mod
from falsify.llm.checkpoint import atomic_dir, save_file
from falsify.llm.model import ModelConfig, Transformer, build_model

HF_PREFIX = "model."


def hf_config(cfg: ModelConfig, eos_token_id: int | None = 0,
              bos_token_id: int | None = 0) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "initializer_range": cfg.init_std,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }


def to_hf_state(model: Transformer) -> dict[str, torch.Tensor]:
    return {HF_PREFIX + k: v.detach().to("cpu", torch.float32).contiguous()
            for k, v in model.state_dict().items()}


def special_tokens(tokenizer_path: str | Path) -> dict:
    """The special-token fields of tokenizer_config.json / special_tokens_map.json for a
    tokenizer.json: <|endoftext|> as bos, eos and pad where the vocabulary has it (a user's
    tokenizer without it gets none named, rather than a wrong one), and every other special
    token the tokenizer declares as additional."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    declared = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
    out: dict = {}
    if tok.token_to_id(data_mod.EOS) is not None:
        out = {"bos_token": data_mod.EOS, "eos_token": data_mod.EOS, "pad_token": data_mod.EOS}
    out["additional_special_tokens"] = [t for t in declared if t != data_mod.EOS]
    return out


def eos_id(tokenizer_path: str | Path | None) -> int | None:
    if tokenizer_path is None:
        return 0  # our tokenizers put <|endoftext|> at id 0 (falsify/llm/data.py)
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_path)).token_to_id(data_mod.EOS)


def write_tokenizer_files(dst: Path, tokenizer_path: str | Path, max_len: int) -> None:
    """tokenizer.json plus the two files `AutoTokenizer` needs to know the special tokens."""
    shutil.copyfile(tokenizer_path, dst / "tokenizer.json")
    special = special_tokens(tokenizer_path)
    (dst / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
        "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, **special}, indent=1))


def export_hf(model: Transformer, out_dir: str | Path, tokenizer_path: str | Path | None = None,
              also=None) -> Path:
    """Write an HF-loadable directory atomically (temp dir, then rename into place): weights,
    config.json, generation_config.json and, given a tokenizer, the tokenizer files; `also(tmp)`
    adds files of the caller's into the same temporary directory, so they appear together."""
    eos = eos_id(tokenizer_path)

    def fill(tmp: Path):
        save_file(to_hf_state(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf_config(model.cfg, eos, eos), indent=1))
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}, indent=1))
        if tokenizer_path is not None:
            write_tokenizer_files(tmp, tokenizer_path, model.cfg.max_seq_len)
        if also is not None:
            also(tmp)

    return atomic_dir(out_dir, fill)


def config_from_hf(hf: dict) -> ModelConfig:
    if hf.get("model_type") != "llama":
        raise ValueError(f"model_type={hf.get('model_type')!r}: only 'llama' is supported")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                      ("rope_scaling", None)):
        if hf.get(key, want) != want:
            raise ValueError(f"HF config {key}={hf[key]!r} is not supported (need {want!r})")
    cfg = ModelConfig(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                      num_layers=hf["num_hidden_layers"], num_heads=hf["num_attention_heads"],
                      num_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
                      intermediate_size=hf["intermediate_size"],
                      max_seq_len=hf["max_position_embeddings"],
                      rope_theta=float(hf.get("rope_theta", 10000.0)),
                      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                      init_std=float(hf.get("initializer_range", 0.02)))
    if hf.get("head_dim", cfg.head_dim) != cfg.head_dim:
        raise ValueError(f"HF head_dim={hf['head_dim']} != hidden_size/num_heads={cfg.head_dim}")
    return cfg


def import_hf(path: str | Path, backend: str = "auto") -> Transformer:
    """Load an HF LLaMA directory (tied embeddings) into our model; strict on names/shapes."""
    path = Path(path)
    cfg = config_from_hf(json.loads((path / "config.json").read_text()))
    tensors = load_file(str(path / "model.safetensors"))
    lm_head = tensors.pop("lm_head.weight", None)
    emb = tensors.get(HF_PREFIX + "embed_tokens.weight")
    if lm_head is not None and (emb is None or not torch.equal(lm_head, emb)):
        raise ValueError("lm_head.weight differs from model.embed_tokens.weight: this model "
                         "uses tied embeddings and cannot represent an untied head")
    state = {}
    for k, v in tensors.items():
        if not k.startswith(HF_PREFIX):
            raise ValueError(f"unexpected tensor {k!r} in {path}")
        state[k[len(HF_PREFIX):]] = v.float()
    model = build_model(cfg, backend)
    model.load_state_dict(state, strict=True)
    return model
