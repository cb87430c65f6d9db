"""device: on a GPU, every optimized backend agrees with its CPU result.

Seed-style failures (every GPU kernel within fp32 tolerance of the CPU one, the whole model
still drifting) start with kernels whose GPU and CPU paths were never compared. This kind runs
the same case twice in one process:

- the GPU side: the bound function on CUDA tensors (torch on CUDA; the Triton kernel compiled
  for the GPU);
- the CPU side: the same function on CPU tensors for torch. Triton has no CPU build outside
  its interpreter, and a process runs Triton either interpreted or compiled, never both, so
  for Triton the CPU side is the equation's torch binding on the CPU — "the kernel's CPU
  result" as a user of the equation sees it.

The bound is derived, not declared: `parity` names the contract's parity check of the same
equation, whose tolerance bounds each side's distance to the float64 reference,
|side − ref| ≤ atol + rtol·|ref|. The check enforces, per output:
1. the GPU result within that bound of the reference (parity on the GPU: the torch backend's
   parity checks run on the CPU, so without this nothing would ever run torch on CUDA);
2. the GPU and CPU results within 2·(atol + rtol·|ref|) of each other: by the triangle
   inequality, what two results that each satisfy the contract can differ by. A tighter claim
   would be bitwise agreement across devices, which neither compiler promises.
A failure of 1 says the GPU side is off from the truth; of 2 alone, the CPU side is.

Without a GPU — or with Triton forced into the interpreter on a GPU machine — the check does
not run: it is skipped (pytest's skip, which hypothesis re-raises at once) with a message
starting NO_GPU. It is never reported as passed: `pv coverage`
counts an obligation whose every check is a device check as `needs-gpu` (listed, outside the
percentage) until a run on a GPU records results for it.
"""

from __future__ import annotations

import os
import unittest

import numpy as np

from falsify.harness import backends
from falsify.harness.coverage import NO_GPU  # the skip message's prefix, which coverage reads
from falsify.harness.kinds.parity import compare
from falsify.harness.runtime import CheckFailed, Ctx

GPU = "cuda"  # the device the GPU side runs on (tests put "cpu" here to exercise the logic)


def unavailable(backend: str) -> str | None:
    """Why this backend cannot be compared across devices in this process, or None."""
    import torch

    if not torch.cuda.is_available():
        return f"{NO_GPU}: torch sees no CUDA device, so there is no GPU result to compare"
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        return (f"{NO_GPU}: Triton runs under the interpreter in this process "
                "(FALSIFY_TRITON=interpret), so its kernels cannot run on the GPU")
    return None


def _skip(why: str):
    try:
        import pytest
    except ImportError:  # outside pytest: the standard library's skip, which runners share
        raise unittest.SkipTest(why) from None
    pytest.skip(why)


def parity_check(ctx):
    """The parity check named by `parity`: the tolerance this check doubles."""
    name = ctx.spec.get("parity")
    t = ctx.contract.check(name) if name else None
    if t is None or not t.spec or t.kind != "parity":
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: parity {name!r} is not a "
                         "parity check of this contract")
    return t


def run(ctx, case):
    par = parity_check(ctx)  # a contract error before the device question
    why = unavailable(ctx.backend)
    if why:
        _skip(why)
    import torch

    ref = backends.outputs(backends.call(ctx.fn(backend="reference"), **ctx.ref_args(case)))
    spec_args = ctx.input_spec.get("args", {})
    gpu_args = backends.tensor_args(case, spec_args, (), GPU)
    gpu_args.update(ctx.call_kwargs(case))
    gpu = backends.outputs(backends.call(ctx.fn(), **gpu_args))  # to_numpy synchronizes
    cpu_backend = "torch" if ctx.backend == "triton" else ctx.backend
    cpu_args = backends.tensor_args(case, spec_args, (), "cpu")
    cpu_args.update(ctx.call_kwargs(case))
    cpu = backends.outputs(backends.call(ctx.fn(backend=cpu_backend), **cpu_args))
    bound = Ctx(ctx.contract, par, ctx.backend, ctx.variant)
    worst = 0.0
    for i in ctx.output_indices(range(len(ref))):
        if gpu[i].shape != cpu[i].shape:
            raise CheckFailed(f"output {i}: shape {gpu[i].shape} on the GPU, {cpu[i].shape} on "
                              "the CPU")
        finite = ref[i][np.isfinite(ref[i])]
        atol, rtol = bound.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
        compare(gpu[i], ref[i], atol, rtol, f"output {i} on the GPU ({ctx.backend}) against "
                "the float64 reference", terms=f"{par.id}'s tolerance, which this check reuses")
        with np.errstate(invalid="ignore"):
            d = np.abs(gpu[i] - cpu[i])
            same = (np.isnan(gpu[i]) & np.isnan(cpu[i])) | (gpu[i] == cpu[i])
            ok = same | (d <= 2 * (atol + rtol * np.abs(ref[i])))
        worst = max(worst, float(np.nanmax(np.where(same, 0.0, d), initial=0.0)))
        if not ok.all():
            at = tuple(int(v) for v in np.argwhere(~ok)[0])
            raise CheckFailed(
                f"output {i}: GPU {ctx.backend} and CPU {cpu_backend} differ by {d[at]:.3g} at "
                f"{at} ({gpu[i][at]!r} vs {cpu[i][at]!r}, reference {ref[i][at]!r}), beyond "
                f"twice {par.id}'s bound (atol={atol:.3g}, rtol={rtol:.3g}): one device "
                "computes something the other does not")
    name = torch.cuda.get_device_name() if GPU == "cuda" else GPU
    return {"gpu": name, "cpu_side": cpu_backend,
            "max_device_diff": worst}
