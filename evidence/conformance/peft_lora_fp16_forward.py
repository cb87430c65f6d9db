"""PEFT: a float16 LoRA Linear rounds every intermediate to fp16.

peft.tuners.lora.Linear.forward computes `result = self.base_layer(x)` and then
`result + lora_B(lora_A(dropout(x))) * scaling` in the input dtype: the base product,
t = x·Aᵀ, t·Bᵀ, the scaling and the sum are each rounded to fp16 (five roundings). With
t kept in fp32 and one final rounding the layer is within the contract's bound; here the
result is off by several times that bound, more for the larger rsLoRA scale α/√r.

Backs FALSIFY-LORA-002/float16 (forward parity, batched input) and
FALSIFY-LORA-003/float16 (rsLoRA scale) of lora-kernel-v1, binding lora.Linear.forward.
Run: python peft_lora_fp16_forward.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import mpmath
import torch
from peft import LoraConfig, get_peft_model

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("peft")
EPS16 = 2.0 ** -10


def lora_model(w, a, b, alpha, rslora):
    """A one-layer model (a bias-free Linear) with a LoRA adapter holding w, a, b, in fp16."""
    r, (o, i) = len(a), (len(w), len(w[0]))
    model = torch.nn.Sequential(torch.nn.Linear(i, o, bias=False))
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, target_modules=["0"],
                                                  use_rslora=rslora, lora_dropout=0.0))
    layer = peft_model.base_model.model[0]
    with torch.no_grad():
        layer.base_layer.weight.copy_(torch.tensor(w))
        layer.lora_A["default"].weight.copy_(torch.tensor(a))
        layer.lora_B["default"].weight.copy_(torch.tensor(b))
    return peft_model.half()


def exact(x, w, a, b, scale):
    """y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ for one input row x and one output row (w, b)."""
    X = [mpmath.mpf(v) for v in x]
    t = [mpmath.fsum(p * q for p, q in zip(X, row)) for row in a]
    return mpmath.fsum(p * q for p, q in zip(X, w)) + scale * mpmath.fsum(
        p * q for p, q in zip(t, b))


bad = []
cases = (
    ("FALSIFY-LORA-002/float16 (LoRA, x [1, 1, 8])", False, 24,
     [[[-0.259033203125, -0.346435546875, 0.43408203125, -0.35986328125, 0.38720703125,
        0.07720947265625, 0.775390625, 0.466796875]]],
     [[-0.1842041015625, -0.030181884765625, -0.057220458984375, 0.7431640625,
       -0.72412109375, -0.1514892578125, 0.06982421875, -0.1275634765625]],
     [[0.196044921875, -0.0023136138916015625, -0.172607421875, 0.37353515625,
       -0.34130859375, 0.2137451171875, 0.45703125, -0.73876953125],
      [-0.34716796875, 0.8896484375, 0.93212890625, 0.98486328125, -0.9150390625,
       0.65283203125, 0.87060546875, 0.8037109375]],
     [[0.429931640625, 0.351318359375]]),
    ("FALSIFY-LORA-003/float16 (rsLoRA, x [1, 8])", True, 24,
     [[-0.09356689453125, -0.7802734375, -0.58349609375, -0.55615234375, -0.64892578125,
       0.8916015625, 0.1748046875, -0.10028076171875]],
     [[0.93359375, 0.1474609375, -0.65087890625, 0.451904296875, 0.173828125,
       0.93701171875, -0.314208984375, 0.259033203125]],
     [[0.479248046875, 0.45458984375, 0.469970703125, -0.45361328125, -0.2030029296875,
       0.9140625, -0.309326171875, -0.86376953125],
      [-0.5625, 0.26025390625, 0.4560546875, -0.16259765625, -0.98193359375,
       0.05181884765625, -0.96240234375, -0.96923828125],
      [0.5263671875, 0.20166015625, -0.89306640625, 0.2130126953125, -0.402099609375,
       -0.8681640625, -0.1053466796875, 0.599609375],
      [0.7197265625, 0.50146484375, -0.72802734375, -0.810546875, -0.6962890625,
       -0.95166015625, 0.77880859375, -0.7509765625]],
     [[0.1287841796875, 0.398681640625, 0.1759033203125, -0.73779296875]]),
)
for name, rslora, alpha, x, w, a, b in cases:
    r, i = len(a), len(w[0])
    model = lora_model(w, a, b, alpha, rslora)
    y = model(torch.tensor(x, dtype=torch.float16)).item()
    scale = mpmath.mpf(alpha) / (mpmath.sqrt(r) if rslora else r)
    row = x[0][0] if isinstance(x[0][0], list) else x[0]
    true = exact(row, w[0], a, b[0], scale)
    # lora-kernel-v1 float16 tolerances: LORA-002 atol 6e-8·i·(1 + α)·(i + r + 3) + 6e-8,
    # LORA-003 atol 6e-8·i·(1 + α·√r)·(i + r + 3) + 6e-8 (fp32 dot products of i and r terms
    # scaled by s ≤ α, resp. α/√r), rtol eps16/2 (ONE rounding to fp16)
    amp = 1 + alpha * (mpmath.sqrt(r) if rslora else 1)
    bound = 6.0e-8 * i * amp * (i + r + 3) + 6.0e-8 + EPS16 / 2 * abs(true)
    err = abs(mpmath.mpf(y) - true)
    print(f"case {name}")
    print(f"input:   x = {x}, base weight = {w}, lora_A = {a}, lora_B = {b} (float16); "
          f"r = {r}, lora_alpha = {alpha}, use_rslora = {rslora}")
    print(f"library: peft {VERSION}: get_peft_model(Linear({i}, 1)).half()(x) = {y!r}")
    print(f"true:    x·W^T + s·(x·A^T)·B^T = {mpmath.nstr(true, 12)} (s = {mpmath.nstr(scale, 8)})")
    print(f"bound:   {mpmath.nstr(bound, 6)}")
    print(f"error:   {mpmath.nstr(err, 6)}")
    bad.append(err > bound)
    print(f"verdict: {'REPRODUCES: error > bound' if bad[-1] else 'does not reproduce'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
