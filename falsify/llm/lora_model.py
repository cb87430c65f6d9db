"""LoRA / QLoRA adapters on our Transformer (falsify/llm/model.py), and the PEFT adapter format.

`apply_lora(model, spec)` replaces each block's attention and MLP by versions whose seven
projections are `AdaptedLinear`s: a frozen base weight — fp32 (`method="lora"`) or NF4
(`method="qlora"`, blocksize 64, optional double quantization, falsify/kernels/torch/nf4.py) — plus,
on the
target projections of the trained layers, a LoRA adapter A [r, in], B [out, r] in fp32:

    y = x·Wᵀ + (α/r)·(drop(x)·Aᵀ)·Bᵀ        (falsify/kernels/torch/lora.py,
    falsify/kernels/torch/qlora.py)

Names follow PEFT so export is a prefix: our parameter `layers.0.self_attn.q_proj.lora_A.weight`
is PEFT's `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` for an
`LlamaForCausalLM` (falsify/llm/hf.py exports our base in that layout). The fp32 base keeps the name
`...q_proj.weight`, so a LoRA model's state_dict still holds the base checkpoint's tensors.

Why attention and MLP are replaced rather than their linears: falsify/llm/model.py concatenates the
q/k/v (and gate/up) weights and runs one GEMM, reading `.weight` directly, so an adapter on the
module would never be called. `LoraAttention` / `LoraMLP` repeat the (short) forward with one
call per projection. The hook that would make this unnecessary: Attention/MLP calling their
projection modules when they are not plain nn.Linear.

QLoRA quantizes every projection of every layer (not only the targets): the whole base is
frozen, and NF4 is where QLoRA's memory saving comes from. Embedding and norms stay fp32, as in
bitsandbytes/PEFT QLoRA. A GGUF base (falsify/llm/gguf_io) brings its own quantization: its
quantized projections stay in their GGUF blocks under either method, applied through
gguf_io.quant_linear.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from falsify.harness.files import atomic_path
from falsify.kernels.torch import lora as lora_kernel
from falsify.kernels.torch import nf4 as nf4_kernel
from falsify.kernels.torch import qlora as qlora_kernel
from falsify.llm.checkpoint import atomic_dir, save_file
from falsify.llm.gguf_io.common import QuantTensor, dequantize, quant_linear
from falsify.llm.model import Transformer, build_model
from falsify.reference.lora import lora_scale

# short name -> (block attribute, projection attribute); PEFT target_modules use the second
TARGETS = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"),
           "v": ("self_attn", "v_proj"), "o": ("self_attn", "o_proj"),
           "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"), "down": ("mlp", "down_proj")}
PROJ_TO_SHORT = {p: s for s, (_, p) in TARGETS.items()}
DEFAULT_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
METHODS = ("lora", "qlora")
PEFT_PREFIX = "base_model.model.model."
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Our own sidecar: what PEFT's config cannot say (the NF4 base the adapter was trained on).
FALSIFY_META = "falsify_adapter.json"
# Pruning masks (`falsify prune`): one bool tensor per projection, named like our modules
# ("layers.0.self_attn.q_proj"), True where the weight was kept. Written next to a pruned
# model's weights and into a masked adapter's directory.
MASKS_FILE = "masks.safetensors"


class LoraConfigError(ValueError):
    """A bad adapter setting; the message names it."""


@dataclass(frozen=True)
class LoraSpec:
    method: str = "qlora"
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS
    freeze_layers: int = 0  # no adapters on layers 0..N-1 (llama.cpp --freeze-layers)
    double_quant: bool = True  # bitsandbytes compress_statistics (QLoRA paper default)
    blocksize: int = 64
    rslora: bool = False
    seed: int = 42

    @property
    def scale(self) -> float:
        return lora_scale(self.alpha, self.r, self.rslora)

    def validate(self, num_layers: int | None = None) -> LoraSpec:
        def bad(name, why):
            raise LoraConfigError(f"config field {name}={getattr(self, name)!r}: {why}")

        if self.method not in METHODS:
            bad("method", f"must be one of {', '.join(METHODS)}")
        if not isinstance(self.r, int) or self.r < 1:
            bad("r", "must be an int >= 1")
        if not self.alpha > 0:
            bad("alpha", "must be > 0")
        if not 0.0 <= self.dropout < 1.0:
            bad("dropout", "must be in [0, 1)")
        if not self.targets:
            bad("targets", "must name at least one projection")
        for t in self.targets:
            if t not in TARGETS:
                bad("targets", f"{t!r} is not one of {', '.join(TARGETS)} "
                               f"(or {', '.join(PROJ_TO_SHORT)})")
        if len(set(self.targets)) != len(self.targets):
            bad("targets", "lists a projection twice")
        if self.freeze_layers < 0:
            bad("freeze_layers", "must be >= 0")
        if num_layers is not None and self.freeze_layers >= num_layers:
            bad("freeze_layers", f"freezes every one of the model's {num_layers} layers: "
                                 "nothing would train")
        try:
            nf4_kernel.check_blocksize(self.blocksize)
        except ValueError as e:
            bad("blocksize", str(e))
        return self


def normalize_targets(items) -> tuple[str, ...]:
    """"q,k,v" or ["q_proj", "v"] -> ("q", "k", "v"); unknown names are an error."""
    if isinstance(items, str):
        items = [s.strip() for s in items.split(",") if s.strip()]
    out = []
    for t in items:
        short = PROJ_TO_SHORT.get(t, t)
        if short not in TARGETS:
            raise LoraConfigError(f"config field targets: {t!r} is not one of "
                                  f"{', '.join(TARGETS)} (or {', '.join(PROJ_TO_SHORT)})")
        out.append(short)
    return tuple(out)


# ------------------------------------------------------------------------------ the layer
class Adapter(nn.Module):
    """PEFT's `lora_A` / `lora_B` are nn.Linear modules; ours hold the same `weight`."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)


class AdaptedLinear(nn.Module):
    """A frozen projection (fp32, NF4, or a GGUF base's quantized blocks) with an optional LoRA
    adapter."""

    def __init__(self, weight: torch.Tensor, quantize: bool, blocksize: int, double_quant: bool,
                 gguf=None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.quantized = quantize and gguf is None
        self.blocksize = blocksize
        self.double_quant = double_quant
        # a GGUF base's quantized projection (gguf_io.QuantTensor): kept in its own blocks,
        # whatever the method (re-quantizing it to NF4 would stack two quantizations)
        self.gguf_qtype = None if gguf is None else gguf.qtype
        if gguf is not None:
            if tuple(gguf.shape) != (self.out_features, self.in_features):
                raise LoraConfigError(f"GGUF weight {gguf.shape} does not fit a "
                                      f"[{self.out_features}, {self.in_features}] projection")
            self.register_buffer("weight_gguf", gguf.blocks.contiguous())
        elif quantize:
            state = nf4_kernel.nf4_quantize(weight.detach().float(), blocksize, double_quant)
            self.register_buffer("weight_nf4", state[0])
            self.register_buffer("weight_absmax", state[1])
            if double_quant:
                self.register_buffer("weight_absmax2", state[2])
                self.register_buffer("weight_offset", state[3])
        else:
            self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        self.lora_A: Adapter | None = None
        self.lora_B: Adapter | None = None
        self.r = 0
        self.alpha = 0.0
        self.rslora = False
        self.dropout = 0.0
        self.adapters_enabled = True
        # set_mask: the pruning mask M (bool); a non-persistent buffer so .to(device) moves it
        self.register_buffer("weight_mask", None, persistent=False)

    def add_adapter(self, a: torch.Tensor, b: torch.Tensor, r: int, alpha: float,
                    dropout: float, rslora: bool) -> None:
        if tuple(a.shape) != (r, self.in_features) or tuple(b.shape) != (self.out_features, r):
            raise LoraConfigError(f"adapter shapes A {tuple(a.shape)}, B {tuple(b.shape)} do not "
                                  f"fit a [{self.out_features}, {self.in_features}] projection "
                                  f"with r={r}")
        self.lora_A = Adapter(a.float())
        self.lora_B = Adapter(b.float())
        self.r, self.alpha, self.dropout, self.rslora = r, float(alpha), dropout, rslora

    @property
    def has_adapter(self) -> bool:
        return self.lora_A is not None

    def set_mask(self, mask: torch.Tensor, where: str) -> None:
        """Keep the pruning mask M: the adapter's delta becomes M ⊙ (s·B·A), so a pruned
        weight (M = 0) stays exactly 0 in training and in the merge. The base must already be
        0 there (checked: a mask that does not describe this base is refused). A
        non-persistent buffer: the state_dict, the fingerprint and the checkpoints are
        unchanged; the mask travels in masks.safetensors."""
        if mask.dtype != torch.bool or tuple(mask.shape) != (self.out_features,
                                                              self.in_features):
            raise LoraConfigError(f"{where}: mask {mask.dtype} {tuple(mask.shape)} does not fit "
                                  f"a [{self.out_features}, {self.in_features}] projection "
                                  "(expected torch.bool of that shape)")
        w = self.base_weight()
        live = int((w[~mask.to(w.device)] != 0).sum())
        if live:
            raise LoraConfigError(f"{where}: {live} weight(s) the mask prunes are not 0 in "
                                  "this base: the masks belong to another model")
        self.weight_mask = mask.to(w.device)

    def delta(self) -> torch.Tensor:
        """The adapter's weight delta as the forward uses it: s·B·A, or M ⊙ (s·B·A) with a
        mask (differentiable in A and B)."""
        d = self.scale() * (self.lora_B.weight @ self.lora_A.weight)
        return d if self.weight_mask is None else d * self.weight_mask

    def nf4_state(self) -> dict:
        extra = ({"absmax2": self.weight_absmax2, "offset": self.weight_offset}
                 if self.double_quant else {})
        return {"packed": self.weight_nf4, "absmax": self.weight_absmax,
                "shape": (self.out_features, self.in_features), "blocksize": self.blocksize,
                **extra}

    def base_weight(self) -> torch.Tensor:
        """The frozen base weight in fp32 (dequantized for NF4 / GGUF; never part of the
        graph)."""
        if self.gguf_qtype is not None:
            return dequantize(QuantTensor(self.weight_gguf, self.gguf_qtype,
                                          (self.out_features, self.in_features)))
        if not self.quantized:
            return self.weight.detach()
        s = self.nf4_state()
        return nf4_kernel.nf4_dequantize(s["packed"], s["absmax"], s["shape"], s["blocksize"],
                                         absmax2=s.get("absmax2"), offset=s.get("offset"))

    def scale(self) -> float:
        return lora_scale(self.alpha, self.r, self.rslora)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gguf_qtype is not None and self.weight_mask is None:
            y = quant_linear(x, self.weight_gguf, self.gguf_qtype,
                             (self.out_features, self.in_features))
            if not (self.has_adapter and self.adapters_enabled):
                return y
            # PEFT's composition: base(x) + s·B(A(drop(x))), dropout on the adapter input only
            xd = F.dropout(x, self.dropout, training=True) if self.training and \
                self.dropout > 0 else x
            return _add_adapter(y, xd, self.lora_A.weight, self.lora_B.weight, self.scale())
        if not (self.has_adapter and self.adapters_enabled):
            return F.linear(x, self.base_weight())
        a, b = self.lora_A.weight, self.lora_B.weight
        if self.weight_mask is not None:
            # A masked delta is not low rank, so the (x·Aᵀ)·Bᵀ kernels cannot compute it: the
            # dense W + M ⊙ (s·B·A) is formed, the same weight the merge writes (up to its one
            # rounding), so what is trained is what is merged. Dropout: as below, on the
            # adapter's input only.
            w = self.base_weight()
            if self.training and self.dropout > 0:
                xd = F.dropout(x, self.dropout, training=True)
                return F.linear(x, w) + F.linear(xd, self.delta())
            return F.linear(x, w + self.delta())
        if self.training and self.dropout > 0:
            w = self.base_weight()
            # The kernels take one x for both paths; dropout applies to the adapter's input
            # only (PEFT: base(x) + B(A(drop(x)))·s), so this path composes the same math.
            xd = F.dropout(x, self.dropout, training=True)
            return _add_adapter(F.linear(x, w), xd, a, b, self.scale())
        if self.quantized:
            st = self.nf4_state()
            return qlora_kernel.qlora_linear(x, st["packed"], st["absmax"], st["shape"],
                                             st["blocksize"], a, b, self.alpha, self.r,
                                             self.rslora, absmax2=st.get("absmax2"),
                                             offset=st.get("offset"))
        return lora_kernel.lora_linear(x, self.weight, a, b, self.alpha, self.r, self.rslora)


def _add_adapter(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 s: float) -> torch.Tensor:
    """y + s·(x·Aᵀ)·Bᵀ as one addmm (alpha = s): the scale and the sum happen inside the GEMM
    instead of as a multiply and an add over the [tokens, out] result, forward and backward
    (addmm's backward scales only the small [tokens, r] and [out, r] products)."""
    t = F.linear(x.reshape(-1, x.shape[-1]), a)
    return torch.addmm(y.reshape(-1, y.shape[-1]), t, b.T, alpha=s).view(y.shape)


class LoraAttention(nn.Module):
    """falsify.llm.model.Attention with one call per projection (see the module docstring)."""

    def __init__(self, attn, projections: dict[str, AdaptedLinear]):
        super().__init__()
        self.hq, self.hkv, self.d, self.theta, self.ops = (attn.hq, attn.hkv, attn.d, attn.theta,
                                                           attn.ops)
        for name, mod in projections.items():
            setattr(self, name, mod)

    def forward(self, x, pos):
        b, s, _ = x.shape
        ops, hq, hkv, d = self.ops, self.hq, self.hkv, self.d
        q = ops.rope(self.q_proj(x).view(b, s, hq, d), pos, self.theta).transpose(1, 2)
        k = ops.rope(self.k_proj(x).view(b, s, hkv, d), pos, self.theta).transpose(1, 2)
        v = self.v_proj(x).view(b, s, hkv, d).transpose(1, 2)
        o = ops.attention(q, k, v, causal=True, scale=1.0 / math.sqrt(d))
        return self.o_proj(o.transpose(1, 2).reshape(b, s, hq * d))


class LoraMLP(nn.Module):
    def __init__(self, mlp, projections: dict[str, AdaptedLinear]):
        super().__init__()
        self.ops = mlp.ops
        for name, mod in projections.items():
            setattr(self, name, mod)

    def forward(self, x):
        return self.down_proj(self.ops.swiglu(self.gate_proj(x), self.up_proj(x)))


# ------------------------------------------------------------------ building and freezing
def adapter_seed(seed: int, layer: int, proj: str) -> int:
    """Each adapter's A gets its own generator: a function of (seed, layer, projection) only,
    so the init does not depend on the order modules are visited."""
    h = hashlib.sha256(f"{seed}/{layer}/{proj}".encode()).digest()
    return int.from_bytes(h[:6], "big")


def freeze_base(model: nn.Module) -> None:
    """Only LoRA A/B train: every other parameter (embedding, norms, fp32 base projections)
    gets requires_grad=False, so autograd never computes a gradient for it and the optimizer
    (train.build_optimizer takes requires_grad parameters only) never sees it. NF4 weights are
    uint8 buffers and cannot carry a gradient at all."""
    for name, p in model.named_parameters():
        p.requires_grad_(is_adapter_param(name))


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def apply_lora(model: Transformer, spec: LoraSpec, *, init=None, freeze=None) -> Transformer:
    """Turn `model` (in place) into the LoRA/QLoRA model described by `spec`.

    `init(in, out, r, seed) -> (A, B)` defaults to falsify/kernels/torch/lora.py's PEFT init (A
    Kaiming-
    uniform, B = 0) and `freeze(model)` to `freeze_base`; both are parameters so the contract's
    mutants (B initialised non-zero, base not frozen) can be swapped in."""
    spec.validate(model.cfg.num_layers)
    if getattr(model, "lora_spec", None) is not None:
        raise LoraConfigError("the model already has adapters")
    init = init or lora_kernel.lora_init
    freeze = freeze or freeze_base
    quantize = spec.method == "qlora"
    gguf_quant = getattr(model, "gguf_quant", None) or {}  # GGUF base: gguf_io/read.py
    for li, block in enumerate(model.layers):
        groups: dict[str, dict[str, AdaptedLinear]] = {"self_attn": {}, "mlp": {}}
        for short, (part, proj) in TARGETS.items():
            lin = getattr(getattr(block, part), proj)
            mod = AdaptedLinear(lin.weight.data, quantize, spec.blocksize, spec.double_quant,
                                gguf=gguf_quant.get(f"layers.{li}.{part}.{proj}.weight"))
            if short in spec.targets and li >= spec.freeze_layers:
                a, b = init(mod.in_features, mod.out_features, spec.r,
                            adapter_seed(spec.seed, li, proj))
                mod.add_adapter(a, b, spec.r, spec.alpha, spec.dropout, spec.rslora)
            groups[part][proj] = mod
        block.self_attn = LoraAttention(block.self_attn, groups["self_attn"])
        block.mlp = LoraMLP(block.mlp, groups["mlp"])
    model.lora_spec = spec
    model.gguf_quant = None  # the blocks now live in the AdaptedLinears
    freeze(model)
    if quantize or gguf_quant:
        _return_freed_memory()
    return model


def _return_freed_memory() -> None:
    """The replaced fp32 projections are freed, but glibc keeps freed heap pages, so the
    process would stay as large as the fp32 base; malloc_trim hands them back to the OS.
    Memory hygiene only: on a libc without malloc_trim nothing changes but the RSS figure."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim = getattr(libc, "malloc_trim", None)
    except OSError:
        trim = None
    if trim is not None:
        trim(0)


def adapted_layers(model: nn.Module):
    """(our module name, AdaptedLinear) for every projection, adapter or not."""
    for name, mod in model.named_modules():
        if isinstance(mod, AdaptedLinear):
            yield name, mod


def adapter_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if is_adapter_param(n)}


def base_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every frozen tensor of the base (fp32 parameters and NF4 buffers), for the frozen-base
    checks: these must be bit-identical after any number of steps."""
    out = {n: p for n, p in model.named_parameters() if not is_adapter_param(n)}
    out.update({n: b for n, b in model.named_buffers()})
    return out


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The frozen base itself (the DPO reference model, `generate` from the base): every
    adapter is skipped for the duration."""
    mods = [m for _, m in adapted_layers(model)]
    old = [m.adapters_enabled for m in mods]
    for m in mods:
        m.adapters_enabled = False
    try:
        yield model
    finally:
        for m, o in zip(mods, old):
            m.adapters_enabled = o


def memory_bytes(model: nn.Module) -> dict:
    """Bytes of the projection weights as stored (NF4 packed + absmax state, or fp32), of the
    same weights in fp32, and of the rest of the base (embedding, norms) and the adapters."""
    stored = fp32 = 0
    for _, m in adapted_layers(model):
        fp32 += 4 * m.in_features * m.out_features
        if m.gguf_qtype is not None:
            stored += m.weight_gguf.numel() * m.weight_gguf.element_size()
        elif m.quantized:
            stored += sum(t.numel() * t.element_size() for t in m.nf4_state().values()
                          if torch.is_tensor(t))
        else:
            stored += m.weight.numel() * m.weight.element_size()
    adapters = sum(p.numel() * p.element_size() for p in adapter_parameters(model).values())
    other = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                if not is_adapter_param(n) and ".weight" in n and "_proj" not in n)
    return {"projections_stored": stored, "projections_fp32": fp32,
            "projections_ratio": stored / fp32, "embedding_and_norms": other,
            "adapters": adapters, "base_total": stored + other, "base_total_fp32": fp32 + other}


# ---------------------------------------------------------------------------------- merge
def merge_weights(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float):
    """W' = W + s·B·A: the plain projection with the adapted one's outputs. Computed in float64
    and rounded once to fp32, so the merge adds no error of its own beyond that rounding."""
    return (w.double() + scale * (b.double() @ a.double())).float()


def merge_masked_weights(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float,
                         mask: torch.Tensor):
    """M ⊙ (W + s·B·A) = W + M ⊙ (s·B·A) (W is 0 where M is: set_mask checks it), in float64
    and rounded once to fp32: every pruned position is exactly 0.0."""
    d = scale * (b.double() @ a.double())
    return (w.double() + torch.where(mask, d, torch.zeros((), dtype=d.dtype))).float()


def base_as_trained(model: Transformer) -> Transformer:
    """A plain model holding the base weights the adapter was trained against: the fp32 base
    for LoRA, the NF4 dequantization for QLoRA (so PEFT on top of it computes what we do)."""
    return merge_lora(model, merge=lambda w, a, b, s: w,
                      merge_masked=lambda w, a, b, s, m: w)


def merge_lora(model: Transformer, merge=None, merge_masked=None) -> Transformer:
    """A plain fp32 Transformer equal (up to rounding) to the adapted model: each projection's
    weight is the base as the adapter saw it — dequantized NF4 for QLoRA, so the merged model
    reproduces base+adapter rather than the unquantized original — plus (α/r)·B·A, masked by
    the pruning mask where the adapter keeps one (`merge_masked`)."""
    merge = merge or merge_weights
    merge_masked = merge_masked or merge_masked_weights
    out = build_model(model.cfg, model.ops.backend, seed=0)
    sd = {}
    for name, t in model.state_dict().items():
        if not (is_adapter_param(name) or ".weight_" in name or name.endswith("_proj.weight")):
            sd[name] = t.detach().clone().float()
    for name, m in adapted_layers(model):
        w = m.base_weight().float()
        if m.has_adapter and m.weight_mask is not None:
            w = merge_masked(w, m.lora_A.weight.detach(), m.lora_B.weight.detach(), m.scale(),
                             m.weight_mask)
        elif m.has_adapter:
            w = merge(w, m.lora_A.weight.detach(), m.lora_B.weight.detach(), m.scale())
        sd[f"{name}.weight"] = w
    out.load_state_dict(sd, strict=True)
    return out


# ------------------------------------------------------------------------ pruning masks
def read_masks(path: str | Path) -> dict[str, torch.Tensor]:
    """A masks.safetensors file: {projection name: bool mask}; anything else is an error
    naming the file."""
    raw = load_file(str(path))
    if not raw:
        raise LoraConfigError(f"{path}: holds no mask")
    for k, v in raw.items():
        if v.dtype != torch.bool or v.dim() != 2:
            raise LoraConfigError(f"{path}: mask {k!r} is {v.dtype} {tuple(v.shape)}, expected "
                                  "a 2-D torch.bool tensor")
    return raw


def save_masks(masks: dict[str, torch.Tensor], path: str | Path) -> None:
    """Write masks.safetensors atomically (temp file beside it, then rename)."""
    with atomic_path(path) as tmp:
        save_file({k: v.detach().to("cpu", torch.bool).contiguous() for k, v in masks.items()},
                  str(tmp), metadata={"format": "pt"})


def masks_digest(masks: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k, v in sorted(masks.items()):
        h.update(f"{k}{tuple(v.shape)}".encode())
        h.update(v.cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def attach_masks(model: nn.Module, masks: dict[str, torch.Tensor], where: str) -> None:
    """Give every projection of an adapted model its pruning mask (set_mask). The masks must
    name exactly the model's projections: a partial file would leave some pruned zeros
    unprotected without a word."""
    layers = dict(adapted_layers(model))
    missing, extra = sorted(set(layers) - set(masks)), sorted(set(masks) - set(layers))
    if missing or extra:
        raise LoraConfigError(f"{where}: the masks do not name this model's projections "
                              f"(missing {missing[:3]}, unexpected {extra[:3]})")
    for name, mod in layers.items():
        mod.set_mask(masks[name], f"{where}: {name}")


def model_masks(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The masks an adapted model keeps (None: none)."""
    out = {n: m.weight_mask for n, m in adapted_layers(model) if m.weight_mask is not None}
    return out or None


# ------------------------------------------------------------------------- PEFT export
def peft_config(spec: LoraSpec, num_layers: int, base_name_or_path: str) -> dict:
    """PEFT's adapter_config.json for an LlamaForCausalLM base."""
    layers = (list(range(spec.freeze_layers, num_layers)) if spec.freeze_layers else None)
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path":
            base_name_or_path, "r": spec.r, "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(TARGETS[t][1] for t in spec.targets),
        "layers_to_transform": layers, "layers_pattern": "layers" if layers else None,
        "bias": "none", "fan_in_fan_out": False, "use_rslora": spec.rslora,
        "init_lora_weights": True, "modules_to_save": None, "inference_mode": True,
        "revision": None, "use_dora": False,
    }


def peft_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {PEFT_PREFIX + n: p.detach().to("cpu", torch.float32).contiguous()
            for n, p in adapter_parameters(model).items()}


def export_peft(model: Transformer, out_dir: str | Path, base_name_or_path: str,
                tokenizer_path: str | Path | None = None, meta: dict | None = None) -> Path:
    """adapter_config.json + adapter_model.safetensors (PEFT names), plus our sidecar with the
    quantization the adapter was trained against, written atomically. A masked adapter is
    refused: PEFT's LoRA layer computes W + s·B·A and has no way to express M ⊙ (s·B·A) (the
    masked delta is not low rank, so no LoRA of any rank reproduces it), and a PEFT adapter
    that loads but refills the pruned zeros would be a silently different model."""
    if model_masks(model) is not None:
        raise LoraConfigError(
            "this adapter keeps pruning masks (keep_masks=true): a PEFT LoRA adapter computes "
            "W + s·B·A and cannot express the masked delta M ⊙ (s·B·A); merge it with "
            "`falsify merge --adapter DIR` and use or export the merged model, which is exact")
    spec: LoraSpec = model.lora_spec
    cfg = peft_config(spec, model.cfg.num_layers, base_name_or_path)
    side = {"lora_spec": {**asdict(spec), "targets": list(spec.targets)},
            "model": model.cfg.to_dict(), **(meta or {})}

    def fill(tmp: Path):
        save_file(peft_state(model), str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(cfg, indent=1))
        (tmp / FALSIFY_META).write_text(json.dumps(side, indent=1, default=str))
        if tokenizer_path is not None:  # AutoTokenizer reads the adapter dir as well
            from falsify.llm.hf import write_tokenizer_files

            write_tokenizer_files(tmp, tokenizer_path, model.cfg.max_seq_len)

    return atomic_dir(out_dir, fill)


def export_masked(model: Transformer, out_dir: str | Path,
                  tokenizer_path: str | Path | None = None, meta: dict | None = None) -> Path:
    """A masked adapter (keep_masks): A and B under PEFT's names in adapter_model.safetensors,
    the masks in masks.safetensors, our sidecar with `"masked": true` — and deliberately no
    adapter_config.json, so no PEFT loader takes it for a plain LoRA adapter (export_peft).
    Our own loaders (load_adapter: merge, generate, eval) read it whole. Written atomically."""
    masks = model_masks(model)
    if masks is None:
        raise LoraConfigError("export_masked: the model keeps no masks (use export_peft)")
    spec: LoraSpec = model.lora_spec
    side = {"lora_spec": {**asdict(spec), "targets": list(spec.targets)},
            "model": model.cfg.to_dict(), "masked": True, "masks_sha256": masks_digest(masks),
            **(meta or {})}

    def fill(tmp: Path):
        save_file(peft_state(model), str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        save_file({k: v.cpu().contiguous() for k, v in masks.items()}, str(tmp / MASKS_FILE),
                  metadata={"format": "pt"})
        (tmp / FALSIFY_META).write_text(json.dumps(side, indent=1, default=str))
        if tokenizer_path is not None:
            from falsify.llm.hf import write_tokenizer_files

            write_tokenizer_files(tmp, tokenizer_path, model.cfg.max_seq_len)

    return atomic_dir(out_dir, fill)


def read_adapter(adapter_dir: str | Path) -> tuple[LoraSpec, dict[str, torch.Tensor], dict]:
    """(spec, our-named tensors, sidecar) of an exported adapter directory. Our sidecar is
    required: without it the base quantization the adapter was trained on is unknown. A masked
    adapter (sidecar `"masked": true`) has masks.safetensors instead of adapter_config.json."""
    d = Path(adapter_dir)
    if not (d / FALSIFY_META).is_file():
        raise LoraConfigError(f"{d}: {FALSIFY_META} is missing (not an adapter written by "
                              "`falsify finetune`)")
    side = json.loads((d / FALSIFY_META).read_text())
    need = (ADAPTER_WEIGHTS, MASKS_FILE) if side.get("masked") else (ADAPTER_CONFIG,
                                                                     ADAPTER_WEIGHTS)
    for f in need:
        if not (d / f).is_file():
            raise LoraConfigError(f"{d}: {f} is missing (not an adapter written by "
                                  "`falsify finetune`)")
    s = dict(side["lora_spec"])
    s["targets"] = tuple(s["targets"])
    spec = LoraSpec(**s)
    raw = load_file(str(d / ADAPTER_WEIGHTS))
    tensors = {}
    for k, v in raw.items():
        if not k.startswith(PEFT_PREFIX):
            raise LoraConfigError(f"{d / ADAPTER_WEIGHTS}: unexpected tensor {k!r}")
        tensors[k[len(PEFT_PREFIX):]] = v
    return spec, tensors, side


def load_adapter(model: Transformer, adapter_dir: str | Path) -> Transformer:
    """Apply the adapter's spec to `model` (quantizing the base for QLoRA exactly as in
    training: NF4 quantization is deterministic) and load A/B strictly by name and shape."""
    spec, tensors, side = read_adapter(adapter_dir)
    want = side.get("model")
    if want is not None and want != model.cfg.to_dict():
        diff = [k for k in want if want[k] != model.cfg.to_dict().get(k)]
        raise LoraConfigError(f"{adapter_dir}: trained on a base with {diff[0]}={want[diff[0]]!r}, "
                              f"this base has {getattr(model.cfg, diff[0])!r}")
    apply_lora(model, spec)
    own = adapter_parameters(model)
    missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    if missing or extra:
        raise LoraConfigError(f"{adapter_dir}: adapter tensors do not match the spec "
                              f"(missing {missing[:3]}, unexpected {extra[:3]})")
    with torch.no_grad():
        for k, p in own.items():
            if tuple(tensors[k].shape) != tuple(p.shape):
                raise LoraConfigError(f"{adapter_dir}: {k} has shape {tuple(tensors[k].shape)}, "
                                      f"expected {tuple(p.shape)}")
            p.copy_(tensors[k])
    if side.get("masked"):
        masks = read_masks(Path(adapter_dir) / MASKS_FILE)
        if masks_digest(masks) != side.get("masks_sha256"):
            raise LoraConfigError(f"{Path(adapter_dir) / MASKS_FILE}: differs from the masks the "
                                  f"adapter was trained with ({FALSIFY_META} masks_sha256)")
        attach_masks(model, masks, str(Path(adapter_dir) / MASKS_FILE))
    return model
