"""Export mutants: files that look right and load without complaint, but describe another model
(falsify/contracts/export-v1.yaml). Each has the signature of the exporter it replaces
(falsify/llm/hf.py's export_hf, falsify/llm/gguf_io/write.py's write_gguf) and writes through
it, so only the bug differs: a GGUF writer's bug is planted as the rows the writer is handed,
an HF exporter's as the config.json it leaves behind.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from falsify.llm.gguf_io import permute_qk, unpermute_qk, write_gguf
from falsify.llm.hf import export_hf


# ------------------------------------------------------------------------------------ GGUF
def _with_qk_rows(model, q_rows, k_rows):
    """A copy of `model` whose q_proj / k_proj weights are q_rows(w) / k_rows(w) of its own."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        for layer in m.layers:
            layer.self_attn.q_proj.weight.copy_(q_rows(layer.self_attn.q_proj.weight))
            layer.self_attn.k_proj.weight.copy_(k_rows(layer.self_attn.k_proj.weight))
    return m


def write_gguf_qk_unpermuted(model, path, tokenizer_path=None, gtype="f32", name="falsify"):
    """MUT: q/k rows written in our rotate-half order, not GGML's interleaved one (the writer
    forgot llama.cpp convert_hf_to_gguf's permute): llama.cpp ropes the wrong pairs. Planted by
    handing the correct writer rows it permutes back into our order."""
    cfg = model.cfg
    bad = _with_qk_rows(model, lambda w: unpermute_qk(w, cfg.num_heads),
                        lambda w: unpermute_qk(w, cfg.num_kv_heads))
    return write_gguf(bad, path, tokenizer_path, gtype, name)


def write_gguf_k_permuted_by_query_heads(model, path, tokenizer_path=None, gtype="f32",
                                         name="falsify"):
    """MUT: k rows permuted with the query head count instead of the kv head count (a GQA
    model converted as if it were multi-head): every kv head of D rows is split as two heads of
    D/2, so k's pairs are interleaved across the wrong halves."""
    cfg = model.cfg
    # the writer applies permute_qk(·, num_kv_heads) to what it is handed
    bad = _with_qk_rows(model, lambda w: w, lambda w: unpermute_qk(permute_qk(w, cfg.num_heads),
                                                                   cfg.num_kv_heads))
    return write_gguf(bad, path, tokenizer_path, gtype, name)


# -------------------------------------------------------------------------------------- HF
def _edit_config(out: Path, edit) -> Path:
    cfg_path = Path(out) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    edit(cfg)
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return Path(out)


def export_hf_without_rope_theta(model, out_dir, tokenizer_path=None, also=None):
    """MUT: config.json without rope_theta: transformers falls back to LLaMA's 10000, and every
    rotation angle but position 0's changes."""
    return _edit_config(export_hf(model, out_dir, tokenizer_path, also),
                        lambda c: c.pop("rope_theta"))


def export_hf_untied_head(model, out_dir, tokenizer_path=None, also=None):
    """MUT: tie_word_embeddings false with no lm_head.weight in the file (the tied head
    mishandled): transformers gives the model a freshly initialised output layer."""
    return _edit_config(export_hf(model, out_dir, tokenizer_path, also),
                        lambda c: c.update(tie_word_embeddings=False))
