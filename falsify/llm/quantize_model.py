"""Weight-only quantization of a model's projections with the contract-checked kernels:
int8 per output channel and int4 per column group (quantize-kernel-v1,
falsify/kernels/torch/quantize.py),
NF4 per block of 64 (nf4-kernel-v1, falsify/kernels/torch/nf4.py, the format QLoRA trains against).

The quantized layout (one directory):
- `quantized.safetensors`: for every projection P (e.g. `layers.0.self_attn.q_proj`)
  - int8:  `P.qweight` int8 [out, in], `P.scale` float32 [out, 1];
  - int4:  `P.qweight` int8 [out, in] holding codes in [−8, 7] (symmetric) or [0, 15]
    (asymmetric), one per byte (unpacked: the layout is for reading, not for size),
    `P.scale` and `P.zero` float32 [out, in / group];
  - nf4:   `P.packed` uint8 [ceil(out·in / 2)] (two codes a byte, bitsandbytes' order),
    `P.absmax` float32 [out·in / 64]; with double quantization `P.absmax` holds the uint8
    8-bit codes instead, plus `P.absmax2` float32 [cdiv(out·in / 64, 256)] and `P.offset`
    float32 [1] (nf4-kernel-v1);
  and every other tensor (embedding, norm gains) unchanged in float32.
- `quantization.json`: the method, group, symmetry, the list of projections and the model
  config; `dequantize_model` needs nothing else.
Dequantization is the kernels' own: (q − zero)·scale, or code·absmax for NF4.

NF4 also exports as a pre-quantized bitsandbytes checkpoint (`export_hf_bnb`, the directory
`BNB_DIR`): the HF LLaMA layout of falsify/llm/hf.py (config.json, generation_config.json, the
tokenizer files) whose config.json carries a `quantization_config` for bitsandbytes 4-bit NF4,
and whose model.safetensors holds, for every projection, what bitsandbytes' `Params4bit`
serializes (`QuantState.as_dict(packed=True)`, read back by `QuantState.from_dict`):
  `model.P.weight`                uint8 [ceil(out·in / 2), 1]: our packed bytes unchanged (they
                                  are bitsandbytes' bytes, nf4-kernel-v1);
  `model.P.weight.absmax`         float32 [out·in / 64] (uint8 codes with double quantization);
  `model.P.weight.quant_map`      float32 [16], the NF4 code table;
  `model.P.weight.nested_absmax`, `model.P.weight.nested_quant_map` (float32 [256], the 8-bit
                                  dynamic code): only with double quantization;
  `model.P.weight.quant_state.bitsandbytes__nf4`  uint8: the UTF-8 JSON of the non-tensor
                                  fields {quant_type, blocksize, dtype, shape[, nested_blocksize,
                                  nested_dtype, nested_offset]}.
Our double-quantization statistics may differ from what bitsandbytes' own quantizer would
compute (falsify/reference/nf4.py), but bitsandbytes only decodes what is stored:
absmax = nested_quant_map[q]·nested_absmax + offset, then quant_map[nibble]·absmax, the same
float32 operations as our dequantizer, so the loaded model holds our dequantized weights
exactly (tests/test_quantize_nf4_bnb.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from falsify.kernels.torch import nf4 as nf4_kernel
from falsify.kernels.torch import quantize as q_kernel
from falsify.llm import hf
from falsify.llm.checkpoint import atomic_dir, save_file
from falsify.llm.model import ModelConfig, Transformer, build_model
from falsify.llm.prune import projection_weights

METHODS = ("int8", "int4", "nf4")
GROUPS = (128, 64, 32)  # the int4 group sizes, largest first
NF4_BLOCK = 64
FORMAT = 1
BNB_DIR = "hf-bnb-nf4"  # `falsify quantize --method nf4` writes OUT/hf-bnb-nf4
BNB_QUANT_STATE = "quant_state.bitsandbytes__nf4"


class QuantizeError(ValueError):
    """A bad quantization setting or a damaged quantized directory: one line naming it."""


@dataclass(frozen=True)
class QuantSpec:
    method: str
    group: int = 128
    symmetric: bool = True
    double_quant: bool = False  # nf4 only: quantize the absmax vector too (QLoRA's 8-bit)

    def validate(self) -> None:
        if self.method not in METHODS:
            raise QuantizeError(f"--method {self.method!r}: choose from {', '.join(METHODS)}")
        if self.double_quant and self.method != "nf4":
            raise QuantizeError("--double-quant goes with --method nf4")
        if self.method == "int4" and self.group not in (32, 64, 128):
            raise QuantizeError(f"--group {self.group}: choose 32, 64 or 128")


def default_group(model: Transformer) -> int:
    """The int4 group size when none is given: the largest of GROUPS that divides every
    projection's input width (128 for widths of 128·k, 64 for the pipeline's default student of
    width 64), so that the default works on every model the other defaults build; a
    QuantizeError naming the widths when none of them does."""
    widths = sorted({w.shape[1] for w in projection_weights(model).values()})
    for g in GROUPS:
        if all(n % g == 0 for n in widths):
            return g
    raise QuantizeError(f"--group: no group size of {', '.join(map(str, GROUPS))} divides "
                        f"every projection's input width ({', '.join(map(str, widths))})")


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
    state = nf4_kernel.nf4_quantize(w, NF4_BLOCK, double_quant=spec.double_quant)
    out = {f"{name}.packed": state[0], f"{name}.absmax": state[1]}
    if spec.double_quant:
        out.update({f"{name}.absmax2": state[2], f"{name}.offset": state[3]})
    return out


def _nf4_state(spec: QuantSpec, name: str, t: dict) -> dict:
    """The nested statistics of projection `name`, as nf4_dequantize's keyword arguments."""
    if not spec.double_quant:
        return {}
    return {"absmax2": t[f"{name}.absmax2"], "offset": t[f"{name}.offset"]}


def _dequantize_one(spec: QuantSpec, name: str, shape, t: dict) -> torch.Tensor:
    if spec.method == "int8":
        return q_kernel.dequantize(t[f"{name}.qweight"].float(), t[f"{name}.scale"], None,
                                   shape[1])
    if spec.method == "int4":
        return q_kernel.dequantize(t[f"{name}.qweight"].float(), t[f"{name}.scale"],
                                   t[f"{name}.zero"], spec.group)
    return nf4_kernel.nf4_dequantize(t[f"{name}.packed"], t[f"{name}.absmax"], tuple(shape),
                                     NF4_BLOCK, dtype=torch.float32, **_nf4_state(spec, name, t))


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
            "symmetric": spec.symmetric, "double_quant": spec.double_quant,
            "nf4_blocksize": NF4_BLOCK,
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


def _read_quantized(path: Path) -> tuple[dict, dict[str, torch.Tensor], QuantSpec]:
    try:
        meta = json.loads((path / "quantization.json").read_text())
        tensors = load_file(str(path / "quantized.safetensors"))
    except (OSError, json.JSONDecodeError) as e:
        raise QuantizeError(f"{path}: not a quantized model directory ({e})") from None
    if meta.get("format") != FORMAT:
        raise QuantizeError(f"{path}/quantization.json: format {meta.get('format')!r}, "
                            f"this falsify reads {FORMAT}")
    # "double_quant" arrived after format 1 was first written: a directory without it was
    # written before double quantization existed, so it is single-quantized by construction
    spec = QuantSpec(meta["method"], meta["group"], meta["symmetric"],
                     bool(meta.get("double_quant", False)))
    return meta, tensors, spec


@torch.no_grad()
def dequantize_model(path: str | Path, backend: str = "torch") -> Transformer:
    """The float32 model a quantized directory stands for."""
    path = Path(path)
    meta, tensors, spec = _read_quantized(path)
    state = {k: v for k, v in tensors.items()
             if not any(k.startswith(p + ".") for p in meta["projections"])}
    for name, shape in meta["projections"].items():
        state[f"{name}.weight"] = _dequantize_one(spec, name, shape, tensors)
    model = build_model(ModelConfig(**meta["model"]), backend, seed=0)
    model.load_state_dict(state, strict=True)
    return model


# ------------------------------------------------------------ bitsandbytes HF checkpoint
def bnb_quantization_config(double_quant: bool) -> dict:
    """config.json's `quantization_config`: every field transformers' BitsAndBytesConfig
    writes for a 4-bit NF4 model (transformers 5), so a reader sees no defaulted field. The
    block size is no field of it: bitsandbytes keeps it in each weight's quant_state (64)."""
    return {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
            "_load_in_4bit": True, "_load_in_8bit": False,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": bool(double_quant),
            "bnb_4bit_compute_dtype": "float32", "bnb_4bit_quant_storage": "uint8",
            "llm_int8_threshold": 6.0, "llm_int8_skip_modules": None,
            "llm_int8_enable_fp32_cpu_offload": False, "llm_int8_has_fp16_weight": False}


def _json_bytes(d: dict) -> torch.Tensor:
    """bitsandbytes' pack_dict_to_tensor: the UTF-8 bytes of json.dumps(d) as uint8."""
    return torch.tensor(list(json.dumps(d).encode("utf-8")), dtype=torch.uint8)


def bnb_nf4_tensors(key: str, shape, packed: torch.Tensor, absmax: torch.Tensor,
                    absmax2: torch.Tensor | None = None,
                    offset: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One projection's tensors as bitsandbytes serializes a Params4bit named `key`
    (`model.layers.0.self_attn.q_proj.weight`): the module docstring lists them. The JSON
    fields are in QuantState.as_dict's order, so the bytes equal what bitsandbytes writes."""
    from falsify.reference.nf4 import DQ_BLOCKSIZE, DYNAMIC_CODE, NF4_CODE

    state = {"quant_type": "nf4", "blocksize": NF4_BLOCK, "dtype": "float32",
             "shape": [int(s) for s in shape]}
    out = {key: packed.reshape(-1, 1).contiguous(),  # Params4bit stores [bytes, 1]
           f"{key}.absmax": absmax.reshape(-1).contiguous(),
           f"{key}.quant_map": torch.from_numpy(NF4_CODE.copy())}
    if (absmax2 is None) != (offset is None):
        raise QuantizeError(f"{key}: double quantization needs both absmax2 and offset")
    if absmax2 is not None:
        out[f"{key}.nested_absmax"] = absmax2.reshape(-1).float().contiguous()
        out[f"{key}.nested_quant_map"] = torch.from_numpy(DYNAMIC_CODE.astype("float32"))
        # float32 -> Python float -> JSON is exact; bitsandbytes reads it back as float32
        state.update({"nested_blocksize": DQ_BLOCKSIZE, "nested_dtype": "float32",
                      "nested_offset": float(offset.reshape(-1)[0])})
    out[f"{key}.{BNB_QUANT_STATE}"] = _json_bytes(state)
    return out


@torch.no_grad()
def export_hf_bnb(quantized: str | Path, out: str | Path,
                  tokenizer_path: str | Path | None = None) -> Path:
    """Write `out` (atomically) from an NF4 quantized directory: the HF LLaMA layout with the
    projections as bitsandbytes 4-bit NF4 weights (module docstring), every other tensor in
    float32 as falsify/llm/hf.py exports it, and the tokenizer files given a tokenizer.
    `AutoModelForCausalLM.from_pretrained(out)` loads it with bitsandbytes installed."""
    quantized = Path(quantized)
    meta, tensors, spec = _read_quantized(quantized)
    if spec.method != "nf4":
        raise QuantizeError(f"{quantized}: method {spec.method!r}; the bitsandbytes export "
                            f"needs nf4")
    if meta.get("nf4_blocksize") != NF4_BLOCK:
        raise QuantizeError(f"{quantized}/quantization.json: nf4_blocksize "
                            f"{meta.get('nf4_blocksize')!r}, bitsandbytes' 4-bit layers use "
                            f"{NF4_BLOCK}")
    cfg = ModelConfig(**meta["model"])
    state: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not any(name.startswith(p + ".") for p in meta["projections"]):
            state[hf.HF_PREFIX + name] = t.float().contiguous()
    for name, shape in meta["projections"].items():
        state.update(bnb_nf4_tensors(f"{hf.HF_PREFIX}{name}.weight", shape,
                                     tensors[f"{name}.packed"], tensors[f"{name}.absmax"],
                                     **_nf4_state(spec, name, tensors)))
    eos = hf.eos_id(tokenizer_path)
    config = hf.hf_config(cfg, eos, eos)
    config["quantization_config"] = bnb_quantization_config(spec.double_quant)

    def fill(tmp: Path):
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}, indent=1))
        if tokenizer_path is not None:
            hf.write_tokenizer_files(tmp, tokenizer_path, cfg.max_seq_len)

    return atomic_dir(out, fill)


@torch.no_grad()
def read_hf_bnb(path: str | Path) -> dict[str, torch.Tensor]:
    """Decode an `export_hf_bnb` directory with our own kernel (no bitsandbytes needed): our
    parameter names -> float32 tensors. What `falsify quantize` checks its export against."""
    path = Path(path)
    try:
        tensors = load_file(str(path / "model.safetensors"))
    except OSError as e:
        raise QuantizeError(f"{path}: not a bitsandbytes export ({e})") from None
    out: dict[str, torch.Tensor] = {}
    suffix = "." + BNB_QUANT_STATE
    for key in [k for k in tensors if k.endswith(suffix)]:
        w = key.removesuffix(suffix)
        st = json.loads(bytes(tensors[key].numpy()).decode("utf-8"))
        if st.get("quant_type") != "nf4" or st.get("blocksize") != NF4_BLOCK:
            raise QuantizeError(f"{path}: {key}: quant_type {st.get('quant_type')!r}, "
                                f"blocksize {st.get('blocksize')!r}; expected nf4, {NF4_BLOCK}")
        # we decode with our own tables: refuse a file whose maps say otherwise
        if not torch.equal(tensors[f"{w}.quant_map"], nf4_kernel.tables()[0]) or (
                "nested_offset" in st
                and not torch.equal(tensors[f"{w}.nested_quant_map"], nf4_kernel.tables()[2])):
            raise QuantizeError(f"{path}: {w}: quant_map is not bitsandbytes' NF4 / dynamic "
                                f"code table")
        nested = {}
        if "nested_offset" in st:
            nested = {"absmax2": tensors[f"{w}.nested_absmax"],
                      "offset": torch.tensor([st["nested_offset"]], dtype=torch.float32)}
        out[w] = nf4_kernel.nf4_dequantize(tensors[w], tensors[f"{w}.absmax"],
                                           tuple(st["shape"]), NF4_BLOCK,
                                           dtype=torch.float32, **nested)
    for k, v in tensors.items():
        if not any(k == w or k.startswith(w + ".") for w in out):
            out[k] = v
    return {k.removeprefix(hf.HF_PREFIX): v for k, v in out.items()}
