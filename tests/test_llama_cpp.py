"""llama.cpp itself loads our GGUF export and our GGUF LoRA adapter, and computes our logits.

Runs where llama-cpp-python is installed (`FALSIFY_LLAMA_CPP=1 bash scripts/install.sh`
builds it from source: about 7 CPU-minutes, cached by pip afterwards). CI's clean machine does
not build it, to keep CI within its time budget; there, tests/test_gguf_io.py checks the same
files against llama.cpp's LLaMA graph re-implemented in numpy, and this module reports itself
skipped with the reason.

Both sides are fp32 here, so the tolerance is test_gguf_io's fp32 accumulation-order bound.
llama.cpp's KV cache is f16 by default, which rounds K and V (an error of ~1e-3 relative, far
above that bound), so the context is made with an f32 cache: that is the configuration in which
the two computations are the same math.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from falsify.llm import gguf_io as G
from falsify.llm import lora_model as LM
from falsify.llm.gguf_io import lora as GL
from tests.fixtures.gguf import tiny
from tests.test_gguf_io import _tolerance

llama_cpp = pytest.importorskip(
    "llama_cpp", reason="llama-cpp-python is not installed (FALSIFY_LLAMA_CPP=1 bash "
                        "scripts/install.sh builds it)")

GGML_TYPE_F32 = 0
TEXT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama-cpp")
    tok = tiny.tokenizer()
    tok_path = d / "tokenizer.json"
    tok.save(str(tok_path))
    ids = tok.encode(TEXT).ids
    base = tiny.model(tok.get_vocab_size())
    adapted = LM.apply_lora(tiny.model(tok.get_vocab_size()),
                            LM.LoraSpec(method="lora", r=4, alpha=8.0, rslora=False,
                                        targets=("q", "k", "v", "o", "gate", "up", "down")))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _, p in LM.adapter_parameters(adapted).items():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    adapted.eval()
    return dict(ids=ids, base=base, adapted=adapted,
                gguf=G.write_gguf(base, d / "base-f32.gguf", tok_path, "f32"),
                adapter=GL.write_lora_gguf(adapted, d / "adapter.gguf"), tok=tok)


def _ours(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids]))[0].double().numpy()


def _llama_cpp(path, ids, lora=None) -> np.ndarray:
    kw = dict(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, verbose=False,
              n_threads=1, type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    if lora is not None:
        kw["lora_path"] = str(lora)
    llm = llama_cpp.Llama(**kw)
    llm.eval(ids)
    return np.asarray(llm.scores[:len(ids)], dtype=np.float64)


def test_llama_cpp_tokenizes_like_ours(files):
    llm = llama_cpp.Llama(model_path=str(files["gguf"]), n_ctx=64, verbose=False,
                          vocab_only=True)
    assert llm.tokenize(TEXT.encode(), add_bos=False, special=False) == files["ids"]


def test_llama_cpp_computes_our_logits_from_our_export(files):
    ids = files["ids"]
    ours, theirs = _ours(files["base"], ids), _llama_cpp(files["gguf"], ids)
    assert len(ids) > 10 and float(np.abs(ours).max()) > 1.0
    assert float(np.abs(ours - theirs).max()) <= _tolerance(ours)


def test_llama_cpp_applies_our_adapter_as_we_do(files):
    ids = files["ids"]
    ours = _ours(files["adapted"], ids)
    theirs = _llama_cpp(files["gguf"], ids, lora=files["adapter"])
    tol = _tolerance(ours)
    assert float(np.abs(ours - theirs).max()) <= tol
    # the adapter matters at this tolerance: without it llama.cpp computes another model
    assert float(np.abs(ours - _llama_cpp(files["gguf"], ids)).max()) > 100 * tol
