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

A third-party function bound under `falsify conformance` may declare dtypes it accepts beyond
the contract's (its API policy, falsify.harness.binding.active_policy): each of those is probed
too, and must return a result, not a refusal.
"""

from __future__ import annotations

import re

import numpy as np

from falsify.harness import backends, binding, cases
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


def _probe_args(ctx, case: cases.Case, dtype: str) -> dict:
    spec_args = ctx.input_spec.get("args", {})
    probe = _cast(case, spec_args, dtype)
    args = backends.tensor_args(probe, spec_args, (), backends.device_for(ctx.backend))
    args.update(ctx.call_kwargs(probe))
    return args


def _accepted(ctx, case: cases.Case, dtype: str) -> str:
    """A dtype the bound function declares it accepts: it returns a result (whose dtypes the
    detail records: a quantizer's float32 scales beside its codes are its format, not a
    silent cast), or CheckFailed. Its values are not judged here: no check of the contract
    runs in that dtype."""
    try:
        out = ctx.fn()(**_probe_args(ctx, case, dtype))
    except Exception as e:  # noqa: BLE001 - refusing a declared dtype is the finding itself
        raise CheckFailed(f"{dtype} is declared accepted by the bound function's policy, but "
                          f"it raised {type(e).__name__}: {e}") from e
    results = out if isinstance(out, (tuple, list)) else [out]
    got = [str(getattr(o, "dtype", type(o).__name__)).removeprefix("torch.") for o in results]
    return f"accepted: {', '.join(got)}"


# torch's own names of the dtypes, as its errors spell them ("not implemented for 'Long'",
# "found Long"): a message in torch's vocabulary names the dtype too
TORCH_NAMES = {"float64": "Double", "float32": "Float", "float16": "Half",
               "bfloat16": "BFloat16", "int64": "Long", "int32": "Int"}


def _names_dtype(msg: str, dtype: str) -> bool:
    return dtype in msg or re.search(rf"\b{TORCH_NAMES[dtype]}\b", msg) is not None


def _probe(ctx, case: cases.Case, dtype: str) -> str:
    """Call the backend with `dtype`; the refusal's message, or CheckFailed. A bound
    third-party function may declare the exception types it refuses with besides TypeError
    and ValueError (its policy's `errors`: torch's kernels raise NotImplementedError)."""
    args = _probe_args(ctx, case, dtype)
    before = _snapshot(args)
    fn = ctx.fn()
    errors = set(binding.active_policy(ctx.contract, ctx.equation, ctx.backend)
                 .get("errors") or ())
    try:
        out = fn(**args)
    except Exception as e:  # noqa: BLE001 - which exception it is, is what is judged
        if not isinstance(e, (TypeError, ValueError)) and type(e).__name__ not in errors:
            raise CheckFailed(f"{dtype} (not declared on {ctx.backend}) raised "
                              f"{type(e).__name__}: {e} — not a clear unsupported-dtype error "
                              "(TypeError or ValueError naming the dtype, raised before any "
                              "work)") from e
        msg = str(e)
        if not _names_dtype(msg, dtype):
            raise CheckFailed(f"{dtype} (not declared on {ctx.backend}) was refused with "
                              f"{type(e).__name__}: {msg!r}, which does not name the dtype") from e
        changed = [k for k in before if not _same_bits(before[k], args[k])]
        if changed:
            raise CheckFailed(f"{dtype} was refused only after writing into {changed}: the "
                              "dtype must be checked before any work") from e
        return f"{type(e).__name__}: {msg}"
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
    pinned = cases.pinned_cases(ctx.input_spec, base, ctx.spec.get("params"), where=where,
                                pins=ctx.pins)
    if not pinned:
        raise CheckFailed(f"{where} has no examples: the dtypes check probes the first one")
    accepts = set(binding.active_policy(ctx.contract, ctx.equation, ctx.backend)
                  .get("dtypes") or ()) - declared
    refused, accepted = {}, {}
    for dtype in PROBE:
        if dtype in declared or dtype in gpu_only:
            continue
        if dtype in accepts:
            accepted[dtype] = _accepted(ctx, pinned[0], dtype)
            continue
        refused[dtype] = _probe(ctx, pinned[0], dtype)
    detail = {"declared": sorted(declared), "refused": sorted(refused),
              "gpu_only_not_run": sorted(gpu_only - declared)}
    if accepted:
        detail["accepted_by_policy"] = sorted(accepted)
    return detail
