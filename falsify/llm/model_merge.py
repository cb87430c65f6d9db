"""Merge whole models tensor by tensor with the contract-checked merging kernels
(merging-kernel-v1, falsify/kernels/torch/merging.py): linear, SLERP, TIES and DARE-linear.

Every model must have the same architecture (our ModelConfig, compared field by field) and so
the same tensor names and shapes. Each tensor is viewed as 2-D, [shape[0], rest] (a 1-D norm
gain as [1, n]), merged, and put back in its shape. SLERP interpolates from the first model
(t = 0) to the second (t = 1); TIES and DARE take task vectors against `base`. DARE draws each
tensor's drop mask from its own seed, derived from (seed, tensor name), so the result does not
depend on the order tensors are visited in.

Adapters (merge_adapters): LoRA/QLoRA adapters trained on one base are merged through the same
per-tensor kernels (merge_tensor) on their task vectors ΔW_i = s_i·B_i·A_i, with the base's
task vector 0 as TIES/DARE's base, and the result is added to the shared base.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from falsify.kernels.torch import merging as kernel
from falsify.llm.model import Transformer, build_model

METHODS = ("linear", "slerp", "ties", "dare")


class MergeError(ValueError):
    """A bad merge request: one line naming the setting or the model."""


@dataclass
class MergeSpec:
    method: str
    weights: list[float] = field(default_factory=list)  # one per model (linear, ties, dare)
    t: float = 0.5            # slerp
    density: float = 1.0      # ties
    lam: float = 1.0          # ties
    drop: float = 0.5         # dare
    seed: int = 0             # dare

    def validate(self, n_models: int, has_base: bool) -> None:
        if self.method not in METHODS:
            raise MergeError(f"--method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.method == "slerp":
            if n_models != 2:
                raise MergeError(f"slerp interpolates two models; got {n_models}")
            if not 0.0 <= self.t <= 1.0:
                raise MergeError(f"--t {self.t}: must be in [0, 1]")
            return
        if self.method in ("ties", "dare") and not has_base:
            raise MergeError(f"--method {self.method} merges task vectors: give --base")
        if n_models < 1 or (self.method == "linear" and n_models < 2):
            raise MergeError(f"--method {self.method}: give at least "
                             f"{2 if self.method == 'linear' else 1} model(s)")
        if not self.weights:
            self.weights = [1.0] * n_models
        # a zero weight leaves a model out (linear 1,0 is the first model alone); the kernels
        # divide by the sum, so at least one must be positive
        if (len(self.weights) != n_models or any(not w >= 0 for w in self.weights)
                or not sum(self.weights) > 0):
            raise MergeError(f"--weights: one weight >= 0 per model ({n_models}), at least one "
                             f"positive weight, got {self.weights}")
        if self.method == "ties" and not (0.0 < self.density <= 1.0 and self.lam > 0):
            raise MergeError(f"--density {self.density} must be in (0, 1] and --lambda "
                             f"{self.lam} > 0")
        if self.method == "dare" and not 0.0 <= self.drop < 1.0:
            raise MergeError(f"--drop {self.drop}: must be in [0, 1)")


def tensor_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def check_same_architecture(models: list[Transformer], names: list[str]) -> None:
    ref = models[0].cfg.to_dict()
    for m, n in zip(models[1:], names[1:]):
        other = m.cfg.to_dict()
        diff = [k for k in ref if ref[k] != other.get(k)]
        if diff:
            raise MergeError(f"{n}: {diff[0]} = {other.get(diff[0])} but {names[0]} has "
                             f"{ref[diff[0]]}: models of different architectures cannot be "
                             "merged tensor by tensor")


def merge_tensor(spec: MergeSpec, name: str, two_d: list[torch.Tensor],
                 base2d: torch.Tensor | None) -> torch.Tensor:
    """One 2-D tensor of every model (and of the base) merged by the spec's kernel: the one
    place both the model path and the adapter path call the merging kernels."""
    if spec.method == "slerp":
        return kernel.slerp(spec.t, two_d[0], two_d[1])
    thetas = torch.stack(two_d)
    w = torch.tensor(spec.weights, dtype=torch.float32)
    if spec.method == "linear":
        return kernel.linear(thetas, w)
    if spec.method == "ties":
        return kernel.ties(base2d, thetas, w, spec.density, spec.lam)
    return kernel.dare_linear(base2d, thetas, w, spec.drop, tensor_seed(spec.seed, name))


@torch.no_grad()
def merge_models(spec: MergeSpec, models: list[Transformer], base: Transformer | None
                 ) -> Transformer:
    states = [m.state_dict() for m in models]
    b_state = base.state_dict() if base is not None else None
    out = {}
    for name, first in states[0].items():
        shape = first.shape
        two_d = [s[name].float().reshape(shape[0] if first.dim() > 1 else 1, -1)
                 for s in states]
        b2 = (b_state[name].float().reshape(two_d[0].shape)
              if spec.method in ("ties", "dare") else None)
        out[name] = merge_tensor(spec, name, two_d, b2).reshape(shape)
    merged = build_model(models[0].cfg, models[0].ops.backend, seed=0)
    merged.load_state_dict(out, strict=True)
    return merged


# --------------------------------------------------------------------------- adapters
def adapter_deltas(model) -> dict[str, torch.Tensor]:
    """ΔW = s·B·A (M ⊙ s·B·A for a masked adapter) per adapted projection, by weight name
    (`layers.0.self_attn.q_proj.weight`), in float64 as lora_model.merge_weights forms it,
    rounded once to fp32 (the merging kernels' precision)."""
    from falsify.llm import lora_model as LM

    out = {}
    for name, m in LM.adapted_layers(model):
        if not m.has_adapter:
            continue
        d = m.scale() * (m.lora_B.weight.detach().double() @ m.lora_A.weight.detach().double())
        if m.weight_mask is not None:
            d = torch.where(m.weight_mask, d, torch.zeros((), dtype=d.dtype))
        out[f"{name}.weight"] = d.float()
    return out


@torch.no_grad()
def merge_adapters(spec: MergeSpec, adapted: list, names: list[str]) -> Transformer:
    """Merge adapters trained on one base: their task vectors ΔW_i (adapter_deltas; a
    projection an adapter does not train has ΔW_i = 0, and so does the base) go through
    merge_tensor with the zero tensor as the base, and the result is
    W + merged(ΔW_1, …, ΔW_k), summed in float64 and rounded once. W is the base each adapter
    was trained against (the NF4 dequantization for QLoRA), and it must be one and the same
    for every adapter, bit for bit."""
    from falsify.llm import lora_model as LM

    if spec.method == "slerp":
        raise MergeError("--method slerp interpolates whole weights, not task vectors: merge "
                         "each adapter into its base (`falsify merge --adapter`) and slerp the "
                         "merged models")
    bases = [LM.base_as_trained(m).state_dict() for m in adapted]
    for n, b in zip(names[1:], bases[1:]):
        diff = next((k for k in bases[0] if not torch.equal(bases[0][k], b[k])), None)
        if diff is not None:
            raise MergeError(f"{n} was trained against other base weights than {names[0]} "
                             f"({diff} differs; e.g. lora vs qlora, or another NF4 setting): "
                             "their task vectors have no common origin")
    deltas = [adapter_deltas(m) for m in adapted]
    out = {}
    for name, w in bases[0].items():
        if not any(name in d for d in deltas):
            out[name] = w
            continue
        two_d = [d.get(name, torch.zeros(w.shape, dtype=torch.float32)) for d in deltas]
        zero = torch.zeros(w.shape, dtype=torch.float32)
        merged = merge_tensor(spec, name, two_d, zero)
        out[name] = (w.double() + merged.double()).float()
    model = build_model(adapted[0].cfg, adapted[0].ops.backend, seed=0)
    model.load_state_dict(out, strict=True)
    return model
