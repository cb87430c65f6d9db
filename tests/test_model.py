"""The model: exact parameter counts, architecture checks, causality, gradient flow, GQA, backend
selection (no silent fallback) and the kernels actually wired in."""

import importlib.util
import logging

import pytest
import torch

from falsify.llm import ops as ops_mod
from falsify.llm.model import (
    PRESETS,
    ModelConfig,
    ModelConfigError,
    build_model,
    generate,
    loss_sum,
    meta_param_count,
    param_count,
    param_tensor_count,
    preset,
)

SMALL = ModelConfig(vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                    intermediate_size=48, max_seq_len=16)


def test_350m_parameter_count_is_exact():
    cfg = PRESETS["350m"]
    assert param_count(cfg) == 398_509_056
    # the real module, built on the meta device (no memory): the formula counts what exists
    assert meta_param_count(cfg) == (398_509_056, 218)
    assert param_tensor_count(cfg) == 218


@pytest.mark.parametrize("name", ["tiny", "50m"])
def test_preset_counts_match_module(name):
    cfg = PRESETS[name]
    assert meta_param_count(cfg) == (param_count(cfg), param_tensor_count(cfg))


def test_50m_has_110_tensors():
    assert param_tensor_count(PRESETS["50m"]) == 110


def test_count_of_a_built_model():
    m = build_model(SMALL, "torch", seed=0)
    assert sum(p.numel() for p in m.parameters()) == param_count(SMALL)


@pytest.mark.parametrize("over,field", [
    ({"hidden_size": 30}, "num_heads"),          # 30 % 4
    ({"num_kv_heads": 3}, "num_kv_heads"),       # 4 % 3
    ({"hidden_size": 12, "num_heads": 4}, "head_dim"),  # head_dim 3 is odd
    ({"vocab_size": 0}, "vocab_size"),
])
def test_architecture_errors_name_the_field(over, field):
    with pytest.raises(ModelConfigError, match=field):
        preset("tiny", **over)


def test_unknown_preset():
    with pytest.raises(ModelConfigError, match="preset"):
        preset("7b")


def test_forward_shape_and_initial_loss():
    m = build_model(SMALL, "torch", seed=0)
    ids = torch.randint(0, SMALL.vocab_size, (3, 16))
    logits = m(ids)
    assert logits.shape == (3, 16, SMALL.vocab_size)
    s, n = loss_sum(logits[:, :-1], ids[:, 1:])
    # init std 0.02 makes logits ~0: the loss starts at ln V (10.39 for V=32768)
    assert abs(float(s.detach()) / n - torch.log(torch.tensor(float(SMALL.vocab_size)))) < 0.05


def test_causal_future_tokens_do_not_change_the_past():
    m = build_model(SMALL, "torch", seed=0)
    ids = torch.randint(0, SMALL.vocab_size, (2, 16))
    ids2 = ids.clone()
    ids2[:, 9:] = (ids2[:, 9:] + 1) % SMALL.vocab_size
    with torch.no_grad():
        a, b = m(ids), m(ids2)
    assert torch.equal(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


def test_sequence_longer_than_max_is_an_error():
    m = build_model(SMALL, "torch", seed=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_every_parameter_gets_a_gradient():
    """Gradient flow: one backward on a non-trivial batch reaches all 9L+2 tensors."""
    m = build_model(SMALL, "torch", seed=0)
    ids = torch.randint(0, SMALL.vocab_size, (2, 16))
    s, n = loss_sum(m(ids)[:, :-1], ids[:, 1:])
    (s / n).backward()
    dead = [k for k, p in m.named_parameters() if p.grad is None or p.grad.abs().max() == 0]
    assert dead == []


def test_init_is_a_function_of_the_seed_only():
    torch.manual_seed(123)
    a = build_model(SMALL, "torch", seed=7)
    r1 = torch.rand(1)
    torch.manual_seed(123)
    b = build_model(SMALL, "torch", seed=7)
    r2 = torch.rand(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert torch.equal(r1, r2)  # the global RNG stream is untouched by a seeded build


def test_gqa_equals_mha_with_repeated_kv_heads():
    """A GQA model equals the MHA model whose k/v projections repeat each kv head's rows."""
    gqa = build_model(SMALL, "torch", seed=1)
    mha_cfg = ModelConfig(**{**SMALL.to_dict(), "num_kv_heads": SMALL.num_heads})
    mha = build_model(mha_cfg, "torch", seed=2)
    group, d = SMALL.num_heads // SMALL.num_kv_heads, SMALL.head_dim
    sd = gqa.state_dict()
    for k in list(sd):
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            w = sd[k].view(SMALL.num_kv_heads, d, -1)
            sd[k] = w.repeat_interleave(group, dim=0).reshape(SMALL.num_heads * d, -1)
    mha.load_state_dict(sd)
    ids = torch.randint(0, SMALL.vocab_size, (2, 16))
    with torch.no_grad():
        # same math, different GEMM shapes: fp32 rounding only (eps 1.2e-7 x depth x |logit|)
        torch.testing.assert_close(gqa(ids), mha(ids), atol=1e-5, rtol=1e-5)


def test_activation_checkpointing_gives_the_same_gradients():
    m = build_model(SMALL, "torch", seed=0)
    ids = torch.randint(0, SMALL.vocab_size, (2, 16))
    grads = []
    for ckpt in (False, True):
        m.zero_grad()
        m.activation_checkpointing = ckpt
        s, n = loss_sum(m(ids)[:, :-1], ids[:, 1:])
        (s / n).backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    # recomputation replays the same ops on the same inputs: bit-identical on CPU
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_last_only_logits_are_the_last_row_of_the_full_logits():
    """Sampling's head at one position is the full forward's last row (the same hidden state
    through the same head; a GEMM of one row may round differently, by a few ulps)."""
    m = build_model(SMALL, "torch", seed=0).eval()
    ids = torch.randint(0, SMALL.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, last = m(ids), m(ids, last_only=True)
    assert last.shape == (3, 1, SMALL.vocab_size)
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(last, full[:, -2:-1], rtol=1e-5, atol=1e-6)


def test_generate_greedy_is_deterministic_and_respects_length():
    m = build_model(SMALL, "torch", seed=0)
    prompt = torch.tensor([[1, 2, 3]])
    a = generate(m, prompt, 20)
    b = generate(m, prompt, 20)
    assert a.shape == (1, 23) and torch.equal(a, b)
    g = torch.Generator().manual_seed(0)
    c = generate(m, prompt, 20, temperature=1.0, top_k=5, generator=g)
    assert c.shape == (1, 23) and int(c.max()) < SMALL.vocab_size


# ------------------------------------------------------------------ backend selection
def test_unknown_backend_is_an_error():
    with pytest.raises(ValueError, match="backend='cuda'"):
        ops_mod.get_ops("cuda")


def test_auto_without_gpu_picks_torch_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(ops_mod, "gpu_available", lambda: False)
    monkeypatch.setattr(ops_mod, "_SAID", set())
    with caplog.at_level(logging.INFO, logger="falsify.llm.ops"):
        assert ops_mod.resolve_backend("auto") == "torch"
        assert ops_mod.resolve_backend("auto") == "torch"  # a run resolves it twice
    said = [r for r in caplog.records if "backend=auto -> torch (no CUDA GPU)" in r.message]
    assert len(said) == 1


def test_requested_triton_that_cannot_run_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(ops_mod, "_triton_runnable", lambda: (False, "no GPU (test)"))
    with pytest.raises(ops_mod.BackendUnavailableError, match="triton"):
        ops_mod.get_ops("triton")


def test_missing_triton_kernel_is_an_error(monkeypatch):
    monkeypatch.setattr(ops_mod, "_triton_runnable", lambda: (True, "test"))
    monkeypatch.setattr(ops_mod, "_CACHE", {})
    real = ops_mod._find_module
    monkeypatch.setattr(ops_mod, "_find_module",
                        lambda b, k: None if k == "rope" else real(b, k))
    with pytest.raises(ops_mod.BackendUnavailableError, match="falsify.kernels.triton.rope"):
        ops_mod.get_ops("triton")


def test_missing_torch_kernel_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(ops_mod, "_CACHE", {})
    real = ops_mod._find_module
    monkeypatch.setattr(ops_mod, "_find_module",
                        lambda b, k: None if k == "swiglu" else real(b, k))
    with pytest.raises(ops_mod.BackendUnavailableError, match="falsify.kernels.torch.swiglu"):
        ops_mod.get_ops("torch")


def test_torch_backend_wires_the_kernel_modules():
    ops = ops_mod.get_ops("torch")
    assert ops.provenance == {**{k: f"falsify.kernels.torch.{k}:{k}" for k in ops_mod.KERNELS},
                              "adamw": "falsify.kernels.torch.adamw:adamw_multi",
                              "grad_clip": "falsify.kernels.torch.grad_clip:clip_grad_norm_",
                              "lr_schedule": "falsify.kernels.torch.lr_schedule:set_lr"}
    from falsify.kernels.torch import adamw, grad_clip, lr_schedule

    assert (ops.adamw, ops.grad_clip, ops.lr_schedule) == (
        adamw.adamw_multi, grad_clip.clip_grad_norm_, lr_schedule.set_lr)


# Plain torch formulations of the model's math, written independently of falsify/kernels/torch: the
# oracle
# for the test below (rotate-half RoPE with float64 angles, SDPA with GQA, fp32 RMSNorm).
def _plain_rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _plain_rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    cos, sin = ang.cos().to(x.dtype)[None, :, None], ang.sin().to(x.dtype)[None, :, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def _plain_attention(q, k, v, causal=True, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


_TORCH = ops_mod.get_ops("torch")
PLAIN = ops_mod.Ops(backend="plain", linear=ops_mod.linear, provenance={},
                    adamw=_TORCH.adamw, grad_clip=_TORCH.grad_clip,
                    lr_schedule=_TORCH.lr_schedule,
                    rmsnorm=_plain_rmsnorm, rope=_plain_rope, attention=_plain_attention,
                    swiglu=lambda g, u: torch.nn.functional.silu(g) * u,
                    embedding=torch.nn.functional.embedding,
                    fused_linear_cross_entropy=lambda x, w, y, ignore_index, reduction: (
                        torch.nn.functional.cross_entropy(x @ w.t(), y, ignore_index=ignore_index,
                                                          reduction=reduction)))


def test_kernels_agree_with_plain_torch_formulations():
    """The wired-in kernels compute the model's math: same loss and gradients as a model built on
    the plain formulations above (catches e.g. an interleaved-pair RoPE or a wrong GQA map)."""
    real = ops_mod.get_ops("torch")
    a = build_model(SMALL, "torch", seed=3)
    b = build_model(SMALL, "torch", seed=3)
    for mod in b.modules():
        if hasattr(mod, "ops"):
            mod.ops = PLAIN
    assert a.ops is real
    ids = torch.randint(0, SMALL.vocab_size, (2, 16))
    out = []
    for m in (a, b):
        s, n = loss_sum(m(ids)[:, :-1], ids[:, 1:])
        (s / n).backward()
        out.append((float(s.detach()), [p.grad for p in m.parameters()]))
    assert abs(out[0][0] - out[1][0]) <= 1e-5 * abs(out[1][0])
    for ga, gb in zip(out[0][1], out[1][1]):
        torch.testing.assert_close(ga, gb, atol=1e-6, rtol=1e-4)


def test_fused_loss_sum_equals_the_logits_path():
    """Transformer.loss_sum (LM head + CE fused, what the training step runs) against
    loss_sum(model(ids)) on the same weights, with ignored targets: same sum and count, same
    gradients within fp32 summation order. Catches a dropped ignore_index, a wrong head weight
    or a lost embedding/head gradient."""
    ids = torch.randint(0, SMALL.vocab_size, (2, 16), generator=torch.Generator().manual_seed(5))
    tgt = torch.roll(ids, -1, dims=1)
    tgt[0, :5] = -100
    out = []
    for fused in (True, False):
        m = build_model(SMALL, "torch", seed=3)
        s, n = m.loss_sum(ids, tgt) if fused else loss_sum(m(ids), tgt)
        (s / n).backward()
        out.append((float(s.detach()), n, {k: p.grad for k, p in m.named_parameters()}))
    assert out[0][1] == out[1][1] == 27
    assert abs(out[0][0] - out[1][0]) <= 1e-5 * abs(out[1][0])
    for k, g in out[1][2].items():
        torch.testing.assert_close(out[0][2][k], g, atol=1e-6, rtol=1e-4, msg=k)


def test_triton_backend_model_matches_torch_backend():
    """The whole model on the Triton kernels (interpreter without a GPU) against the torch
    kernels: same logits and gradients within fp32 rounding of different reduction orders."""
    # every kernel the model needs has a Triton implementation: a missing one is a failure
    missing = [k for k in ops_mod.KERNELS
               if importlib.util.find_spec(f"falsify.kernels.triton.{k}") is None]
    assert not missing, f"no Triton implementation of {', '.join(missing)}"
    cfg = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
                      intermediate_size=48, max_seq_len=8)
    ids = torch.randint(0, cfg.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    out = []
    for backend in ("torch", "triton"):
        m = build_model(cfg, backend, seed=4)
        assert m.ops.backend == backend
        s, n = loss_sum(m(ids)[:, :-1], ids[:, 1:])
        (s / n).backward()
        out.append((float(s.detach()), {k: p.grad for k, p in m.named_parameters()}))
    assert abs(out[0][0] - out[1][0]) <= 1e-5 * abs(out[0][0])
    for k, g in out[0][1].items():
        torch.testing.assert_close(out[1][1][k], g, atol=1e-6, rtol=1e-4, msg=k)
