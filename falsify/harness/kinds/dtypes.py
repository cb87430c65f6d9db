"""dtypes: what a contract declares about dtypes is exactly what the backend accepts.

The dtypes an equation declares on a backend are the dtypes its checks run there (each check's
`dtypes`, else its input's), plus, on Triton, the equation's `gpu_only` dtypes, each declared
with its reason. Those are shown to work by the other checks. This check probes every other
dtype of PROBE, one call each on the input's first pinned example with its floating arguments
cast (arguments that declare their own dtype, such as integer targets, are left as they are):

- the backend must refuse it with a TypeError or ValueError whose message names the dtype,
  before doing anything: every input tensor is compared bit for bit with a copy taken before
  the call, so a kernel that wrote into its inputs and then failed is caught;
- returning a result is a failure: a kernel that silently accepts float64 and computes in
  float32 (or rounds integers through a float kernel) hands back numbers no check has vetted;
- raising anything else (a RuntimeError from deep inside torch, an IndexError) is a failure
  too: the user learns what went wrong only from a traceback into the kernel.

A `gpu_only` dtype is neither run nor probed here; the detail lists it as not run.
"""

from __future__ import annotations

import numpy as np

from falsify.harness import backends, cases
from falsify.harness.plan import INPUT_KINDS, backends_of, equation_of, variants_of
from falsify.harness.runtime import CheckFailed

# every floating dtype a kernel is commonly handed, and the integer types a float kernel must
# not round through
PROBE = ("float64", "float32", "float16", "bfloat16", "int64", "int32")


def declared_dtypes(c, equation: str, backend: str) -> set[str]:
    """The dtypes the contract's checks run `equation` in on `backend`."""
    out = set()
    for t in c.checks:
        if (t.spec and t.kind in INPUT_KINDS and t.kind != "dtypes"
                and equation_of(c, t) == equation and backend in backends_of(c, t)):
            out |= set(variants_of(c, t))
    return out


def _cast(case: cases.Case, spec_args: dict, dtype: str) -> cases.Case:
    """The case with every argument that follows the case dtype converted to `dtype`."""
    args = {}
    for k, v in case.args.items():
        follows = "dtype" not in spec_args.get(k, {})
        if follows and isinstance(v, np.ndarray) and v.dtype.kind == "f":
            v = np.rint(v) if dtype.startswith("int") else v
            v = cases.round_to(np.asarray(v, np.float64), dtype)
        args[k] = v
    return cases.Case(dtype, dict(case.dims), args, dict(case.params), case.seed, case.label)


def _snapshot(args: dict) -> dict:
    import torch

    return {k: v.detach().clone() for k, v in args.items() if isinstance(v, torch.Tensor)}


def _probe(ctx, case: cases.Case, dtype: str) -> str:
    """Call the backend with `dtype`; the refusal's message, or CheckFailed."""
    spec_args = ctx.input_spec.get("args", {})
    probe = _cast(case, spec_args, dtype)
    args = backends.tensor_args(probe, spec_args, (), backends.device_for(ctx.backend))
    args.update(ctx.call_kwargs(probe))
    before = _snapshot(args)
    fn = ctx.fn()
    try:
        out = fn(**args)
    except (TypeError, ValueError) as e:
        msg = str(e)
        if dtype not in msg:
            raise CheckFailed(f"{dtype} (not declared on {ctx.backend}) was refused with "
                              f"{type(e).__name__}: {msg!r}, which does not name the dtype") from e
        changed = [k for k in before if not _same_bits(before[k], args[k])]
        if changed:
            raise CheckFailed(f"{dtype} was refused only after writing into {changed}: the "
                              "dtype must be checked before any work") from e
        return f"{type(e).__name__}: {msg}"
    except Exception as e:  # noqa: BLE001 - any other exception is the finding itself
        raise CheckFailed(f"{dtype} (not declared on {ctx.backend}) raised {type(e).__name__}: "
                          f"{e} — not a clear unsupported-dtype error (TypeError or ValueError "
                          "naming the dtype, raised before any work)") from e
    got = ", ".join(f"{str(getattr(o, 'dtype', type(o).__name__)).removeprefix('torch.')}"
                    f"{list(getattr(o, 'shape', ()))}"
                    for o in (out if isinstance(out, (tuple, list)) else [out]))
    raise CheckFailed(f"accepted {dtype}, which the contract does not declare on {ctx.backend} "
                      f"(declared: {', '.join(sorted(_declared(ctx)))}), and returned {got}: "
                      "refuse it with a clear error before launch, or declare it and check it")


def _same_bits(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:  # bits, so that NaN equals NaN and −0.0 differs from 0.0
        return bool(torch.equal(a.reshape(-1).contiguous().view(torch.uint8),
                                b.detach().reshape(-1).contiguous().view(torch.uint8)))
    return bool(torch.equal(a, b.detach()))


def _declared(ctx) -> set[str]:
    return declared_dtypes(ctx.contract, ctx.equation, ctx.backend)


def run(ctx, case=None):
    if ctx.backend == "reference":
        raise CheckFailed("the dtypes kind probes optimized backends; the float64 reference "
                          "takes every dtype by design")
    if not cases.dtype_takers(ctx.input_spec, ctx.spec.get("call")):
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: no argument of input "
                         f"{ctx.spec['input']!r} takes the case dtype (each declares its own "
                         "`dtype`) and no `call:` reads `dtype`, so a dtypes probe would change "
                         "nothing; declare `dtypes` inapplicable, or probe an input whose "
                         "tensors follow the case dtype")
    declared = _declared(ctx)
    if not declared:
        raise CheckFailed(f"no check runs {ctx.equation} on {ctx.backend}: nothing is declared "
                          "to compare with")
    eq = ctx.contract.equations.get(ctx.equation)
    gpu_only = set(eq.gpu_only) if eq is not None and ctx.backend == "triton" else set()
    where = f"{ctx.contract.id}.inputs.{ctx.spec['input']}"
    base = sorted(declared)[0]
    pinned = cases.pinned_cases(ctx.input_spec, base, ctx.spec.get("params"), where=where)
    if not pinned:
        raise CheckFailed(f"{where} has no examples: the dtypes check probes the first one")
    refused = {}
    for dtype in PROBE:
        if dtype in declared or dtype in gpu_only:
            continue
        refused[dtype] = _probe(ctx, pinned[0], dtype)
    return {"declared": sorted(declared), "refused": sorted(refused),
            "gpu_only_not_run": sorted(gpu_only - declared)}
