"""A pre-norm LLaMA-style decoder: RMSNorm, RoPE (rotate-half, like HF LLaMA), GQA
causal attention, SwiGLU FFN, tied input/output embeddings, no biases.

Parameter names are the HF LLaMA names without the leading "model." so that export/import is a
rename, not a reshuffle (falsify/llm/hf.py). Weights are stored [out, in]. Every kernel call goes
through `impl.ops` so the backend (torch / triton) is one switch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from falsify.llm.ops import Ops, get_ops


class ModelConfigError(ValueError):
    """An architecture that cannot be built; the message names the field."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_seq_len: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def validate(self) -> None:
        """Architecture sanity (plan check): raises ModelConfigError naming the field."""
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ModelConfigError(f"model field {f.name}={v!r}: must be a positive int")
            if f.type in ("float", float) and not (isinstance(v, (int, float)) and v > 0):
                raise ModelConfigError(f"model field {f.name}={v!r}: must be a positive number")
        if self.hidden_size % self.num_heads:
            raise ModelConfigError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ModelConfigError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads="
                f"{self.num_kv_heads} (GQA needs whole query groups)")
        if self.head_dim % 2:
            raise ModelConfigError(
                f"head_dim=hidden_size/num_heads={self.head_dim} is odd: RoPE rotates pairs")

    def to_dict(self) -> dict:
        return asdict(self)


# Presets. `350m` is a 24-layer 350M-parameter model; `50m` a pipeline-validation rung (with
# vocab 32768 the formula gives ~62M); `tiny` trains in minutes on 2 CPU cores.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=2048, hidden_size=128, num_layers=4, num_heads=4,
                        num_kv_heads=2, intermediate_size=384, max_seq_len=128),
    "50m": ModelConfig(vocab_size=32768, hidden_size=512, num_layers=12, num_heads=8,
                       num_kv_heads=2, intermediate_size=2048, max_seq_len=1024),
    "350m": ModelConfig(vocab_size=32768, hidden_size=1024, num_layers=24, num_heads=16,
                        num_kv_heads=4, intermediate_size=4096, max_seq_len=1024),
}


def preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ModelConfigError(f"model preset {name!r} unknown (known: {', '.join(PRESETS)})")
    cfg = replace(PRESETS[name], **overrides)
    cfg.validate()
    return cfg


def param_count(cfg: ModelConfig) -> int:
    """Exact parameter count, as the training-memory estimate needs it (tied embeddings, no biases):
    P_embed = V·H; P_layer = 2H + 2H² + 2H·D_kv + 3H·I; P_total = P_embed + L·P_layer + H,
    with D_kv = num_kv_heads·head_dim. 350m: 398,509,056."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    d_kv = cfg.num_kv_heads * cfg.head_dim
    d_q = cfg.num_heads * cfg.head_dim  # == H when heads divide H; kept explicit for q/o
    p_layer = 2 * h + h * d_q + d_q * h + 2 * h * d_kv + 3 * h * i
    return cfg.vocab_size * h + cfg.num_layers * p_layer + h


def param_tensor_count(cfg: ModelConfig) -> int:
    """9 tensors per layer (q, k, v, o, gate, up, down, 2 norms) + embedding + final norm
    (218 for 350m, 110 for 50m)."""
    return 9 * cfg.num_layers + 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: Ops):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x):
        return self.ops.rmsnorm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.hq, self.hkv, self.d, self.theta = cfg.num_heads, cfg.num_kv_heads, d, cfg.rope_theta
        self.q_proj = nn.Linear(h, self.hq * d, bias=False)
        self.k_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.hkv * d, bias=False)
        self.o_proj = nn.Linear(self.hq * d, h, bias=False)
        self.ops = ops

    def forward(self, x, pos):
        b, s, _ = x.shape
        ops, hq, hkv, d = self.ops, self.hq, self.hkv, self.d
        # Three GEMMs, not one on the concatenated weights: on the CPU the fused GEMM was no
        # faster per FLOP (50m: [512,512]x[512,768] 78.7 GFLOP/s vs 77.6-82 for the parts), and
        # the weight concatenation plus the backward's concatenation of the output gradients
        # cost 83 ms of a 2.9 s step at 50m (1 thread).
        q = ops.linear(x, self.q_proj.weight)
        k = ops.linear(x, self.k_proj.weight)
        v = ops.linear(x, self.v_proj.weight)
        q = ops.rope(q.view(b, s, hq, d), pos, self.theta).transpose(1, 2)
        k = ops.rope(k.view(b, s, hkv, d), pos, self.theta).transpose(1, 2)
        v = v.view(b, s, hkv, d).transpose(1, 2)
        o = ops.attention(q, k, v, causal=True, scale=1.0 / math.sqrt(d))
        return ops.linear(o.transpose(1, 2).reshape(b, s, hq * d), self.o_proj.weight)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.ops = ops

    def forward(self, x):
        # two GEMMs, for the same reason as q/k/v above
        gate = self.ops.linear(x, self.gate_proj.weight)
        up = self.ops.linear(x, self.up_proj.weight)
        return self.ops.linear(self.ops.swiglu(gate, up), self.down_proj.weight)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.self_attn = Attention(cfg, ops)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops)
        self.mlp = MLP(cfg, ops)

    def forward(self, x, pos):
        x = x + self.self_attn(self.input_layernorm(x), pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str = "auto", ops: Ops | None = None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.ops = ops if ops is not None else get_ops(backend)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, self.ops) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, self.ops)
        # Recompute each block in backward instead of storing its activations (memory O(L·S·H)
        # -> O(S·H) per block boundary). Set by the training loop from its config.
        self.activation_checkpointing = False
        if not any(p.is_meta for p in self.parameters()):
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, init_std) for every matrix (HF LLaMA's initializer_range), ones for norms."""
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("layernorm.weight") or name == "norm.weight":
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, self.cfg.init_std)

    def forward(self, ids: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """ids [B, S] int64 -> logits [B, S, V]; with `last_only`, [B, 1, V] at the last
        position (sampling reads no other: the LM head, a quarter of the tiny model's GEMM
        work per token, then runs on one row per sequence instead of S). Through forward, so
        a wrapper's hooks (DDP, FSDP's unsharding) run as for a full call."""
        h = self.hidden(ids)
        return self.head(h[:, -1:] if last_only else h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """hidden states [..., H] -> logits [..., V]: the LM head is the embedding matrix
        (tied). Callers that need logits at some positions only select them first."""
        return self.ops.linear(h, self.embed_tokens.weight)

    def loss_sum(self, ids: torch.Tensor, targets: torch.Tensor,
                 ignore_index: int = -100) -> tuple[torch.Tensor, int]:
        """`loss_sum(self(ids), targets)` without the [B·S, V] logits: the LM head and the
        cross-entropy run as one fused kernel over chunks of tokens, which also computes the
        head's gradients during the forward (falsify/kernels/torch/fused_linear_cross_entropy.py).
        Same
        value as the logits path up to fp32 summation order; the training step uses it.
        Measured (1 CPU thread, head + loss forward and backward): tiny 78 -> 49 ms, 50m
        (512 tokens, V 32768) 865 -> 744 ms, and the 3 x 64 MiB of logits, log-probabilities
        and their gradient at 50m are never allocated."""
        h = self.hidden(ids)
        tgt = targets.reshape(-1)
        total = self.ops.fused_linear_cross_entropy(
            h.reshape(-1, h.shape[-1]), self.embed_tokens.weight, tgt,
            ignore_index=ignore_index, reduction="sum")
        return total, int((tgt != ignore_index).sum())

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, S] -> the final-normed hidden states [B, S, H] the LM head reads."""
        s = ids.shape[1]
        if s > self.cfg.max_seq_len:
            raise ValueError(f"sequence length {s} > max_seq_len={self.cfg.max_seq_len}")
        pos = torch.arange(s, device=ids.device)
        x = self.ops.embedding(ids, self.embed_tokens.weight)
        for layer in self.layers:
            if self.activation_checkpointing and torch.is_grad_enabled():
                x = checkpoint(layer, x, pos, use_reentrant=False)
            else:
                x = layer(x, pos)
        return self.norm(x)


def build_model(cfg: ModelConfig, backend: str = "auto", device: str | torch.device = "cpu",
                seed: int | None = None, dtype: torch.dtype = torch.float32) -> Transformer:
    """Construct and initialise. `seed` makes the initial weights a function of the seed alone
    (a private generator state, the global RNG stream is restored afterwards)."""
    if seed is None:
        model = Transformer(cfg, backend)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Transformer(cfg, backend)
    return model.to(device=device, dtype=dtype)


def meta_param_count(cfg: ModelConfig) -> tuple[int, int]:
    """(elements, tensors) of the real module built on the meta device: no memory, exact count."""
    with torch.device("meta"):
        m = Transformer(cfg, backend="torch")
    params = list(m.parameters())
    return sum(p.numel() for p in params), len(params)


def loss_sum(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100):
    """(sum of token cross-entropies, number of counted tokens). The training loop divides by the
    token count of the whole accumulated step, so micro-batches with more real tokens weigh more."""
    flat = logits.reshape(-1, logits.shape[-1]).float()
    tgt = targets.reshape(-1)
    total = torch.nn.functional.cross_entropy(flat, tgt, ignore_index=ignore_index,
                                              reduction="sum")
    return total, int((tgt != ignore_index).sum())


@torch.no_grad()
def generate(model: Transformer, ids: torch.Tensor, max_new_tokens: int,
             temperature: float = 0.0, top_k: int | None = None,
             generator: torch.Generator | None = None, stop_id: int | None = None) -> torch.Tensor:
    """Autoregressive sampling without a KV cache (recomputes the window each token; fine for the
    short samples the CLI prints). temperature 0 = greedy; top_k keeps the k most likely tokens."""
    was_training = model.training
    model.eval()
    out = ids
    for _ in range(max_new_tokens):
        window = out[:, -model.cfg.max_seq_len:]
        logits = model(window, last_only=True)[:, -1, :].float()
        if temperature <= 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.shape[-1]:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
        out = torch.cat([out, nxt], dim=1)
        if stop_id is not None and bool((nxt == stop_id).all()):
            break
    model.train(was_training)
    return out
