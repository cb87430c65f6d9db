"""Merge whole models tensor by tensor with the contract-checked merging kernels
(merging-kernel-v1, impl/torch/merging.py): linear, SLERP, TIES and DARE-linear.

Every model must have the same architecture (our ModelConfig, compared field by field) and so
the same tensor names and shapes. Each tensor is viewed as 2-D, [shape[0], rest] (a 1-D norm
gain as [1, n]), merged, and put back in its shape. SLERP interpolates from the first model
(t = 0) to the second (t = 1); TIES and DARE take task vectors against `base`. DARE draws each
tensor's drop mask from its own seed, derived from (seed, tensor name), so the result does not
depend on the order tensors are visited in.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from falsify.impl.llm.model import Transformer, build_model
from falsify.impl.torch import merging as kernel

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
        if len(self.weights) != n_models or any(w <= 0 for w in self.weights):
            raise MergeError(f"--weights: one positive weight per model ({n_models}), got "
                             f"{self.weights}")
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
        if spec.method == "slerp":
            y = kernel.slerp(spec.t, two_d[0], two_d[1])
        else:
            thetas = torch.stack(two_d)
            w = torch.tensor(spec.weights, dtype=torch.float32)
            if spec.method == "linear":
                y = kernel.linear(thetas, w)
            else:
                b2 = b_state[name].float().reshape(two_d[0].shape)
                if spec.method == "ties":
                    y = kernel.ties(b2, thetas, w, spec.density, spec.lam)
                else:
                    y = kernel.dare_linear(b2, thetas, w, spec.drop,
                                           tensor_seed(spec.seed, name))
        out[name] = y.reshape(shape)
    merged = build_model(models[0].cfg, models[0].ops.backend, seed=0)
    merged.load_state_dict(out, strict=True)
    return merged
