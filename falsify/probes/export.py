"""Run functions for falsify/contracts/export-v1.yaml: the HF and GGUF exports that `falsify
export` writes (falsify/llm/hf.py, falsify/llm/gguf_io/write.py), read back by someone else.

Every run exports one small trained model (2 layers, hidden 64, 4 query heads over 2 kv heads,
vocab 256, init std 0.2, then two AdamW steps, so no tensor is at its initial value and the norm
gains are not ones) with the exporter the contract binds, looked up at call time (`_bound`), so
when `falsify mutants` swaps a binding the file under test is the mutant's. Each then compares
against something the exporter did not compute: transformers' LlamaForCausalLM on the HF
directory, our own importer, the model loaded from the GGUF through the gguf package's reader,
and llama.cpp's graph (interleaved RoPE) on the tensors as that reader returns them, in float64
(falsify/reference/export.py).

The configuration differs from every default a reader could fall back on (rope_theta 500000,
not 10000; rms_norm_eps 1e-5, not transformers' 1e-6), so a value the export leaves out is a
value the reader gets wrong.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

CONTRACT = "export-v1"
U32 = 2.0**-24  # fp32 unit roundoff
CFG = dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
           intermediate_size=160, max_seq_len=32, rope_theta=500000.0, rms_norm_eps=1e-5,
           init_std=0.2)
TOKENS = 16  # per sequence, two sequences
GROWTH = 4  # model-parity-v1's per-layer error gain bound G (PAR-GROW-001)


def _bound(equation: str, backend: str):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract(CONTRACT), equation, backend)


_TRAINED: dict = {}


def trained_model(seed: int = 0, steps: int = 2):
    """The tiny model after `steps` AdamW steps (lr 1e-2, weight decay 0.1) of next-token
    cross-entropy on seeded random tokens. Memoised per (seed, steps); callers get a copy."""
    import copy

    import torch

    from falsify.llm.model import ModelConfig, build_model

    key = (seed, steps)
    if key not in _TRAINED:
        cfg = ModelConfig(**CFG)
        m = build_model(cfg, "torch", seed=seed)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
        g = torch.Generator().manual_seed(seed + 1)
        for _ in range(steps):
            ids = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len + 1), generator=g)
            total, n = m.loss_sum(ids[:, :-1], ids[:, 1:])
            opt.zero_grad()
            (total / n).backward()
            opt.step()
        _TRAINED[key] = m.eval()
    return copy.deepcopy(_TRAINED[key])


def _ids(seed: int):
    import torch

    return torch.randint(0, CFG["vocab_size"], (2, TOKENS),
                         generator=torch.Generator().manual_seed(seed + 2))


def rho(tokens: int = TOKENS) -> float:
    """ρ: the normwise relative error of one fp32 forward's logits against exact arithmetic,
    as model-parity-v1 derives it (FALSIFY-PAR-001): β per layer (falsify/llm/parity.py's
    layer_budget), each layer passing inherited error on with gain ≤ G, the final norm and head
    adding one more β: ρ = β·(Σ_{j<L} G^j + 1)."""
    from falsify.llm import parity as P
    from falsify.llm.model import ModelConfig

    cfg = ModelConfig(**CFG)
    beta = P.layer_budget(cfg, tokens)
    return beta * ((GROWTH ** cfg.num_layers - 1) / (GROWTH - 1) + 1)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# ------------------------------------------------------------------------------------- HF
def transformers_logits(path: Path, ids):
    import logging
    import warnings

    import torch

    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers import LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = LlamaForCausalLM.from_pretrained(str(path), local_files_only=True,
                                             torch_dtype=torch.float32,
                                             attn_implementation="eager").eval()
    with torch.no_grad():
        return m(ids).logits


def hf_export_run(backend: str = "torch", dtype: str = "float32", seed: int = 0) -> dict:
    """EXP-HF-001 and EXP-HF-002. Export the trained model with the bound HF exporter; load
    the directory in transformers (LlamaForCausalLM, fp32, eager attention) and with our
    importer (falsify/llm/hf.py's import_hf). Returns the normwise relative logit difference
    against transformers, the bound 2ρ/(1 − ρ), and whether our importer gave back every
    tensor bit for bit and the same config."""
    import torch

    from falsify.llm import hf

    if dtype != "float32":
        raise ValueError(f"dtype={dtype!r}: the export probe runs float32 only")
    model, ids = trained_model(seed), _ids(seed)
    with torch.no_grad():
        ours = model(ids).double().numpy()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hf"
        _bound("hf_export", backend)(model, out)
        theirs = transformers_logits(out, ids).double().numpy()
        back = hf.import_hf(out, "torch")
    src, got = model.state_dict(), back.state_dict()
    bitwise = set(src) == set(got) and all(torch.equal(src[k], got[k]) for k in src)
    r = rho()
    return {"rel": _rel(ours, theirs), "rho": r, "bound": 2 * r / (1 - r),
            "logit_rms": float(np.sqrt((ours ** 2).mean())),
            "import_bitwise": bitwise, "import_config": back.cfg == model.cfg}


# ----------------------------------------------------------------------------------- GGUF
def stored_the_same_way(model, gtype: str):
    """A copy of `model` whose 2-D weights hold what a GGUF of `gtype` stores: themselves
    (f32), their fp16 rounding (f16), the contracted q8_0 quantize → dequantize (q8_0); norms
    are written f32 in every case."""
    import copy

    import torch

    from falsify.kernels.torch import gguf_quants as GQ

    m = copy.deepcopy(model)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2 and gtype == "f16":
                p.copy_(p.half().float())
            elif p.dim() == 2 and gtype == "q8_0":
                p.copy_(GQ.q8_0_dequantize(GQ.q8_0_quantize(p)))
    return m


def gguf_roundtrip_run(backend: str = "torch", dtype: str = "float32", gtype: str = "f32",
                       seed: int = 0) -> dict:
    """EXP-GGUF-001. Write the trained model with the bound GGUF writer as `gtype`, load it
    back through the gguf package's GGUFReader (falsify/llm/gguf_io's load_model: q/k rows
    un-permuted, blocks dequantized by the contracted dequantizers). The loaded model holds
    exactly the source's values after the storage rounding and runs the same fp32 program, so
    its logits must equal, bit for bit, those of the source with its weights stored the same
    way; `rounding_visible` says the storage rounding moved the logits at all (f16, q8_0), so
    that comparison is not between identical models by accident."""
    import torch

    from falsify.llm import gguf_io

    if dtype != "float32":
        raise ValueError(f"dtype={dtype!r}: the export probe runs float32 only")
    model, ids = trained_model(seed), _ids(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        _bound("gguf_export", backend)(model, path, None, gtype)
        back, _ = gguf_io.load_model(path, "torch")
    with torch.no_grad():
        got = back.eval()(ids)
        want = stored_the_same_way(model, gtype)(ids)
        plain = model(ids)
    diff = float((got - want).abs().max())
    # init_std is how a model was initialised, not part of it: GGUF has no key for it
    same_cfg = dataclasses.replace(back.cfg, init_std=model.cfg.init_std) == model.cfg
    return {"gtype": gtype, "config_equal": same_cfg,
            "bit_identical": bool(torch.equal(got, want)), "max_abs_diff": diff,
            "rounding_visible": gtype == "f32" or not bool(torch.equal(want, plain))}


def gguf_llama_cpp_run(backend: str = "torch", dtype: str = "float32", seed: int = 0) -> dict:
    """EXP-GGUF-002. Write the trained model (f32, the default) with the bound GGUF writer,
    read the tensors and the config keys back with gguf.GGUFReader alone, and run llama.cpp's
    graph on them in float64 (GGML's interleaved RoPE, falsify/reference/export.py). Returns
    the normwise relative difference from our fp32 logits and the bound ρ/(1 − ρ)."""
    import torch

    from falsify.llm.gguf_io.read import open_reader
    from falsify.reference.export import ggml_llama_logits

    if dtype != "float32":
        raise ValueError(f"dtype={dtype!r}: the export probe runs float32 only")
    model, ids = trained_model(seed), _ids(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        _bound("gguf_export", backend)(model, path, None, "f32")
        reader = open_reader(path)  # gguf.GGUFReader, with errors that name the file
        cfg = _FileConfig({f.name: f.contents() for f in reader.fields.values()})
        w = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}
    with torch.no_grad():
        ours = model(ids).double().numpy()
    theirs = np.stack([ggml_llama_logits(w, cfg, row) for row in ids.numpy()])
    r = rho()
    return {"rel": _rel(ours, theirs), "rho": r, "bound": r / (1 - r),
            "logit_rms": float(np.sqrt((ours ** 2).mean()))}


class _FileConfig:
    """The hyperparameters llama.cpp's graph reads, from the file's own metadata keys."""

    def __init__(self, meta: dict):
        self.num_layers = int(meta["llama.block_count"])
        self.num_heads = int(meta["llama.attention.head_count"])
        self.num_kv_heads = int(meta["llama.attention.head_count_kv"])
        self.head_dim = int(meta["llama.embedding_length"]) // self.num_heads
        self.rms_norm_eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.rope_theta = float(meta.get("llama.rope.freq_base", 10000.0))  # llama.cpp's default

