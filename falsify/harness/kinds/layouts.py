"""layouts: the backend reads any strided view its inputs arrive as, and does what the contract
says for a size-0 dimension.

Fresh contiguous tensors are what every other check passes, and what a kernel's author tested.
A training loop hands a kernel transposed weights, a slice taken with a step, a broadcast bias
(stride 0), and, at the end of a ragged batch, a dimension of size 0. Each drawn case is run
here as:

- views (optimized backends): every tensor argument of the case rebuilt with the same values
  as a noncontiguous view, one layout at a time (VIEWS):
    transposed  the last two axes stored transposed (strides swapped; tensors of ≥ 2 dims),
    strided     every other element of a buffer twice as long in the last axis (stride(-1) = 2;
                the skipped elements hold NaN, or the largest integer, so reading them shows),
    expanded    the values repeated along the first axis of size > 1 and passed as one row
                expanded there (stride 0): the reference gets the same repeated values. An
                argument its input builds (`build`: packed blocks) is expanded along its
                leading axis only, so every row stays one the builder could make.
  The outputs must agree with the float64 reference within the tolerance of the contract's
  parity check named in `parity` (whose `call` and `outputs` apply too), and every input must
  be bit-identical after the call: a kernel that writes into an expanded input writes one
  element many times, one that writes into any input corrupts the caller's tensor. Arguments
  listed in `writes` are the function's in-place results: they are drawn as transposed and
  stepped views too (the result must land in the view, not in the gaps around it), never
  expanded, and are exempt from the no-write rule. The elements a stepped view skips must
  hold their filler afterwards, for every argument: a kernel writes nothing outside its view.
- zero_size (every backend it binds, the reference included): for each dim of `zero_size`, the
  case with that dim set to 0 (every argument sliced to its shape at 0). `empty`: the backend
  returns what the float64 reference returns — the same shapes (a size-0 output where the dim
  survives) and values (an empty sum is 0) — without raising; `error`: it raises a ValueError
  whose message names the dim as `<dim> = 0` before any work (inputs untouched). A kernel that
  launches a zero-size grid and crashes, or returns an output of the wrong shape, fails.
- leading (optimized backends): for each dim listed, a batch axis that comes first in every
  argument it sizes, the case with that axis dropped (every such argument taken at index 0:
  one dimension fewer, a softmax over one row) and with a leading axis of 1 added (one more
  dimension). The outputs must agree with the reference's on the same arguments within the
  parity tolerance: a wrapper that accepts only the rank it was tested at (`x.dim() < 2`
  refused, or `x.view(-1, n)` without restoring the shape) fails. A reference that cannot
  take the arguments is an error of the contract, not a verdict.

The cases are small by construction: the library caps the kind at MAX_EXAMPLES examples per
run and replays no pinned example (layout bugs show on any shape; cost grows with the number of
Triton programs, ~0.4 ms each under the interpreter).
"""

from __future__ import annotations

import re

import numpy as np

from falsify.harness import backends, binding, cases
from falsify.harness.kinds.parity import compare, judge_for, tolerance_terms
from falsify.harness.runtime import CheckFailed, Ctx

VIEWS = ("transposed", "strided", "expanded")
# read by runtime.max_examples and runtime.examples, as for every kind module
MAX_EXAMPLES = 5
PINNED_EXAMPLES = False


def parity_ctx(ctx) -> Ctx:
    """The named parity check's context: its tolerance, `call` and `outputs` judge the views."""
    pid = ctx.spec.get("parity")
    p = ctx.contract.check(pid) if pid else None
    if p is None or not p.spec or p.kind != "parity":
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: parity {pid!r} is not a "
                         "parity check of the contract")
    return Ctx(ctx.contract, p, ctx.backend, ctx.variant)


# ---------------------------------------------------------------- views
def _filler(t):
    import torch

    return float("nan") if t.dtype.is_floating_point else (
        True if t.dtype == torch.bool else int(torch.iinfo(t.dtype).max))


def _transposed(t):
    if t.dim() < 2:
        return None
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _strided(t):
    import torch

    if t.dim() < 1:
        return None
    shape = tuple(t.shape)
    buf = torch.full(shape[:-1] + (2 * shape[-1],), _filler(t), dtype=t.dtype, device=t.device)
    view = buf[..., ::2]
    view.copy_(t)
    return view


def _gaps_intact(view) -> bool:
    """The elements a stepped view skips (every other one of its buffer) still hold the
    filler: nothing was written outside the view."""
    import torch

    gaps = view._base[..., 1::2]
    if gaps.dtype.is_floating_point:
        return bool(torch.isnan(gaps).all())
    return bool((gaps == _filler(gaps)).all())


def _expand_axis(a: np.ndarray, built: bool = False) -> int | None:
    """The first axis of size > 1; for a built argument (its input's `build` encodes values
    along its inner axes, as packed quantized blocks do) only its leading axis: repeating the
    first byte of a GGUF super-block along its row makes a scale of fp16(b, b) (~13,000 for
    b = 114), values the builder never makes and the parity bound was not derived for."""
    if built:
        return 0 if a.shape and a.shape[0] > 1 else None
    return next((i for i, s in enumerate(a.shape) if s > 1), None)


def _expanded_case(case: cases.Case, names: list[str],
                   built=frozenset()) -> tuple[cases.Case, dict]:
    """The case with each named array repeated along its first axis of size > 1 (a `built`
    one along its leading axis only), and that axis for each (the arrays without one keep
    their values and layout)."""
    args, axes = dict(case.args), {}
    for k in names:
        a = case.args[k]
        ax = _expand_axis(a, k in built)
        if ax is None:
            continue
        row = np.take(a, [0], axis=ax)
        args[k] = np.ascontiguousarray(np.broadcast_to(row, a.shape))
        axes[k] = ax
    return cases.Case(case.dtype, case.dims, args, case.params, case.seed, case.label), axes


def _tensor_names(case: cases.Case, no_expand=()) -> list[str]:
    return [k for k, v in case.args.items()
            if isinstance(v, np.ndarray) and v.ndim >= 1 and v.size > 0 and k not in no_expand]


def _bytes(t):
    import torch

    # a fresh tensor: .contiguous() keeps the strides of a view whose dims are all 1
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t).view(-1).view(
        torch.uint8)


def _same_bits(a, b) -> bool:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        # bits, so that NaN equals NaN and −0.0 differs from 0.0
        return bool(torch.equal(_bytes(a), _bytes(b.detach())))
    return bool(torch.equal(a, b.detach()))


def _run_view(ctx, pctx, case: cases.Case, layout: str) -> bool:
    """One layout: False when no argument of the case can take it (nothing ran)."""
    import torch

    writes = tuple(ctx.spec.get("writes") or ())
    names = _tensor_names(case, tuple(ctx.spec.get("no_expand") or ()) + writes)
    axes = {}
    if layout == "expanded":
        built = {k for k, a in (ctx.input_spec.get("args") or {}).items() if a.get("build")}
        case, axes = _expanded_case(case, names, built)
    args = pctx.args(case)
    replaced = {}
    for k in _tensor_names(case):
        v = args.get(k)
        if not isinstance(v, torch.Tensor) or k in pctx.call_kwargs(case):
            continue
        if layout == "transposed":
            w = _transposed(v)
        elif layout == "strided":
            w = _strided(v)
        else:
            w = (v.narrow(axes[k], 0, 1).clone().expand(v.shape) if k in axes else None)
        if w is not None:
            args[k] = replaced[k] = w
    if not replaced:
        return False
    # the storage behind each view, bit for bit: an expanded input's one row included
    before = {k: (w.detach().clone(), w) for k, w in replaced.items()}
    before.update({k: (v.detach().clone(), v) for k, v in args.items()
                   if isinstance(v, torch.Tensor) and k not in replaced})
    ref_fn = pctx.fn(backend="reference")
    ref = backends.outputs(backends.call(ref_fn, **pctx.ref_args(case)))
    got = backends.outputs(backends.call(pctx.fn(), **args))
    written = [k for k, (snap, t) in before.items()
               if k not in writes and not _same_bits(snap, t)]
    if written:
        raise CheckFailed(f"{layout} views: the backend wrote into its input(s) "
                          f"{', '.join(written)}")
    if layout == "strided":
        gaps = [k for k, w in replaced.items() if not _gaps_intact(w)]
        if gaps:
            raise CheckFailed(f"strided views: the backend wrote between the elements of "
                              f"{', '.join(gaps)} (outside the view it was given)")
    if len(got) < len(ref):
        raise CheckFailed(f"{layout} views: backend returned {len(got)} output(s), reference "
                          f"{len(ref)}")
    where = ", ".join(f"{k} stride {tuple(w.stride())}" for k, w in replaced.items())
    for i in pctx.output_indices(range(len(ref))):
        finite = ref[i][np.isfinite(ref[i])]
        atol, rtol = pctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
        judge = judge_for(ref_fn, pctx.ref_args(case), lambda outs, idx, i=i: outs[i][idx],
                          case.dtype)
        compare(got[i], ref[i], atol, rtol, f"{layout} views ({where}): output {i}", judge,
                tolerance_terms(pctx, case, atol, rtol))
    return True


# ---------------------------------------------------------------- size 0
def zero_case(ctx, case: cases.Case, dim: str) -> cases.Case:
    """The case with `dim` = 0: every array argument sliced to its declared shape there."""
    dims0 = {**case.dims, dim: 0}
    where = f"{ctx.contract.id}.inputs.{ctx.spec.get('input')}"
    args = dict(case.args)
    for k, a in (ctx.input_spec.get("args") or {}).items():
        v = case.args.get(k)
        if not (isinstance(v, np.ndarray) and "shape" in a):
            continue
        shape = cases.shape_of(a, dims0, f"{where}.args.{k}.shape")
        if len(shape) != v.ndim or any(s > n for s, n in zip(shape, v.shape)):
            raise ValueError(f"{where}.args.{k}: shape {shape} at {dim} = 0 is not a slice of "
                             f"{v.shape}")
        args[k] = np.ascontiguousarray(v[tuple(slice(0, s) for s in shape)])
    return cases.Case(case.dtype, dims0, args, case.params, case.seed, case.label)


def names_dim(msg: str, dim: str) -> bool:
    """`msg` names the dim as `<dim> = 0` (or `==`), in any case: a kernel's message may write
    the contract's `hkv` as `Hkv`."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(dim)}\s*==?\s*0(?![0-9.])", msg,
                     re.IGNORECASE) is not None


def _snapshot(args: dict) -> dict:
    import torch

    out = {}
    for k, v in args.items():
        if isinstance(v, np.ndarray):
            out[k] = (v.copy(), v)
        elif isinstance(v, torch.Tensor):
            out[k] = (v.detach().clone(), v)
    return out


def _written(snap: dict) -> list[str]:
    bad = []
    for k, (s, v) in snap.items():
        same = (np.array_equal(s, v, equal_nan=True) if isinstance(s, np.ndarray)
                else _same_bits(s, v))
        if not same:
            bad.append(k)
    return bad


def _run_zero(ctx, pctx, case: cases.Case, dim: str, rule: str, by_policy: bool = False) -> str:
    case0 = zero_case(ctx, case, dim)
    args = pctx.args(case0)
    snap = {k: v for k, v in _snapshot(args).items() if k not in (ctx.spec.get("writes") or ())}
    fn = pctx.fn()
    label = f"{dim} = 0 (rule: {rule})"
    if rule == "raises":  # a bound third-party function's declared rule: any exception
        try:
            out = fn(**args)
        except Exception as e:  # noqa: BLE001 - raising is what the binding declares
            return f"raises {type(e).__name__}"
        shapes = [tuple(np.shape(o)) for o in backends.outputs(out)]
        raise CheckFailed(f"{label}: declared by the bound function's policy to raise, but "
                          f"returned outputs of shape(s) {shapes}")
    try:
        out = fn(**args)
    except ValueError as e:
        if rule == "empty":
            raise CheckFailed(f"{label}: raised ValueError: {e}; the contract says the result "
                              "is empty (the reference's shapes and values)") from e
        if not names_dim(str(e), dim):
            raise CheckFailed(f"{label}: raised ValueError {str(e)!r}, which does not name the "
                              f"dim as '{dim} = 0'") from e
        changed = _written(snap)
        if changed:
            raise CheckFailed(f"{label}: refused only after writing into {changed}") from None
        return "error"
    except Exception as e:  # noqa: BLE001 - a crash on size 0 is the finding itself
        raise CheckFailed(f"{label}: raised {type(e).__name__}: {e} — not the declared "
                          + ("result" if rule == "empty" else
                             f"ValueError naming '{dim} = 0' before launch")) from e
    if rule == "error":
        shapes = [tuple(np.shape(o)) for o in backends.outputs(out)]
        raise CheckFailed(f"{label}: returned outputs of shape(s) {shapes} instead of raising "
                          f"a ValueError naming '{dim} = 0'")
    changed = _written(snap)
    if changed:
        raise CheckFailed(f"{label}: wrote into its input(s) {', '.join(changed)}")
    if ctx.backend == "reference":
        return "empty"
    got = backends.outputs(out)
    try:
        ref = backends.outputs(backends.call(pctx.fn(backend="reference"),
                                             **pctx.ref_args(case0)))
    except backends.ImplementationRaised as e:
        if not (by_policy and isinstance(e.__cause__, ValueError)):
            raise
        # the contract's own rule is an error, so its reference refuses: a bound function
        # whose declared rule is `empty` must at least return nothing
        full = [tuple(np.shape(o)) for o in got if np.size(o)]
        if full:
            raise CheckFailed(f"{label}: declared empty by the bound function's policy, but "
                              f"returned outputs of shape(s) {full}") from None
        return "empty"
    # the tolerance of the case before the dim was emptied: its expressions may divide by or
    # take the log of a dim
    _agree(pctx, case, got, ref, label)
    return "empty"


def _agree(pctx, case: cases.Case, got: list, ref: list, label: str) -> None:
    """The backend's outputs (those the parity check selects) agree with the reference's within
    the parity tolerance evaluated at `case`."""
    if len(got) < len(ref):
        raise CheckFailed(f"{label}: backend returned {len(got)} output(s), reference "
                          f"{len(ref)}")
    for i in pctx.output_indices(range(len(ref))):
        finite = ref[i][np.isfinite(ref[i])]
        atol, rtol = pctx.tol(case, float(np.abs(finite).max()) if finite.size else 0.0)
        compare(got[i], ref[i], atol, rtol, f"{label}: output {i}")


# ---------------------------------------------------------------- rank of the batch axes
def leading_case(ctx, case: cases.Case, dim: str, how: str) -> cases.Case:
    """The case with `dim`, the first axis of every argument it sizes, dropped (index 0) or
    with a leading axis of 1 added in front of it."""
    args = dict(case.args)
    for k, a in (ctx.input_spec.get("args") or {}).items():
        v = case.args.get(k)
        shape = a.get("shape") if isinstance(a, dict) else None
        if isinstance(v, np.ndarray) and isinstance(shape, list) and shape and shape[0] == dim:
            args[k] = np.ascontiguousarray(v[0] if how == "dropped" else v[None])
    return cases.Case(case.dtype, case.dims, args, case.params, case.seed, case.label)


def _run_leading(ctx, pctx, case: cases.Case, dim: str, how: str) -> None:
    variant = leading_case(ctx, case, dim, how)
    label = f"{dim} {how} ({'one dimension fewer' if how == 'dropped' else 'a leading 1'})"
    try:
        ref = backends.outputs(backends.call(pctx.fn(backend="reference"),
                                             **pctx.ref_args(variant)))
    except Exception as e:  # the contract's reference, not the implementation under test
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: leading {dim!r}: the "
                         f"reference cannot take the arguments with {label}: "
                         f"{type(e).__name__}: {e}") from e
    try:
        got = backends.outputs(pctx.fn()(**pctx.args(variant)))
    except Exception as e:  # noqa: BLE001 - refusing a rank the equation covers is the finding
        raise CheckFailed(f"{label}: raised {type(e).__name__}: {e}; the reference returns "
                          f"shape(s) {[tuple(np.shape(r)) for r in ref]}") from e
    _agree(pctx, case, got, ref, label)


def run(ctx, case):
    pctx = parity_ctx(ctx)
    detail = {"zero_size": {}, "views": [], "leading": []}
    # a bound third-party function's own size-0 rules replace the contract's (conformance)
    own = binding.active_policy(ctx.contract, ctx.equation, ctx.backend).get("zero_size") or {}
    for dim, rule in (ctx.spec.get("zero_size") or {}).items():
        if dim not in case.dims:
            raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: zero_size names {dim!r}, "
                             f"not a dim of input {ctx.spec.get('input')!r}")
        rule, by_policy = own.get(dim, rule), dim in own
        detail["zero_size"][dim] = _run_zero(ctx, pctx, case, dim, rule, by_policy)
    if ctx.backend != "reference":
        for layout in ctx.spec.get("views") or VIEWS:
            if _run_view(ctx, pctx, case, layout):
                detail["views"].append(layout)
        for dim in ctx.spec.get("leading") or ():
            for how in ("dropped", "unsqueezed"):
                _run_leading(ctx, pctx, case, dim, how)
                detail["leading"].append(f"{dim} {how}")
    return detail
