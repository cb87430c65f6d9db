"""torchao: the affine quantization primitives crash on weights with no rows or no columns.

o = 0 (no rows): choose_qparams_affine returns an empty zero point, quantize_affine drops a
zero point of no elements (`zero_point.numel() > 0` else None) and then adds None:
TypeError: unsupported operand type(s) for +: 'Tensor' and 'NoneType'. i = 0 (no columns):
torch.amin over the empty block dim raises IndexError. The quantization of an empty weight
is empty codes (and, for no columns, a zero scale per row: the max over no entries is 0).

Backs FALSIFY-QNT-036, -037, -038 and -039 of quantize-kernel-v1 (layouts and size 0 of
int8_per_channel, int4_groupwise, int8_roundtrip, int4_roundtrip), binding quant_primitives
(affine).
Run: python torchao_affine_empty_weight.py (exit 1 = reproduces).
"""
import importlib.metadata
import sys

import torch
from torchao.quantization import quant_primitives as qp

VERSION = importlib.metadata.version("torchao")
bad = []
for name, shape, block, want in (("o = 0", (0, 4), (1, 4), "codes [0, 4], scales [0, 1]"),
                                 ("i = 0", (2, 0), (1, 0), "codes [2, 0], zero scales [2, 1]")):
    w = torch.zeros(shape)
    print(f"case {name}: w zeros {list(shape)}, int8 SYMMETRIC [-127, 127], block {block}")
    print(f"input:   w = torch.zeros({list(shape)}) (float32), block_size {block}, "
          "scale_dtype float32, zero_point_dtype int32")
    try:
        s, z = qp.choose_qparams_affine(w, qp.MappingType.SYMMETRIC, block, torch.int8, -127,
                                        127, scale_dtype=torch.float32,
                                        zero_point_dtype=torch.int32)
        q = qp.quantize_affine(w, block, s, z, torch.int8, -127, 127)
        outcome, ok = f"codes {tuple(q.shape)}, scales {tuple(s.shape)}", True
    except Exception as e:  # noqa: BLE001 - the finding is this exception
        outcome, ok = f"{type(e).__name__}: {e}", False
    print(f"library: torchao {VERSION}: {outcome}")
    print(f"true:    {want}")
    print("bound:   the empty result (the contract's size-0 rule), no error")
    print(f"error:   {'none' if ok else outcome}")
    bad.append(not ok)
    print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: an empty weight crashes'}")
    print()
print(f"summary: {sum(bad)} of {len(bad)} cases fail")
sys.exit(1 if any(bad) else 0)
