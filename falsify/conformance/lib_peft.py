"""PEFT 0.21 (PyPI `peft`): its LoRA layer against lora-kernel-v1.

Bound: `peft.tuners.lora.Linear` wrapping a bias-free `nn.Linear`, vanilla LoRA (no dropout, no
DoRA, no lora bias):

- `lora_linear` -> `Linear.forward`, run through `torch.func.functional_call` with the
  contract's W, A, B in place of `base_layer.weight`, `lora_A.default.weight` and
  `lora_B.default.weight` (the layouts agree: PEFT's lora_A is an `nn.Linear(in, r)`, weight
  [r, in]; lora_B an `nn.Linear(r, out)`, weight [out, r]), so autograd reaches x, A and B and
  the gradient checks judge PEFT's own graph. `rslora` is `LoraConfig(use_rslora=...)`.
- `lora_merge` -> `Linear.merge(safe_merge=True)`: the safe merge clones the base weight before
  adding `get_delta_weight` (the plain merge adds in place into the caller's W), and the merged
  weight is read back from the layer.
- `lora_init` -> `LoraLayer.reset_lora_parameters` (PEFT's default init, `init_lora_weights=
  True`) for a fresh `Linear(in, out)`. PEFT draws from torch's global generator: the adapter
  seeds it with the contract's `seed` inside `torch.random.fork_rng`, so the caller's stream is
  left as it was.

The forward and the merge use a 1 × 1 layer on the meta device (`init_lora_weights=False`): its
own parameters are never used, only the tensors passed in (the merge's base weight is the
caller's W, wrapped as a parameter without a copy). The forward's layer is built once per
(r, α, rsLoRA), outside any functorch transform, as a model's layer exists before it runs;
the PEFT numerics (fp16 intermediates, merge rounding) are documented in the findings.
"""

from __future__ import annotations

import torch

from falsify.conformance.registry import Binding, Finding, Library


def _layer(r, alpha, rslora, init=False, in_f=1, out_f=1, device="meta"):
    """A PEFT LoRA Linear around a bias-free nn.Linear(in_f, out_f), adapter "default". The
    forward and the merge run on tensors handed in, never on the layer's own parameters, whose
    shape and dtype therefore do not matter: a 1 × 1 float32 layer on the meta device."""
    from peft import LoraConfig
    from peft.tuners.lora import Linear

    base = torch.nn.Linear(in_f, out_f, bias=False, device=device)
    config = LoraConfig(r=int(r), lora_alpha=alpha, use_rslora=bool(rslora),
                        init_lora_weights=init)
    return Linear(base, "default", config, r=int(r), lora_alpha=alpha)


_LAYERS: dict = {}


def _forward_layer(r, alpha, rslora):
    """One layer per (r, α, rsLoRA), built once, as a model's layer is built before it runs
    (PEFT's forward reads the scaling from it, the weights from functional_call). A plain
    dict, which torch.compile reads without a graph break once the layer exists; built outside
    any functorch transform (nn.Parameter's requires_grad_ is refused inside torch.func.jvp)."""
    key = (r, alpha, rslora)
    if key not in _LAYERS:
        from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

        with temporarily_clear_interpreter_stack():
            _LAYERS[key] = _layer(r, alpha, rslora)
    return _LAYERS[key]


def lora_linear(x, w, a, b, alpha, r, rslora=False, out=None):
    """PEFT Linear.forward: base_layer(x) + lora_B(lora_A(dropout(x))) · scaling."""
    layer = _forward_layer(int(r), alpha, bool(rslora))
    y = torch.func.functional_call(
        layer, {"base_layer.weight": w, "lora_A.default.weight": a,
                "lora_B.default.weight": b}, (x,))
    if out is None:
        return y
    return out.copy_(y)  # the contract's optional preallocated result; PEFT has none


def lora_merge(w, a, b, alpha, r, rslora=False):
    """PEFT Linear.merge(safe_merge=True): W + get_delta_weight() on a clone of W. A fresh
    layer per call: merging marks the layer merged."""
    layer = _layer(r, alpha, rslora)
    layer.base_layer.weight = torch.nn.Parameter(w, requires_grad=False)  # no copy
    layer.lora_A["default"].weight = torch.nn.Parameter(a, requires_grad=False)
    layer.lora_B["default"].weight = torch.nn.Parameter(b, requires_grad=False)
    layer.merge(safe_merge=True)
    return layer.base_layer.weight.data


def lora_init(in_features, out_features, r, seed, dtype=torch.float32):
    """PEFT's default init of a fresh adapter: (lora_A.weight, lora_B.weight), float32 as
    PEFT creates them (the contract's default dtype)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        layer = _layer(r, 8, False, init=True, in_f=int(in_features), out_f=int(out_features),
                       device="cpu")
    return layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach()


_M = "falsify.conformance.lib_peft"

_FP16_FORWARD = (
    "PEFT computes in the inputs' dtype and rounds every intermediate to fp16 "
    "(tuners/lora/layer.py Linear.forward: result = base_layer(x), then result + "
    "lora_B(lora_A(dropout(x))) * scaling: the base product, t = x·Aᵀ, t·Bᵀ, the scaling "
    "and the sum each rounded to fp16), where the contract keeps t in float32 and rounds "
    "once. Emulating those five fp16 roundings reproduces PEFT's outputs bit for bit on "
    "random [−1, 1] inputs (m = 4, i = 64, o = 32, r = 8, α = 8, rsLoRA), whose error "
    "reaches 1.85× the contract's fp16 bound. ")
_INT_ACCEPTED = (
    "Linear.forward and merge validate no dtype: float64 and bfloat16 are computed natively "
    "(declared), and int64/int32 are accepted too, the float scaling applied and the result "
    "cast back to the integer dtype, truncating: x = 1, W = 0, A = 1 [3, 1], B = [1, 0, 0], "
    "α = 8, r = 3 gives y = 2 where α/r = 2.667 (the merge likewise gives W' = 2).")
_JVP = ("PEFT's layer is plain differentiable torch ops (F.linear, mul, add), no "
        "autograd.Function: torch.func.jvp returns torch's forward-mode values, which PEFT "
        "neither claims nor refuses")
_R0 = ("PEFT refuses r = 0 before any work, with LoraLayer.update_layer's ValueError('`r` "
       "should be a positive integer value but the value passed is 0'), which names r but "
       "not as 'r = 0'; the views and the m, i, o = 0 cases of this check pass")

LIBRARY = Library(
    name="peft",
    distribution="peft",
    bindings=(
        Binding(
            name="lora.Linear.forward",
            contract="lora-kernel-v1",
            binds={"lora_linear": f"{_M}:lora_linear"},
            dtypes=("float64", "bfloat16"),
            not_claimed={
                "FALSIFY-LORA-010": (
                    "PEFT freezes the base weight in the model, not in the layer: PeftModel "
                    "sets requires_grad = False on every non-adapter parameter "
                    "(BaseTuner._mark_only_adapters_as_trainable); Linear.forward "
                    "differentiates whatever weight it is given"),
                "FALSIFY-LORA-028": _JVP,
                "FALSIFY-LORA-030": _R0,
            },
            findings={
                "FALSIFY-LORA-001/float16": Finding(
                    kind="deviation",
                    repro="peft_lora_fp16_forward.py",
                    evidence=_FP16_FORWARD + (
                        "Found with fresh seeds (FALSIFY_SEED=215562980): [m 1, i 3, o 1, r 3, "
                        "α 8], x = 1, w = 0.25: got 2.08203125, reference 2.0833333, |err| "
                        "1.3e-3 > atol 1.46e-5 + rtol 4.88e-4·|ref| = 1.03e-3.")),
                "FALSIFY-LORA-002/float16": Finding(
                    kind="deviation",
                    repro="peft_lora_fp16_forward.py",
                    evidence=_FP16_FORWARD + (
                        "Here [bsz 1, t 1, i 16, o 16, r 2, α 8]: got −0.08203125 at (0, 0, 8), "
                        "reference −0.0823272, max |err| 8.35e-4 > atol 1.81e-4 + rtol "
                        "4.88e-4·|ref|.")),
                "FALSIFY-LORA-003/float16": Finding(
                    kind="deviation",
                    repro="peft_lora_fp16_forward.py",
                    evidence=_FP16_FORWARD + (
                        "Here rsLoRA [m 4, i 64, o 32, r 8, α 8]: got −8.125 at (3, 9), "
                        "reference −8.1362917, max |err| 0.0183 > atol 0.0068 + rtol "
                        "4.88e-4·|ref|.")),
                "FALSIFY-LORA-022": Finding(kind="deviation", evidence=_INT_ACCEPTED,
                                            repro="peft_lora_integer_input.py"),
            },
        ),
        Binding(
            name="lora.Linear.merge",
            contract="lora-kernel-v1",
            binds={"lora_merge": f"{_M}:lora_merge"},
            dtypes=("float64", "bfloat16"),
            not_claimed={
                "FALSIFY-LORA-031": _R0,
                "FALSIFY-LORA-033": (
                    "merge is a one-shot, in-place update of the layer's parameter data "
                    "(base_layer.weight.data = ...), run outside any compiled graph; "
                    "safe_merge's NaN test (torch.isfinite(w).all()) branches on tensor data"),
            },
            findings={
                "FALSIFY-LORA-004/float16": Finding(
                    kind="deviation",
                    repro="peft_lora_merge_fp16.py",
                    evidence=(
                        "get_delta_weight computes s·B·A in float32 on the CPU and rounds it "
                        "to fp16 (`output_tensor.to(dtype=dtype)`), then merge adds it to the "
                        "fp16 W in fp16 (`orig_weight += delta_weight`): two fp16 roundings "
                        "where the contract rounds W + s·B·A once. fp16(W + fp16(s·B·A)) "
                        "reproduces PEFT bit for bit; [i 99, o 45, r 3, α 24]: got 4.25 at "
                        "(0, 16), reference 4.2466235, 536 of 4455 entries beyond atol "
                        "7.32e-6 + rtol 4.88e-4·|ref|, max |err| 0.0106.")),
                "FALSIFY-LORA-023": Finding(kind="deviation", evidence=_INT_ACCEPTED,
                                            repro="peft_lora_integer_input.py"),
            },
        ),
        Binding(
            name="reset_lora_parameters",
            contract="lora-kernel-v1",
            binds={"lora_init": f"{_M}:lora_init"},
        ),
    ),
)
