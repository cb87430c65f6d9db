"""Weight-only quantization of a model's projections with the contract-checked kernels:
int8 per output channel and int4 per column group (quantize-kernel-v1, impl/torch/quantize.py),
NF4 per block of 64 (nf4-kernel-v1, impl/torch/nf4.py, the format QLoRA trains against).

The quantized layout (one directory):
- `quantized.safetensors`: for every projection P (e.g. `layers.0.self_attn.q_proj`)
  - int8:  `P.qweight` int8 [out, in], `P.scale` float32 [out, 1];
  - int4:  `P.qweight` int8 [out, in] holding codes in [−8, 7] (symmetric) or [0, 15]
    (asymmetric), one per byte (unpacked: the layout is for reading, not for size),
    `P.scale` and `P.zero` float32 [out, in / group];
  - nf4:   `P.packed` uint8 [ceil(out·in / 2)] (two codes a byte, bitsandbytes' order),
    `P.absmax` float32 [out·in / 64];
  and every other tensor (embedding, norm gains) unchanged in float32.
- `quantization.json`: the method, group, symmetry, the list of projections and the model
  config; `dequantize_model` needs nothing else.
Dequantization is the kernels' own: (q − zero)·scale, or code·absmax for NF4.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from falsify.impl.llm.checkpoint import atomic_dir
from falsify.impl.llm.model import ModelConfig, Transformer, build_model
from falsify.impl.llm.prune import projection_weights
from falsify.impl.torch import nf4 as nf4_kernel
from falsify.impl.torch import quantize as q_kernel

METHODS = ("int8", "int4", "nf4")
NF4_BLOCK = 64
FORMAT = 1


class QuantizeError(ValueError):
    """A bad quantization setting or a damaged quantized directory: one line naming it."""


@dataclass(frozen=True)
class QuantSpec:
    method: str
    group: int = 128
    symmetric: bool = True

    def validate(self) -> None:
        if self.method not in METHODS:
            raise QuantizeError(f"--method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.method == "int4" and self.group not in (32, 64, 128):
            raise QuantizeError(f"--group {self.group}: choose 32, 64 or 128")


def _quantize_one(spec: QuantSpec, name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    w = w.detach().float().cpu()
    if spec.method == "int8":
        q, scale = q_kernel.int8_per_channel(w)
        return {f"{name}.qweight": q.to(torch.int8), f"{name}.scale": scale[:, None]}
    if spec.method == "int4":
        if w.shape[1] % spec.group:
            raise QuantizeError(f"--group {spec.group}: {name} has {w.shape[1]} input "
                                f"columns, not a multiple of it")
        q, scale, zero = q_kernel.int4_groupwise(w, spec.group, spec.symmetric)
        return {f"{name}.qweight": q.to(torch.int8), f"{name}.scale": scale,
                f"{name}.zero": zero}
    packed, absmax = nf4_kernel.nf4_quantize(w, NF4_BLOCK)[:2]
    return {f"{name}.packed": packed, f"{name}.absmax": absmax}


def _dequantize_one(spec: QuantSpec, name: str, shape, t: dict) -> torch.Tensor:
    if spec.method == "int8":
        return q_kernel.dequantize(t[f"{name}.qweight"].float(), t[f"{name}.scale"], None,
                                   shape[1])
    if spec.method == "int4":
        return q_kernel.dequantize(t[f"{name}.qweight"].float(), t[f"{name}.scale"],
                                   t[f"{name}.zero"], spec.group)
    return nf4_kernel.nf4_dequantize(t[f"{name}.packed"], t[f"{name}.absmax"], tuple(shape),
                                     NF4_BLOCK, dtype=torch.float32)


@torch.no_grad()
def quantize_model(model: Transformer, spec: QuantSpec, out: str | Path,
                   tokenizer_path: str | None = None) -> Path:
    """Write the quantized layout (module docstring) atomically."""
    spec.validate()
    projections = projection_weights(model)
    tensors: dict[str, torch.Tensor] = {}
    for name, w in projections.items():
        tensors.update(_quantize_one(spec, name, w))
    for name, t in model.state_dict().items():
        if name.removesuffix(".weight") not in projections:
            tensors[name] = t.detach().float().cpu().contiguous()
    meta = {"format": FORMAT, "method": spec.method, "group": spec.group,
            "symmetric": spec.symmetric, "nf4_blocksize": NF4_BLOCK,
            "projections": {n: list(w.shape) for n, w in projections.items()},
            "model": model.cfg.to_dict()}

    def fill(tmp: Path):
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  str(tmp / "quantized.safetensors"))
        (tmp / "quantization.json").write_text(json.dumps(meta, indent=1))
        if tokenizer_path:
            import shutil

            shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")

    return atomic_dir(out, fill)


@torch.no_grad()
def dequantize_model(path: str | Path, backend: str = "torch") -> Transformer:
    """The float32 model a quantized directory stands for."""
    path = Path(path)
    try:
        meta = json.loads((path / "quantization.json").read_text())
        tensors = load_file(str(path / "quantized.safetensors"))
    except (OSError, json.JSONDecodeError) as e:
        raise QuantizeError(f"{path}: not a quantized model directory ({e})") from None
    if meta.get("format") != FORMAT:
        raise QuantizeError(f"{path}/quantization.json: format {meta.get('format')!r}, "
                            f"this falsify reads {FORMAT}")
    spec = QuantSpec(meta["method"], meta["group"], meta["symmetric"])
    state = {k: v for k, v in tensors.items()
             if not any(k.startswith(p + ".") for p in meta["projections"])}
    for name, shape in meta["projections"].items():
        state[f"{name}.weight"] = _dequantize_one(spec, name, shape, tensors)
    model = build_model(ModelConfig(**meta["model"]), backend, seed=0)
    model.load_state_dict(state, strict=True)
    return model
