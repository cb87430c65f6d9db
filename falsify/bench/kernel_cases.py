"""The cases of `falsify bench kernels`: for every tensor kernel under contract with a torch
implementation, our implementation and a named eager-PyTorch baseline that computes the same
thing, at a "normal" and a "large" shape, forward and (where the kernel trains) forward+backward.

Every case is defined inside `cases()` so that the list is the same however this module is
loaded (by the parent, or by the peak-memory child process, which finds a case by its key).
Inputs are built by `setup(dev, grad)` on the device the run measures; the Triton side (timed
only on a CUDA device) is looked up lazily so that a CPU run never imports Triton.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FWD, FWD_BWD = "fwd", "fwd+bwd"


@dataclass
class Case:
    contract: str  # the contract's metadata.kernel this case measures
    kernel: str  # the row's name (the contract kernel, or "<kernel> <entry point>")
    size: str  # "normal", "large" or a named probe ("S=2048")
    label: str  # the shape
    passes: str  # FWD or FWD_BWD
    setup: Callable[[str, bool], dict]  # (device, inputs require grad) -> arguments
    ours: Callable[[dict], object]
    baseline: Callable[[dict], object]
    baseline_name: str
    flops: float = 0.0  # per call; set for GEMM-class kernels (TFLOP/s on a GPU)
    bytes: float = 0.0  # minimal memory traffic per call; set for memory-bound kernels (GB/s)
    triton: Callable[[dict], object] | None = None  # the Triton implementation, same arguments

    @property
    def backward(self) -> bool:
        return self.passes == FWD_BWD

    @property
    def key(self) -> tuple[str, str, str]:
        """What a saved baseline and `--measure` identify a row by."""
        return (self.kernel, self.label, self.passes)


# Contract kernels (metadata.kernel) with torch bindings that have no case here, and why. A
# test checks that every such kernel is either benchmarked or listed, so a new contract cannot
# be left out silently.
NOT_BENCHMARKED = {
    "bpe_tokenizer": "a tokenizer (strings to ids), not a tensor kernel",
    "lr_schedule": "a scalar schedule (one float per step), not a tensor kernel",
    "grad_accumulation": "a loop over micro-batches around a loss; its cost is the training "
                         "loop's, measured by `falsify bench train`",
}
# Entry points of benchmarked contracts that have no case of their own, and why.
NOT_BENCHMARKED_ENTRY_POINTS = {
    "swiglu": "silu and the in-place backward are parts of the swiglu fwd+bwd case",
    "fused_linear_kd": "fused_linear_kd_from_topk (sparse teacher) has no eager counterpart "
                       "of the same cost; the full-teacher form is measured",
    "merging": "slerp, trim, ties, dare_linear run once per offline merge; linear is measured",
    "lora": "lora_merge and lora_init run once per adapter; lora_linear is measured",
    "gelu": "gelu_gap is a contract diagnostic (tanh vs exact), not a kernel a model calls",
    "rope": "rope_grouped_and_per_head is a bit-exactness check, not a kernel a model calls",
    "grpo_loss": "group_advantages normalises P·G scalar rewards once per generation batch",
}


def _triton(module: str, fn: str) -> Callable:
    """The Triton entry point, imported at call time (only on a CUDA device)."""
    return getattr(importlib.import_module(f"falsify.kernels.triton.{module}"), fn)


def _rand(*shape, dev="cpu", grad=False, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float32) * scale
    return t.to(dev).requires_grad_(grad)


def _ints(high, *shape, dev="cpu", seed=2):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed)).to(dev)


# `add(contract, kernel, size, label, setup, ours, baseline, name, **costs)` and
# `pick(quick_normal, quick_large, normal, large)` of `cases`, handed to each kernel's entry.
Add = Callable[..., None]
Pick = Callable[..., tuple]


def _gemm(add: Add, pick: Pick) -> None:
    """GEMM."""
    from falsify.kernels.torch.gemm import gemm

    for size, (m, n, k) in pick((256, 256, 256), (512, 511, 513), (1024, 1024, 1024),
                                (2048, 2048, 2048)):
        add("gemm", "gemm", size, f"{m}x{n}x{k}",
            lambda dev, g, m=m, n=n, k=k: {"a": _rand(m, k, dev=dev, grad=g),
                                           "b": _rand(k, n, dev=dev, grad=g, seed=1)},
            lambda a: gemm(a["a"], a["b"]), lambda a: a["a"] @ a["b"], "a @ b",
            flops=2.0 * m * n * k, triton=lambda a: _triton("gemm", "gemm")(a["a"], a["b"]))


def _softmax(add: Add, pick: Pick) -> None:
    """Softmax (no backward)."""
    from falsify.kernels.torch.softmax import softmax

    def eager_softmax(a):
        e = torch.exp(a["x"] - a["x"].amax(-1, keepdim=True))
        return e.div_(e.sum(-1, keepdim=True))

    for size, (m, n) in pick((256, 1024), (255, 4099), (4096, 4096), (1023, 32000)):
        add("softmax", "softmax", size, f"{m}x{n}",
            lambda dev, g, m=m, n=n: {"x": _rand(m, n, dev=dev)},
            lambda a: softmax(a["x"]), eager_softmax, "eager exp(x - max) / sum",
            nbytes=8.0 * m * n, triton=lambda a: _triton("softmax", "softmax")(a["x"]),
            passes=(FWD,))


def _rmsnorm(add: Add, pick: Pick) -> None:
    """RMSNorm."""
    from falsify.kernels.torch.rmsnorm import rmsnorm

    def eager_rmsnorm(a):
        x = a["x"]
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * a["w"]

    for size, (m, n) in pick((255, 1000), (512, 2048), (4096, 1024), (8192, 4096)):
        add("rmsnorm", "rmsnorm", size, f"{m}x{n}",
            lambda dev, g, m=m, n=n: {"x": _rand(m, n, dev=dev, grad=g),
                                      "w": _rand(n, dev=dev, grad=g, seed=1)},
            lambda a: rmsnorm(a["x"], a["w"], 1e-6), eager_rmsnorm,
            "eager x * rsqrt(mean(x²) + eps) * w", nbytes=8.0 * m * n,
            triton=lambda a: _triton("rmsnorm", "rmsnorm")(a["x"], a["w"], 1e-6))


def _rope(add: Add, pick: Pick) -> None:
    """RoPE."""
    from falsify.kernels.torch.rope import rope

    def eager_rope(a):
        # HF LLaMA's rotate_half with fp32 tables, built per call as ours builds them
        x, d = a["x"], a["x"].shape[-1]
        inv = 1e4 ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
        ang = a["pos"].float()[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), -1)[None, :, None, :]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * emb.cos() + torch.cat((-x2, x1), -1) * emb.sin()

    for size, (b, s, h, d) in pick((1, 128, 8, 64), (2, 256, 8, 128), (4, 512, 16, 64),
                                   (4, 2048, 32, 128)):
        add("rope", "rope", size, f"{b}x{s}x{h}x{d}",
            lambda dev, g, b=b, s=s, h=h, d=d: {"x": _rand(b, s, h, d, dev=dev, grad=g),
                                                "pos": torch.arange(s, device=dev)},
            lambda a: rope(a["x"], a["pos"], 1e4), eager_rope,
            "eager rotate_half: x*cos + rotate_half(x)*sin", nbytes=8.0 * b * s * h * d,
            triton=lambda a: _triton("rope", "rope")(a["x"], a["pos"], 1e4))


def _swiglu_gelu(add: Add, pick: Pick) -> None:
    """SwiGLU, GELU."""
    from falsify.kernels.torch.gelu import gelu
    from falsify.kernels.torch.swiglu import swiglu

    for size, (t, f) in pick((256, 1024), (512, 2731), (4096, 2816), (4096, 11008)):
        add("swiglu", "swiglu", size, f"{t}x{f}",
            lambda dev, g, t=t, f=f: {"gate": _rand(t, f, dev=dev, grad=g),
                                      "up": _rand(t, f, dev=dev, grad=g, seed=1)},
            lambda a: swiglu(a["gate"], a["up"]), lambda a: F.silu(a["gate"]) * a["up"],
            "F.silu(gate) * up", nbytes=12.0 * t * f,
            triton=lambda a: _triton("swiglu", "swiglu")(a["gate"], a["up"]))
        add("gelu", "gelu", size, f"{t}x{f}",
            lambda dev, g, t=t, f=f: {"x": _rand(t, f, dev=dev, grad=g)},
            lambda a: gelu(a["x"], "tanh"), lambda a: F.gelu(a["x"], approximate="tanh"),
            "F.gelu(x, approximate='tanh')", nbytes=8.0 * t * f,
            triton=lambda a: _triton("gelu", "gelu")(a["x"], "tanh"))


def _attention(add: Add, pick: Pick) -> None:
    """Attention."""
    from falsify.kernels.torch.attention import flash_attention

    def eager_attention(a):
        # the textbook form, materialising the [B, H, S, S] scores (GQA: K/V repeated per group)
        q, k, v = a["q"], a["k"], a["v"]
        g = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        s = q.shape[2]
        sc = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        return torch.softmax(sc.masked_fill(mask, float("-inf")), -1) @ v

    def attn_setup(b, h, hkv, s, d):
        return lambda dev, g: {"q": _rand(b, h, s, d, dev=dev, grad=g),
                               "k": _rand(b, hkv, s, d, dev=dev, grad=g, seed=1),
                               "v": _rand(b, hkv, s, d, dev=dev, grad=g, seed=2)}

    def attn_case(size, b, h, hkv, s, d, passes=(FWD, FWD_BWD)):
        add("attention", "attention", size, f"{b}x{h}/{hkv}x{s}x{d}", attn_setup(b, h, hkv, s, d),
            lambda a: flash_attention(a["q"], a["k"], a["v"], causal=True),
            eager_attention, "eager softmax(mask(q @ kᵀ / √d)) @ v, [S, S] materialised",
            # causal: half of the 2·2·S²·D multiply-adds per head
            flops=2.0 * b * h * s * s * d, passes=passes,
            triton=lambda a: _triton("attention", "flash_attention")(a["q"], a["k"], a["v"],
                                                                     causal=True))

    for size, (b, h, hkv, s, d) in pick((1, 4, 2, 128, 64), (1, 4, 2, 256, 64),
                                        (2, 8, 4, 512, 64), (1, 8, 4, 2048, 64)):
        attn_case(size, b, h, hkv, s, d)
    # The memory row: at S = 2048 the naive side holds [B, H, S, S] fp32 scores (64 MiB here)
    # while the tiled side's per-step tile stays [128, 128]; the same shape in both modes.
    attn_case("S=2048", 1, 4, 4, 2048, 64, passes=(FWD,))


def _cross_entropy_family(add: Add, pick: Pick) -> None:
    """Cross-entropy family."""
    from falsify.kernels.torch.cross_entropy import cross_entropy

    def ce_setup(t, v):
        def setup(dev, g):
            y = _ints(v, t, dev=dev)
            y[::7] = -100
            return {"z": _rand(t, v, dev=dev, grad=g, scale=3.0), "y": y}
        return setup

    for size, (t, v) in pick((256, 8192), (511, 16384), (4096, 32000), (1024, 128256)):
        add("cross_entropy", "cross_entropy", size, f"{t}x{v}", ce_setup(t, v),
            lambda a: cross_entropy(a["z"], a["y"]),
            lambda a: F.cross_entropy(a["z"], a["y"], ignore_index=-100),
            "F.cross_entropy(z, y)", nbytes=4.0 * t * v,
            triton=lambda a: _triton("cross_entropy", "cross_entropy")(a["z"], a["y"]))

    from falsify.kernels.torch.fused_linear_cross_entropy import fused_linear_cross_entropy

    def flce_setup(t, h, v):
        def setup(dev, g):
            y = _ints(v, t, dev=dev)
            y[::7] = -100
            return {"x": _rand(t, h, dev=dev, grad=g, scale=h ** -0.5),
                    "w": _rand(v, h, dev=dev, grad=g, seed=1, scale=h ** -0.5), "y": y}
        return setup

    # A language-model head: the naive side materialises the [T, V] logits and their gradient,
    # which the fused kernel avoids.
    for size, (t, h, v) in pick((256, 256, 4096), (512, 256, 8192), (2048, 512, 32768),
                                (4096, 1024, 32768)):
        add("fused_linear_cross_entropy", "fused_linear_cross_entropy", size, f"{t}x{h}x{v}",
            flce_setup(t, h, v), lambda a: fused_linear_cross_entropy(a["x"], a["w"], a["y"]),
            lambda a: F.cross_entropy(a["x"] @ a["w"].t(), a["y"], ignore_index=-100),
            "F.cross_entropy(x @ W.T, y)", flops=2.0 * t * h * v,
            triton=lambda a: _triton("fused_linear_cross_entropy", "fused_linear_cross_entropy")(
                a["x"], a["w"], a["y"]))

    from falsify.kernels.torch.fused_linear_kd import fused_linear_kd
    from falsify.kernels.torch.kd_loss import kd_loss

    temp, alpha = 2.0, 0.5

    def eager_kd(z, zt, y):
        # every label counted, so kl_div's batchmean is the mean over valid rows
        kl = F.kl_div(F.log_softmax(z / temp, -1), F.log_softmax(zt / temp, -1),
                      log_target=True, reduction="batchmean")
        return kl * temp ** 2 * alpha + (1 - alpha) * F.cross_entropy(z, y)

    # Distillation head with full teacher logits: the naive side holds the [N, V] student
    # logits, both tempered log-softmaxes, the KL terms and their gradients.
    for size, (n, d, v) in pick((256, 128, 4096), (512, 128, 8192), (2048, 512, 32000),
                                (4096, 512, 32000)):
        add("fused_linear_kd", "fused_linear_kd", size, f"{n}x{d}x{v}",
            lambda dev, g, n=n, d=d, v=v: {
                "x": _rand(n, d, dev=dev, grad=g, scale=d ** -0.5),
                "w": _rand(v, d, dev=dev, grad=g, seed=1, scale=d ** -0.5),
                "zt": _rand(n, v, dev=dev, seed=3, scale=3.0), "y": _ints(v, n, dev=dev)},
            lambda a: fused_linear_kd(a["x"], a["w"], a["zt"], a["y"], temperature=temp,
                                      alpha=alpha),
            lambda a: eager_kd(a["x"] @ a["w"].t(), a["zt"], a["y"]),
            "F.kl_div(log_softmax(x @ W.T / T), ...) + F.cross_entropy", flops=2.0 * n * d * v,
            triton=lambda a: _triton("fused_linear_kd", "fused_linear_kd")(
                a["x"], a["w"], a["zt"], a["y"], temperature=temp, alpha=alpha))

    for size, (t, v) in pick((256, 4096), (511, 8192), (2048, 32000), (1024, 128256)):
        add("kd_loss", "kd_loss", size, f"{t}x{v}",
            lambda dev, g, t=t, v=v: {"z": _rand(t, v, dev=dev, grad=g, scale=3.0),
                                      "zt": _rand(t, v, dev=dev, seed=3, scale=3.0),
                                      "y": _ints(v, t, dev=dev)},
            lambda a: kd_loss(a["z"], a["zt"], a["y"], temp, alpha),
            lambda a: eager_kd(a["z"], a["zt"], a["y"]),
            "F.kl_div(log_softmax(z / T), ...) + F.cross_entropy", nbytes=8.0 * t * v)


def _dpo(add: Add, pick: Pick) -> None:
    """DPO."""
    from falsify.kernels.torch.dpo_loss import dpo_loss

    def eager_dpo(a):
        h = (a["pc"] - a["rc"]) - (a["pr"] - a["rr"])
        return -F.logsigmoid(0.1 * h).mean()

    for size, b in pick(1024, 65536, 65536, 4194304):
        add("dpo_loss", "dpo_loss", size, f"{b}",
            lambda dev, g, b=b: {"pc": _rand(b, dev=dev, grad=g), "pr": _rand(b, dev=dev,
                                                                            grad=g, seed=1),
                                 "rc": _rand(b, dev=dev, seed=2), "rr": _rand(b, dev=dev,
                                                                              seed=3)},
            lambda a: dpo_loss(a["pc"], a["pr"], a["rc"], a["rr"], 0.1), eager_dpo,
            "-F.logsigmoid(β·((πc − rc) − (πr − rr))).mean()", nbytes=16.0 * b)


def _grpo(add: Add, pick: Pick) -> None:
    """GRPO."""
    from falsify.kernels.torch.grpo_loss import grpo_loss

    def grpo_setup(dev, g, b, t):
        lp = -_rand(b, t, dev=dev, seed=5).abs()
        lengths = t // 2 + torch.arange(b) % (t // 2)  # ragged completions
        mask = (torch.arange(t)[None, :] < lengths[:, None]).long()
        return {"lp": lp.detach().requires_grad_(g),
                "old": lp.detach() - 0.1 * _rand(b, t, dev=dev, seed=6),
                "ref": lp.detach() - 0.1 * _rand(b, t, dev=dev, seed=7),
                "a": _rand(b, dev=dev, seed=8), "m": mask.to(dev)}

    def eager_grpo(a):
        r = torch.exp(a["lp"] - a["old"])
        adv = a["a"][:, None]
        d = a["ref"] - a["lp"]
        per = -(torch.min(r * adv, torch.clamp(r, 0.8, 1.2) * adv) - 0.04 * (torch.exp(d) - d - 1))
        m = a["m"].float()
        return (per * m).sum() / m.sum()

    for size, (b, t) in pick((16, 256), (64, 1024), (64, 1024), (256, 4096)):
        add("grpo_loss", "grpo_loss", size, f"{b}x{t}",
            lambda dev, g, b=b, t=t: grpo_setup(dev, g, b, t),
            lambda a: grpo_loss(a["lp"], a["old"], a["ref"], a["a"], a["m"], 0.2, 0.04),
            eager_grpo, "(−(min(ρA, clip(ρ)A) − β·k3)·mask).sum() / mask.sum()",
            nbytes=28.0 * b * t,
            triton=lambda a: _triton("grpo_loss", "grpo_loss")(a["lp"], a["old"], a["ref"],
                                                               a["a"], a["m"], 0.2, 0.04))


def _embedding(add: Add, pick: Pick) -> None:
    """Embedding."""
    from falsify.kernels.torch.embedding import embedding

    for size, (t, v, d) in pick((1024, 8192, 256), (4096, 32000, 512), (8192, 32000, 1024),
                                (16384, 128256, 1024)):
        add("embedding", "embedding", size, f"{t}@{v}x{d}",
            lambda dev, g, t=t, v=v, d=d: {"ids": _ints(v, t, dev=dev),
                                           "table": _rand(v, d, dev=dev, grad=g)},
            lambda a: embedding(a["ids"], a["table"]), lambda a: F.embedding(a["ids"], a["table"]),
            "F.embedding(ids, table)", nbytes=8.0 * t * d,
            triton=lambda a: _triton("embedding", "embedding")(a["ids"], a["table"]))


def _optimizer_and_clipping(add: Add, pick: Pick) -> None:
    """Optimizer and clipping."""
    from falsify.kernels.torch.adamw import adamw_multi
    from falsify.kernels.torch.grad_clip import clip_grad_norm_

    hp = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)

    def eager_adamw(a, step=1, lr=1e-3, b1=0.9, b2=0.95, eps=1e-8, wd=0.1):
        # the per-tensor textbook update (decoupled decay), as torch.optim.AdamW's
        # for-loop implementation spells it
        with torch.no_grad():
            for p, g, m, v in zip(a["p"], a["g"], a["m"], a["v"]):
                p.mul_(1 - lr * wd)
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v / (1 - b2 ** step)).sqrt_().add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** step))

    def param_lists(n, r, c):
        def setup(dev, g):
            return {"p": [_rand(r, c, dev=dev, seed=i) for i in range(n)],
                    "g": [_rand(r, c, dev=dev, seed=100 + i, scale=1e-2) for i in range(n)],
                    "m": [torch.zeros(r, c, device=dev) for _ in range(n)],
                    "v": [torch.zeros(r, c, device=dev) for _ in range(n)]}
        return setup

    for size, (n, r, c) in pick((4, 256, 256), (4, 1024, 1024), (8, 1024, 1024),
                                (4, 4096, 4096)):
        add("adamw", "adamw", size, f"{n}x{r}x{c}", param_lists(n, r, c),
            lambda a: adamw_multi(a["p"], a["g"], a["m"], a["v"], 1, **hp), eager_adamw,
            "eager per-tensor mul_/lerp_/addcmul_/addcdiv_", nbytes=28.0 * n * r * c,
            triton=lambda a: _triton("adamw", "adamw_multi")(a["p"], a["g"], a["m"], a["v"], 1,
                                                              **hp),
            passes=(FWD,))

    def eager_clip(a, max_norm=1.0, eps=1e-6):
        with torch.no_grad():
            norm = torch.stack([g.norm(2) for g in a["g"]]).norm(2)
            coef = torch.clamp(max_norm / (norm + eps), max=1.0)
            for g in a["g"]:
                g.mul_(coef)
            return norm

    for size, (n, r, c) in pick((8, 256, 256), (8, 1024, 1024), (32, 1024, 1024),
                                (8, 4096, 4096)):
        # in place: after the first call the norm is ≤ 1 and the coefficient 1 on both sides,
        # which still reads and writes every element
        add("grad_clip", "grad_clip", size, f"{n}x{r}x{c}",
            lambda dev, g, n=n, r=r, c=c: {"g": [_rand(r, c, dev=dev, seed=i) for i in range(n)]},
            lambda a: clip_grad_norm_(a["g"], 1.0, 1e-6, False), eager_clip,
            "eager stack(g.norm()).norm(); g.mul_(coef)", nbytes=12.0 * n * r * c,
            triton=lambda a: _triton("grad_clip", "clip_grad_norm_")(a["g"], 1.0, 1e-6, False),
            passes=(FWD,))


def _lora_qlora_nf4(add: Add, pick: Pick) -> None:
    """LoRA, QLoRA, NF4."""
    from falsify.kernels.torch.lora import lora_linear
    from falsify.kernels.torch.nf4 import nf4_dequantize, nf4_quantize, tables
    from falsify.kernels.torch.qlora import qlora_linear

    rank, lalpha = 16, 32.0

    def lora_setup(t, i, o, nf4=False):
        def setup(dev, g):
            w = _rand(o, i, dev=dev, scale=i ** -0.5)  # frozen base
            a = {"x": _rand(t, i, dev=dev, grad=g),
                 "a": _rand(rank, i, dev=dev, grad=g, seed=1, scale=i ** -0.5),
                 # B non-zero (a trained adapter) so the adapter path does real work
                 "b": _rand(o, rank, dev=dev, grad=g, seed=2, scale=1e-2), "w": w}
            if nf4:
                a["packed"], a["absmax"] = nf4_quantize(w, 64)
            return a
        return setup

    def eager_lora(a, w):
        return F.linear(a["x"], w) + (lalpha / rank) * F.linear(F.linear(a["x"], a["a"]), a["b"])

    code = tables()[0]

    def eager_nf4_dequantize(packed, absmax, shape):
        # high nibble first (bitsandbytes order), code × its block's absmax
        p = packed.long()
        idx = torch.stack((p >> 4, p & 15), -1).reshape(-1)
        n = math.prod(shape)
        vals = code.to(packed.device)[idx[:n]].view(-1, 64) * absmax.view(-1, 1)
        return vals.reshape(shape)

    for size, (t, i, o) in pick((256, 512, 512), (512, 1024, 1024), (2048, 1024, 1024),
                                (4096, 2048, 2048)):
        flops = 2.0 * t * i * o + 2.0 * t * rank * (i + o)
        add("lora", "lora", size, f"{t}x{i}x{o}r{rank}", lora_setup(t, i, o),
            lambda a: lora_linear(a["x"], a["w"], a["a"], a["b"], lalpha, rank),
            lambda a: eager_lora(a, a["w"]), "F.linear(x, W) + s·F.linear(F.linear(x, A), B)",
            flops=flops,
            triton=lambda a: _triton("lora", "lora_linear")(a["x"], a["w"], a["a"], a["b"],
                                                             lalpha, rank))
        add("qlora", "qlora", size, f"{t}x{i}x{o}r{rank}", lora_setup(t, i, o, nf4=True),
            lambda a: qlora_linear(a["x"], a["packed"], a["absmax"], a["w"].shape, 64, a["a"],
                                   a["b"], lalpha, rank),
            lambda a: eager_lora(a, eager_nf4_dequantize(a["packed"], a["absmax"],
                                                         a["w"].shape)),
            "eager NF4 table lookup × absmax, then the LoRA linear", flops=flops,
            triton=lambda a: _triton("qlora", "qlora_linear")(
                a["x"], a["packed"], a["absmax"], a["w"].shape, 64, a["a"], a["b"], lalpha, rank))

    mid = tables()[1]

    def eager_nf4_quantize(w):
        x = w.reshape(-1, 64)
        absmax = x.abs().amax(1)
        idx = torch.bucketize(x / absmax[:, None], mid.to(w.device)).reshape(-1, 2)
        return ((idx[:, 0] << 4) | idx[:, 1]).to(torch.uint8), absmax

    def w_setup(o, i):
        def setup(dev, g):
            w = _rand(o, i, dev=dev)
            packed, absmax = nf4_quantize(w, 64)
            return {"w": w, "packed": packed, "absmax": absmax}
        return setup

    for size, (o, i) in pick((512, 512), (1024, 1024), (4096, 4096), (8192, 4096)):
        add("nf4", "nf4 dequantize", size, f"{o}x{i}", w_setup(o, i),
            lambda a: nf4_dequantize(a["packed"], a["absmax"], a["w"].shape, 64),
            lambda a: eager_nf4_dequantize(a["packed"], a["absmax"], a["w"].shape),
            "eager code[nibbles] × absmax", nbytes=4.5 * o * i, passes=(FWD,),
            triton=lambda a: _triton("nf4", "nf4_dequantize")(a["packed"], a["absmax"],
                                                               a["w"].shape, 64))
        add("nf4", "nf4 quantize", size, f"{o}x{i}", w_setup(o, i),
            lambda a: nf4_quantize(a["w"], 64), lambda a: eager_nf4_quantize(a["w"]),
            "eager absmax, bucketize on the code midpoints, pack nibbles", nbytes=4.5 * o * i,
            passes=(FWD,),
            triton=lambda a: _triton("nf4", "nf4_quantize")(a["w"], 64))


def _gguf_q4_k_dequantize(add: Add, pick: Pick) -> None:
    """GGUF q4_k dequantize."""
    from falsify.kernels.torch.gguf_quants import q4_k_dequantize

    def q4_k_setup(o, i):
        def setup(dev, g):
            gen = torch.Generator().manual_seed(3)
            blk = torch.randint(0, 256, (o, i // 256, 144), dtype=torch.uint8, generator=gen)
            # finite fp16 d and dmin (random bytes would put inf/NaN in 1 block of 32)
            scales = (torch.rand(o, i // 256, 2, generator=gen) * 1e-2).half()
            blk[..., 0:4] = scales.view(torch.uint8).view(o, i // 256, 4)
            return {"blocks": blk.reshape(o, -1).to(dev)}
        return setup

    e = torch.arange(256)
    q4_byte, q4_shift, q4_sub = 16 + 32 * (e // 64) + e % 32, 4 * ((e // 32) % 2), e // 32

    def eager_q4_k_dequantize(blocks):
        # gather each value's byte by index (the layout's formulas), the 6-bit fields by hand
        b = blocks.view(blocks.shape[0], -1, 144).int()
        d = b[..., 0:4].to(torch.uint8).contiguous().view(torch.float16).float()  # d, dmin
        s = b[..., 4:16]
        j = torch.arange(8, device=b.device) % 4
        hi = torch.arange(8, device=b.device) >= 4
        sc = torch.where(hi, (s[..., j + 8] & 15) | ((s[..., j] >> 6) << 4), s[..., j] & 63)
        mn = torch.where(hi, (s[..., j + 8] >> 4) | ((s[..., j + 4] >> 6) << 4),
                         s[..., j + 4] & 63)
        dev = blocks.device
        q = (b[..., q4_byte.to(dev)] >> q4_shift.to(dev)) & 15
        sub = q4_sub.to(dev)
        y = d[..., 0:1] * sc[..., sub].float() * q.float() - d[..., 1:2] * mn[..., sub].float()
        return y.reshape(blocks.shape[0], -1)

    for size, (o, i) in pick((256, 512), (512, 1024), (4096, 4096), (8192, 4096)):
        add("gguf_quants", "gguf q4_k dequantize", size, f"{o}x{i}", q4_k_setup(o, i),
            lambda a: q4_k_dequantize(a["blocks"]),
            lambda a: eager_q4_k_dequantize(a["blocks"]),
            "eager per-value byte gather by index, 6-bit fields unpacked per sub-block",
            nbytes=(144 / 256 + 4.0) * o * i, passes=(FWD,),
            triton=lambda a: _triton("gguf_quants", "q4_k_dequantize")(a["blocks"]))


def _post_training_quantize(add: Add, pick: Pick) -> None:
    """Post-training quantize."""
    from falsify.kernels.torch.quantize import int4_groupwise, int8_per_channel

    def eager_int8(a):
        scale = a["w"].abs().amax(1, keepdim=True) / 127
        return torch.round(a["w"] / scale).clamp_(-127, 127), scale

    def eager_int4(a, group=128):
        w = a["w"].view(a["w"].shape[0], -1, group)
        scale = w.abs().amax(-1, keepdim=True) / 7
        return torch.round(w / scale).clamp_(-8, 7), scale

    for size, (o, i) in pick((512, 512), (1024, 1024), (4096, 4096), (8192, 4096)):
        add("quantize", "quantize int8_per_channel", size, f"{o}x{i}",
            lambda dev, g, o=o, i=i: {"w": _rand(o, i, dev=dev)},
            lambda a: int8_per_channel(a["w"]), eager_int8,
            "eager absmax/127, round(w / scale)", nbytes=8.0 * o * i, passes=(FWD,))
        add("quantize", "quantize int4_groupwise", size, f"{o}x{i}g128",
            lambda dev, g, o=o, i=i: {"w": _rand(o, i, dev=dev)},
            lambda a: int4_groupwise(a["w"], 128, True), eager_int4,
            "eager group absmax/7, round(w / scale)", nbytes=8.0 * o * i, passes=(FWD,))


def _merging_pruning(add: Add, pick: Pick) -> None:
    """Merging, pruning."""
    from falsify.kernels.torch.merging import linear as merge_linear
    from falsify.kernels.torch.pruning import n_m, wanda

    for size, (n, o, i) in pick((4, 256, 256), (4, 1024, 1024), (4, 2048, 2048),
                                (4, 4096, 4096)):
        add("merging", "merging linear", size, f"{n}x{o}x{i}",
            lambda dev, g, n=n, o=o, i=i: {"t": _rand(n, o, i, dev=dev),
                                           "w": torch.rand(n, device=dev) + 0.5},
            lambda a: merge_linear(a["t"], a["w"]),
            lambda a: (a["w"][:, None, None] * a["t"]).sum(0) / a["w"].sum(),
            "eager (w[:, None, None] * θ).sum(0) / w.sum()", nbytes=4.0 * (n + 1) * o * i,
            passes=(FWD,))

    def eager_wanda(a, sparsity=0.5):
        score = a["w"].abs() * a["xn"]
        k = int(a["w"].shape[1] * sparsity)
        drop = score.topk(k, dim=1, largest=False).indices
        return a["w"].scatter(1, drop, 0.0)

    def eager_2_4(a):
        o, i = a["w"].shape
        score = (a["w"].abs() * a["xn"]).view(o, i // 4, 4)
        drop = score.topk(2, dim=-1, largest=False).indices
        return a["w"].view(o, i // 4, 4).scatter(-1, drop, 0.0).view(o, i)

    for size, (o, i) in pick((256, 256), (1024, 1024), (4096, 4096), (4096, 11008)):
        def setup(dev, g, o=o, i=i):
            return {"w": _rand(o, i, dev=dev), "xn": _rand(i, dev=dev, seed=1).abs()}

        add("pruning", "pruning wanda", size, f"{o}x{i}", setup,
            lambda a: wanda(a["w"], a["xn"], 0.5), eager_wanda,
            "eager |w|·‖x‖ per-row topk, scatter 0", nbytes=8.0 * o * i, passes=(FWD,))
        add("pruning", "pruning n_m 2:4", size, f"{o}x{i}", setup,
            lambda a: n_m(a["w"], a["xn"], 2, 4), eager_2_4,
            "eager |w|·‖x‖ topk per group of 4, scatter 0", nbytes=8.0 * o * i, passes=(FWD,))


# One entry per kernel family, each registering its cases through `add`, sizes through
# `pick`; the order here is the order of the output.
REGISTRY: tuple[Callable[[Add, Pick], None], ...] = (
    _gemm,
    _softmax,
    _rmsnorm,
    _rope,
    _swiglu_gelu,
    _attention,
    _cross_entropy_family,
    _dpo,
    _grpo,
    _embedding,
    _optimizer_and_clipping,
    _lora_qlora_nf4,
    _gguf_q4_k_dequantize,
    _post_training_quantize,
    _merging_pruning,
)


def cases(quick: bool = False) -> list[Case]:
    """Every case. `quick`: small shapes (the whole run in about a minute on 2 cores, so CI can
    afford it); the full run uses model-scale shapes."""
    out: list[Case] = []

    def pick(q_normal, q_large, normal, large):
        return (("normal", q_normal), ("large", q_large)) if quick else \
            (("normal", normal), ("large", large))

    def add(contract, kernel, size, label, setup, ours, baseline, name, *, flops=0.0,
            nbytes=0.0, triton=None, passes=(FWD, FWD_BWD)):
        """One case per pass; the fwd+bwd pass costs about 3× the forward (the backward of a
        GEMM is two GEMMs; an elementwise backward reads the input and dy, writes dx)."""
        for p in passes:
            k = 3.0 if p == FWD_BWD else 1.0
            out.append(Case(contract, kernel, size, label, p, setup, ours, baseline, name,
                            flops * k, nbytes * k, triton))

    for register in REGISTRY:
        register(add, pick)
    # grouped by kernel, in the order the kernels first appear above
    first: dict[str, int] = {}
    for c in out:
        first.setdefault(c.kernel, len(first))
    return sorted(out, key=lambda c: first[c.kernel])


def contract_kernels() -> dict[str, set[str]]:
    """{metadata.kernel: its torch-bound entry points} over the shipped kernel contracts."""
    import yaml

    from falsify.harness.project import library_dir

    found: dict[str, set[str]] = {}
    for path in sorted(library_dir().glob("*-kernel-v1.yaml")):
        doc = yaml.safe_load(path.read_text())
        for eq in (doc.get("equations") or {}).values():
            torch_fn = ((eq or {}).get("bindings") or {}).get("torch") or ""
            if torch_fn.startswith("falsify.kernels.torch."):  # falsify.llm bindings are loop-level
                found.setdefault(doc["metadata"]["kernel"], set()).add(torch_fn.split(":")[1])
    return found


def coverage_lines(quick: bool = False) -> list[str]:
    """One line per contract kernel with a torch binding that has no case, with the reason."""
    have = {c.contract for c in cases(quick)}
    lines = []
    for kernel in sorted(contract_kernels()):
        if kernel not in have:
            why = NOT_BENCHMARKED.get(kernel, "NO CASE AND NO REASON GIVEN: add one")
            lines.append(f"{kernel}: {why}")
    return lines
