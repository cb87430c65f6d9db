"""Liger-Kernel: the fused DPO's preference loss accepts integer log-probs.

LigerFusedLinearDPOFunction.preference_loss_fn validates no dtype: with int64 log-probs,
β·(π − ref) promotes to the default float dtype and the loss and rewards come back float32,
with no error. Summed log-probabilities are real numbers; an integer tensor here is a
caller's mistake that the loss turns into a plausible-looking value.

Backs FALSIFY-DPO-011 (dpo-loss-kernel-v1: every undeclared dtype is refused with a TypeError
or ValueError naming it), binding LigerFusedLinearDPOFunction.preference_loss_fn.
Run: python liger_dpo_integer_logps.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from liger_kernel.chunked_loss.dpo_loss import LigerFusedLinearDPOFunction  # noqa: E402

VERSION = importlib.metadata.version("liger-kernel")
PC, PR, RC, RR, BETA = [-12], [-30], [-15], [-28], 0.1
print("case FALSIFY-DPO-011: int64 log-probs")
print(f"input:   pi_c = {PC}, pi_r = {PR}, ref_c = {RC}, ref_r = {RR} (int64), beta = {BETA}")
try:
    out = LigerFusedLinearDPOFunction.preference_loss_fn(
        *(torch.tensor(v) for v in (PC, PR)), torch.empty(2), *(torch.tensor(v) for v in (RC, RR)),
        beta=BETA, loss_type="sigmoid")
except (TypeError, ValueError) as e:
    named = "int64" in str(e) or "Long" in str(e)
    print(f"library: liger-kernel {VERSION}: refused: {type(e).__name__}: {e}")
    print("true:    a refusal naming int64")
    print("bound:   a TypeError or ValueError naming the dtype")
    print(f"error:   none: refused{'' if named else ' (without naming the dtype)'}")
    print("verdict:", "does not reproduce: refused" if named
          else "REPRODUCES: refusal names no dtype")
    sys.exit(0 if named else 1)
print(f"library: liger-kernel {VERSION}: (loss, chosen_rewards, rejected_rewards) = "
      f"{[t.tolist() for t in out[:3]]}, dtypes {[t.dtype for t in out[:3]]}, no error")
print("true:    a refusal: dpo-loss-kernel-v1 declares float32 and float16 log-probs")
print("bound:   a TypeError or ValueError naming int64, before any work")
print("error:   accepted")
print("verdict: REPRODUCES: integer log-probs accepted")
sys.exit(1)
