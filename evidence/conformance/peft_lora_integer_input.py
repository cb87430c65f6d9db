"""PEFT: a LoRA Linear accepts integer tensors and truncates the float scaling.

lora.Linear.forward and merge validate no dtype: with int64 x and weights the adapter branch
`lora_B(lora_A(x)) * scaling` multiplies by the float scaling α/r and the result is cast back
to the integer dtype (`result.to(torch_result_dtype)` in forward, the merged weight in the
weight's dtype), truncating. x = 1, W = 0, A = 1 [3, 1], B = [1, 0, 0], α = 8, r = 3 gives
y = 2 and a merged weight of 2, where α/r = 2.667.

Backs FALSIFY-LORA-022 (forward) and FALSIFY-LORA-023 (merge) of lora-kernel-v1: every
undeclared dtype is refused with a TypeError or ValueError naming it.
Run: python peft_lora_integer_input.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
from peft import LoraConfig, get_peft_model

VERSION = importlib.metadata.version("peft")
W, A, B, X, R, ALPHA = [[0]], [[1], [1], [1]], [[1, 0, 0]], [[1]], 3, 8
true = X[0][0] * W[0][0] + ALPHA / R * sum(B[0][k] * A[k][0] * X[0][0] for k in range(R))


def layer_with(weights):
    model = torch.nn.Sequential(torch.nn.Linear(1, 1, bias=False))
    peft_model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["0"],
                                                  lora_dropout=0.0))
    layer = peft_model.base_model.model[0]

    def param(v):
        return torch.nn.Parameter(torch.tensor(v, dtype=torch.int64), requires_grad=False)

    layer.base_layer.weight = param(weights[0])
    layer.lora_A["default"].weight = param(weights[1])
    layer.lora_B["default"].weight = param(weights[2])
    return peft_model, layer


bad = []
for check, what in (("FALSIFY-LORA-022", "forward"), ("FALSIFY-LORA-023", "merge")):
    peft_model, layer = layer_with((W, A, B))
    print(f"case {check}: int64 {what}")
    print(f"input:   x = {X}, base weight = {W}, lora_A = {A}, lora_B = {B} (int64), r = {R}, "
          f"lora_alpha = {ALPHA}")
    try:
        if what == "forward":
            out = peft_model(torch.tensor(X, dtype=torch.int64))
        else:
            layer.merge(safe_merge=True)
            out = layer.base_layer.weight.detach()
        outcome, refused = f"{out.tolist()} ({out.dtype}), no error", False
    except (TypeError, ValueError) as e:
        outcome = f"refused: {type(e).__name__}: {e}"
        refused = "int64" in str(e) or "Long" in str(e)
    print(f"library: peft {VERSION}: {what}: {outcome}")
    print(f"true:    {'y' if what == 'forward' else 'W + s·B·A'} = {true:.6g} (s = α/r = "
          f"{ALPHA / R:.6g}): not an integer")
    print("bound:   a TypeError or ValueError naming int64 (lora-kernel-v1 declares float32 and "
          "float16; the binding adds float64 and bfloat16)")
    print(f"error:   {'none: refused' if refused else 'accepted, truncated to an integer'}")
    bad.append(not refused)
    print("verdict:", "does not reproduce: refused" if refused
          else "REPRODUCES: integer tensors accepted and truncated")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
