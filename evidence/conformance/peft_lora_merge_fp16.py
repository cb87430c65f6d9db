"""PEFT: merging a float16 LoRA adapter rounds twice.

Linear.get_delta_weight computes s·B·A in float32 on the CPU and rounds it to fp16
(`output_tensor.to(dtype=dtype)`), and merge then adds it to the fp16 base weight in fp16
(`orig_weight += delta_weight`, on a clone with safe_merge=True): two fp16 roundings where
W + s·B·A rounded once is within half an ulp. Where W and s·B·A nearly cancel, the delta's
rounding is many ulps of the merged weight.

Backs FALSIFY-LORA-004/float16 (lora-kernel-v1: merge parity), binding lora.Linear.merge.
Run: python peft_lora_merge_fp16.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from peft import LoraConfig, get_peft_model

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("peft")
EPS16 = 2.0 ** -10
W = [[-0.64599609375, 0.266357421875, -0.775390625, 0.2352294921875]]
A = [[0.261962890625, 0.1043701171875, -0.1561279296875, -0.062255859375],
     [-0.25927734375, -0.2249755859375, -0.303955078125, -0.38818359375]]
B = [[-0.6552734375, 0.12445068359375]]
R, ALPHA = 2, 24

model = torch.nn.Sequential(torch.nn.Linear(4, 1, bias=False))
peft_model = get_peft_model(model, LoraConfig(r=R, lora_alpha=ALPHA, target_modules=["0"],
                                              lora_dropout=0.0))
layer = peft_model.base_model.model[0]
with torch.no_grad():
    layer.base_layer.weight.copy_(torch.tensor(W))
    layer.lora_A["default"].weight.copy_(torch.tensor(A))
    layer.lora_B["default"].weight.copy_(torch.tensor(B))
peft_model.half()
layer.merge(safe_merge=True)
got = layer.base_layer.weight.detach().flatten().tolist()

s = mpmath.mpf(ALPHA) / R
true = [mpmath.mpf(W[0][j]) + s * mpmath.fsum(mpmath.mpf(B[0][k]) * A[k][j] for k in range(R))
        for j in range(4)]
# FALSIFY-LORA-004 float16 (lora-kernel-v1): atol 6e-8·(α·(r + 2) + 2), rtol eps16/2: the
# fp32 s·B·A (r products scaled by s ≤ α) and the sum, ONE rounding to fp16
atol = 6.0e-8 * (ALPHA * (R + 2) + 2)
bounds = [atol + EPS16 / 2 * abs(t) for t in true]
errs = [abs(mpmath.mpf(g) - t) for g, t in zip(got, true)]
j = max(range(4), key=lambda k: errs[k] / bounds[k])
print("case FALSIFY-LORA-004/float16: merged weight W + s·B·A")
print(f"input:   base weight = {W}, lora_A = {A}, lora_B = {B} (float16), r = {R}, "
      f"lora_alpha = {ALPHA} (s = {ALPHA / R})")
print(f"library: peft {VERSION}: merge(safe_merge=True) -> {got}; element {j} = {got[j]!r}")
print(f"true:    element {j} = {mpmath.nstr(true[j], 12)} "
      f"(all: {[mpmath.nstr(t, 8) for t in true]})")
print(f"bound:   {mpmath.nstr(bounds[j], 6)}")
print(f"error:   {mpmath.nstr(errs[j], 6)} ({sum(e > b for e, b in zip(errs, bounds))} of 4 "
      "elements beyond)")
bad = errs[j] > bounds[j]
print(f"verdict: {'REPRODUCES: error > bound' if bad else 'does not reproduce'}")
sys.exit(1 if bad else 0)
