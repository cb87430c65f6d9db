"""Liger-Kernel: liger_rotary_pos_emb crashes on a q with zero heads.

rope_forward launches _triton_rope with pad_n_q_head = triton.next_power_of_2(0) = 0, and the
kernel's `tl.arange(0, pad_n_qh)` over an empty range raises (under the Triton interpreter:
ValueError "arange's end argument must be greater than the start argument"), where the
result of rotating no heads is an empty tensor. Zero batch or sequence length return empty
results.

Backs FALSIFY-ROPE-018 (rope-kernel-v1, size 0: h = 0 returns the reference's empty result),
binding LigerRopeFunction (transformers table). Runs the Triton kernel under the Triton
interpreter (TRITON_INTERPRET=1) without a GPU.
Run: python liger_rope_zero_heads.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from liger_kernel.transformers.rope import liger_rotary_pos_emb  # noqa: E402

VERSION = importlib.metadata.version("liger-kernel")
q = torch.zeros(1, 0, 2, 4)  # [B, H, S, D] with H = 0
k = torch.zeros(1, 1, 2, 4)
cos, sin = torch.ones(1, 2, 4), torch.zeros(1, 2, 4)
print("case FALSIFY-ROPE-018: h = 0")
print("input:   q zeros [1, 0, 2, 4] (no query heads), k zeros [1, 1, 2, 4], cos ones / sin "
      "zeros [1, 2, 4] (float32)")
try:
    qe, _ = liger_rotary_pos_emb(q, k, cos, sin)
    outcome, ok = f"result of shape {tuple(qe.shape)}", tuple(qe.shape) == (1, 0, 2, 4)
except Exception as e:  # noqa: BLE001 - the finding is this exception
    outcome, ok = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", False
print(f"library: liger-kernel {VERSION}: liger_rotary_pos_emb(q, k, cos, sin): {outcome}")
print("true:    q_embed empty, shape (1, 0, 2, 4)")
print("bound:   the empty result, no error")
print(f"error:   {'none' if ok else outcome}")
print(f"verdict: {'does not reproduce' if ok else 'REPRODUCES: h = 0 crashes'}")
sys.exit(0 if ok else 1)
