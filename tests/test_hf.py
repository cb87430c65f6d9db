"""HF LLaMA round trip: export, load with transformers.LlamaForCausalLM (offline, local dir),
logits equal ours within a derived fp32 tolerance; import back bit-exactly; a wrong RoPE pairing
(Meta's interleaved layout without HF's q/k permutation) is caught by the same tolerance."""

import json

import pytest
import torch

from falsify.llm.hf import export_hf, import_hf
from falsify.llm.model import ModelConfig, build_model
from falsify.probes.export import transformers_logits

transformers = pytest.importorskip("transformers")

CFG = ModelConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  intermediate_size=192, max_seq_len=32, rope_theta=500000.0, rms_norm_eps=1e-6)
U32 = 2.0**-24  # fp32 unit roundoff


def _model():
    """Weights far from init (std 0.15, norm gains in [0.5, 1.5]) so that every convention error
    moves the logits by O(1), not by O(init_std)."""
    m = build_model(CFG, "torch", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
    return m.eval()


def _tolerance(logits: torch.Tensor) -> float:
    """Both sides are fp32 with different op orders (fused vs separate projections, SDPA vs
    eager softmax, RoPE tables computed differently). Each of the 2·L + 1 residual/norm stages
    sees GEMMs with reductions ≤ K = 192, typical error √K·u relative; 8 such GEMM/softmax
    stages per layer: tol = 8 · (2L + 1) · √K · u · max|logits|."""
    k = max(CFG.hidden_size, CFG.intermediate_size)
    return 8 * (2 * CFG.num_layers + 1) * k ** 0.5 * U32 * float(logits.abs().max())


def test_export_matches_transformers(tmp_path):
    m = _model()
    out = export_hf(m, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tie_word_embeddings"] and cfg["num_key_value_heads"] == 2
    ids = torch.randint(0, CFG.vocab_size, (2, CFG.max_seq_len),
                        generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = m(ids)
    theirs = transformers_logits(out, ids)
    tol = _tolerance(ours)
    assert float((ours - theirs).abs().max()) <= tol
    assert float(ours.abs().max()) > 1.0  # the comparison is not between near-zero logits


def test_import_is_bit_exact(tmp_path):
    m = _model()
    export_hf(m, tmp_path / "hf")
    back = import_hf(tmp_path / "hf", backend="torch")
    a, b = m.state_dict(), back.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert back.cfg == CFG


def test_wrong_rope_pairing_is_caught(tmp_path):
    """Permute q/k rows within each head from rotate-half to interleaved order (what converting
    a Meta checkpoint without HF's permutation amounts to): logits must leave the tolerance."""
    m = _model()
    ids = torch.randint(0, CFG.vocab_size, (2, CFG.max_seq_len),
                        generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours = m(ids)
    d = CFG.head_dim
    perm = torch.arange(d).view(2, d // 2).t().reshape(-1)  # 0, d/2, 1, d/2+1, ...
    bad = _model()
    with torch.no_grad():
        for layer in bad.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                w = proj.weight.view(-1, d, CFG.hidden_size)
                proj.weight.copy_(w[:, perm].reshape(-1, CFG.hidden_size))
    export_hf(bad, tmp_path / "bad")
    theirs = transformers_logits(tmp_path / "bad", ids)
    assert float((ours - theirs).abs().max()) > 100 * _tolerance(ours)


def test_untied_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    m = _model()
    out = export_hf(m, tmp_path / "hf")
    t = load_file(str(out / "model.safetensors"))
    t["lm_head.weight"] = t["model.embed_tokens.weight"] + 1.0
    save_file(t, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="tied"):
        import_hf(out, backend="torch")
