"""Liger-Kernel: the fused DPO's sigmoid loss is computed in float16 for fp16 log-probs.

LigerFusedLinearDPOFunction.preference_loss_fn (loss_type "sigmoid") computes
chosen_logratios = π_c − ref_c, rejected_logratios = π_r − ref_r, their difference times β,
logsigmoid, the sum and the division by the pair count, each in the log-probs' dtype. For
fp16, summed log-probs of tens to hundreds have a spacing of up to 0.06, so the logit h is
off by several fp16 steps before logsigmoid; its autograd gradient −β·σ(−h)/B inherits that.
fp32 passes; the contract allows fp32 arithmetic with one final rounding to fp16.

Backs FALSIFY-DPO-001/float16 (loss parity) and FALSIFY-DPO-004/float16 (gradients) of
dpo-loss-kernel-v1, binding LigerFusedLinearDPOFunction.preference_loss_fn.
Run: python liger_dpo_fp16.py (exit 1 = reproduces).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: CPU-only runs

import importlib.metadata  # noqa: E402
import sys  # noqa: E402

import mpmath  # noqa: E402
import torch  # noqa: E402
from liger_kernel.chunked_loss.dpo_loss import LigerFusedLinearDPOFunction  # noqa: E402

mpmath.mp.dps = 50
VERSION = importlib.metadata.version("liger-kernel")
EPS16, U32 = 2.0 ** -10, 1.1920929e-07
f16 = torch.float16


def loss_fn(pc, pr, rc, rr, beta):
    full_target = torch.empty(2 * pc.shape[0])  # Liger reads only its length (2B)
    return LigerFusedLinearDPOFunction.preference_loss_fn(pc, pr, full_target, rc, rr,
                                                          beta=beta, loss_type="sigmoid")[0]


def exact_h(pc, pr, rc, rr, beta):
    return mpmath.mpf(beta) * ((mpmath.mpf(pc) - rc) - (mpmath.mpf(pr) - rr))


def report(name, inp, call, lib, true, bound):
    err = abs(mpmath.mpf(lib) - true)
    bad = err > bound
    print(f"case {name}")
    print(f"input:   {inp}")
    print(f"library: liger-kernel {VERSION}: {call} = {lib!r}")
    print(f"true:    {mpmath.nstr(true, 12)}")
    print(f"bound:   {mpmath.nstr(mpmath.mpf(bound), 6)}")
    print(f"error:   {mpmath.nstr(err, 6)}")
    print("verdict:", "REPRODUCES: error > bound" if bad
          else "does not reproduce: error <= bound")
    print()
    return bad


bad = []
# FALSIFY-DPO-001/float16 (dpo-loss-kernel-v1): atol 3e-8 + (200 + 4·201)·eps32, rtol
# eps16/2 + (B + 4)·eps32: fp32 differences of log-probs up to 200, softplus, the mean, and
# ONE rounding to fp16. B = 1 pair.
pc, pr, rc, rr, beta = 0.0, 0.0, -46.78125, -125.25, 0.1
loss = loss_fn(*(torch.tensor([v], dtype=f16) for v in (pc, pr, rc, rr)), beta)
h = exact_h(pc, pr, rc, rr, beta)
true = -mpmath.log(1 / (1 + mpmath.exp(-h)))
bound = 3.0e-8 + (200 + 4 * 201) * U32 + (EPS16 / 2 + (1 + 4) * U32) * abs(true)
bad.append(report("FALSIFY-DPO-001/float16 (loss)",
                  f"pi_c = [{pc}], pi_r = [{pr}], ref_c = [{rc}], ref_r = [{rr}] (float16), "
                  f"beta = {beta}", "preference_loss_fn(..., loss_type='sigmoid') loss",
                  loss.item(), true, bound))

# FALSIFY-DPO-004/float16: autograd d loss / d pi_c = −β·σ(−h)/B; atol 3e-8 +
# 5.5·0.5·54·eps32, rtol eps16/2 (fp32 σ of an fp32 h, ONE rounding)
pc, pr, rc, rr, beta = -34.09375, 0.0, -127.25, -85.0, 0.5
tpc = torch.tensor([pc], dtype=f16, requires_grad=True)
loss = loss_fn(tpc, *(torch.tensor([v], dtype=f16) for v in (pr, rc, rr)), beta)
(g,) = torch.autograd.grad(loss, tpc)
h = exact_h(pc, pr, rc, rr, beta)
true = -mpmath.mpf(beta) / (1 + mpmath.exp(h))
bound = 3.0e-8 + 5.5 * 0.5 * 54 * U32 + EPS16 / 2 * abs(true)
bad.append(report("FALSIFY-DPO-004/float16 (gradient)",
                  f"pi_c = [{pc}], pi_r = [{pr}], ref_c = [{rc}], ref_r = [{rr}] (float16), "
                  f"beta = {beta}", "autograd d loss / d pi_c", g.item(), true, bound))
print(f"summary: {sum(bad)} of {len(bad)} cases beyond the contract's bound")
sys.exit(1 if any(bad) else 0)
