"""compile: a torch kernel under `torch.compile` (TorchDynamo + Inductor) agrees with itself run
eagerly, forward and backward, and compiles without graph breaks.

Users run these kernels inside compiled models, where Dynamo traces the Python and Inductor
generates fused C++ (CPU) or Triton (GPU) code: reductions may be split and reordered, casts
fused away, and a kernel may take another path altogether (`torch.compiler.is_compiling()`).
Each case runs eagerly and through `torch.compile(fn, dynamic=True)` in the same dtype, on
freshly built identical inputs. Tensor sizes are symbolic (one compilation serves many
shapes); Python float arguments (eps, beta, a temperature) are specialized as constants
(`specialize_float`), as a model's hyperparameters are, so a kernel's `math.isfinite(beta)`
validation is not mistaken for a graph break:

- forward: every output (or the check's `outputs`) of the compiled call against the eager
  call's. The bound is the triangle inequality over the reference: if |eager − ref| ≤ a + ρ·|ref|
  and |compiled − ref| ≤ a + ρ·|ref| (the parity bound holds for any order of the reduction it
  was derived for), then |compiled − eager| ≤ 2a/(1 − ρ) + 2ρ/(1 − ρ)·|eager| (|ref| is
  eliminated through |ref| ≤ (|eager| + a)/(1 − ρ)). `parity` names the parity check
  whose tolerance is doubled so (ref_max: max |eager|); a check may instead declare its own
  `tolerance` with the argument for a tighter bound in its `why`.
- backward (`gradient` names a gradient check of the equation): its `wrt` arguments
  require grad, its `outputs` receive its upstream gradients (the same dy, rounded to the case
  dtype), and autograd's gradients through the compiled call are compared with those through
  the eager call, under that check's tolerance doubled the same way.
- shape recompiles: a recompilation because a tensor size changed between two sizes ≥ 2
  (Dynamo's guard failure "size mismatch at index i. expected a, actual b"). Sizes stay
  symbolic under `dynamic=True` unless the kernel's Python reads one as a number: a chunk loop
  `range(0, T, C)`, a `min(T, …)`, a shape put into a set. Every such read is a guard, and a
  compiled model then recompiles for each new sequence length or batch size until Dynamo's
  recompile limit sends the frame back to eager, silently. One fails the check, unless the
  dim it changed is declared in `specializes: {dims, why}` (a chunk loop that bounds memory
  must read its size); those are recorded in the detail. Sizes 0 and 1 are specialized by
  Dynamo itself (broadcasting can depend on them), so a recompile to or from them never
  counts.
- graph breaks: Dynamo's reasons (torch._dynamo.utils.counters["graph_break"]), counted as
  distinct reasons over every compilation of the check. More than `max_graph_breaks` (default
  0) fails: a break splits the kernel into separately compiled pieces with eager Python
  between them, so the fusion a compiled model expects is gone, and usually it is a
  data-dependent `.item()` or Python branch that also costs a device sync.

No silent fallback: a missing C++ compiler, Dynamo disabled, or a compile that captured no
graph is an error of the check (RuntimeError), never a pass; Dynamo's `suppress_errors` (which
would run eagerly after a failed compile) is forced off and hitting the recompile limit raises.
A kernel that Dynamo or Inductor cannot compile fails the check (`CheckFailed`): that is the
finding, and its contract may declare `compile` inapplicable with the reason instead.

One compiled function serves every example of a check × backend × variant (with dynamic
shapes, a new shape rarely recompiles); `torch._dynamo.reset()` runs whenever the check,
dtype or implementation changes, so no compiled code or counter leaks between checks (nor
from a mutant into the honest kernel). Inductor's own on-disk cache (torch's default place,
or TORCHINDUCTOR_CACHE_DIR) is left as it is: its entries are keyed on the graph, the torch
version and the compiler, and torch decides where it lives before any check runs.
"""

from __future__ import annotations

import os
import re

import numpy as np

from falsify.harness import backends
from falsify.harness.kinds.gradient import _upstream
from falsify.harness.kinds.parity import compare, tolerance_terms
from falsify.harness.plan import runs
from falsify.harness.runtime import CheckFailed, tolerance

# compilation costs seconds per function and shape: the pinned examples and this many drawn
# cases show a divergence (it is a different program, wrong everywhere or on one shape class).
# runtime.max_examples caps every profile at a kind module's MAX_EXAMPLES.
MAX_EXAMPLES = 2


class CompileUnavailable(RuntimeError):
    """torch.compile cannot run here (no C++ compiler for Inductor, Dynamo disabled): the check
    cannot judge the kernel, so it errors rather than passing."""


_STATE: dict = {"key": None, "fn": None, "eager": None}


def _prepare() -> None:
    import torch._inductor.exc as inductor_exc
    from torch._inductor import cpp_builder

    if os.environ.get("TORCHDYNAMO_DISABLE", "") not in ("", "0"):
        raise CompileUnavailable("TORCHDYNAMO_DISABLE is set: torch.compile would return the "
                                 "eager function and the check would compare it with itself")
    try:
        cpp_builder.get_cpp_compiler()
    except inductor_exc.InvalidCxxCompiler as e:
        raise CompileUnavailable(
            "the compile check needs a C++ compiler for Inductor on the CPU and found none "
            f"({' '.join(str(e).split())[:300]}): install g++ or set CXX") from None


def _compiled(ctx, case):
    """The compiled binding for this check × backend × variant, compiled once; Dynamo's state
    is reset whenever any of them (or the implementation, as under a mutant) changes."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    fn = ctx.fn()
    key = (ctx.contract.id, ctx.check.id, ctx.backend, case.dtype, id(fn))
    if _STATE["key"] != key:
        _prepare()
        torch._dynamo.reset()
        counters.clear()
        _STATE.update(key=key, fn=torch.compile(fn, dynamic=True), eager=fn)
    return _STATE["eager"], _STATE["fn"]


def reset() -> None:
    """Forget the compiled function and Dynamo's caches (tests; a process that is done)."""
    import torch._dynamo

    _STATE.update(key=None, fn=None, eager=None)
    torch._dynamo.reset()


def _call_compiled(fn, *args, **kwargs):
    """Run compiled code (a compiled function, or autograd through one): a failure to
    compile is the kernel's finding, never a quiet fallback to eager."""
    import torch._dynamo

    try:
        with torch._dynamo.config.patch(suppress_errors=False, specialize_float=True,
                                        fail_on_recompile_limit_hit=True):
            return fn(*args, **kwargs)
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - a kernel Dynamo/Inductor cannot compile: a finding
        if isinstance(e, CompileUnavailable):
            raise
        msg = " ".join(str(e).split())
        if type(e).__name__ == "FailOnRecompileLimitHit":  # say which sizes forced them
            seen = _graph_state()["shape_recompiles"]
            msg += (f"; {len(seen)} of the recompilations were for a new tensor size: " +
                    "; ".join(f"{a}.shape[{i}] {x} → {y}" for a, i, x, y in seen[:5])
                    if seen else "")
        raise CheckFailed(f"torch.compile failed: {type(e).__name__}: {msg[:1500]}") from e


def doubled(atol: float, rtol: float) -> tuple[float, float]:
    """The eager-vs-compiled bound from a parity bound (a, ρ) against the reference, by the
    triangle inequality with |ref| eliminated: (2a/(1 − ρ), 2ρ/(1 − ρ))."""
    if rtol >= 1:
        raise ValueError(f"rtol {rtol:.3g} ≥ 1 bounds nothing relative to the result")
    return 2 * atol / (1 - rtol), 2 * rtol / (1 - rtol)


def _bound(ctx, case, source_id: str | None, values: np.ndarray) -> tuple[float, float, str]:
    """(atol, rtol, terms) for comparing compiled with eager: the named check's tolerance
    doubled, or this check's own `tolerance` as declared."""
    finite = values[np.isfinite(values)]
    ref_max = float(np.abs(finite).max()) if finite.size else 0.0
    dims = {**_scalars(case), **case.dims}
    if source_id is None:
        atol, rtol = ctx.tol(case, ref_max)
        return atol, rtol, tolerance_terms(ctx, case, atol, rtol)
    src = ctx.contract.check(source_id)
    a, r = tolerance(src.spec, case.dtype, dims, ref_max)
    atol, rtol = doubled(a, r)
    return atol, rtol, (f"2a/(1 − ρ), 2ρ/(1 − ρ) from {source_id}'s a = {a:.3g}, ρ = {r:.3g} "
                        "(triangle inequality through the reference)")


def _scalars(case) -> dict:
    from falsify.harness import expr

    return expr.scalar_args(case.args)


_SIZE_MISMATCH = re.compile(r"tensor '(.+?)' size mismatch at index (\d+)\. "
                            r"expected (\d+), actual (\d+)")


def shape_recompiles(failures) -> list[tuple[str, int, int, int]]:
    """The distinct recompilations in Dynamo's guard-failure texts caused by a tensor size
    changing between two sizes ≥ 2 (the kernel specialized on that size): (argument, axis,
    size before, size after)."""
    out = set()
    for text in failures:
        for name, index, a, b in _SIZE_MISMATCH.findall(str(text)):
            if int(a) >= 2 and int(b) >= 2:
                inner = re.fullmatch(r"(?:kwargs|args)\[['\"]?(.+?)['\"]?\]", name)
                out.add((inner.group(1) if inner else name, int(index), int(a), int(b)))
    return sorted(out)


def _dim_of(ctx, arg: str, axis: int):
    """The input's name for axis `axis` of argument `arg` (None when it has none)."""
    spec = (ctx.contract.inputs.get(ctx.spec.get("input")) or {}).get("args", {}).get(arg)
    shape = spec.get("shape") if isinstance(spec, dict) else None
    return shape[axis] if isinstance(shape, list) and axis < len(shape) else None


def _graph_state() -> dict:
    from torch._dynamo.utils import counters, guard_failures

    reasons = sorted(counters["graph_break"])
    failures = [t for texts in guard_failures.values() for t in texts]
    return {"graphs": int(counters["stats"]["unique_graphs"]), "reasons": reasons,
            "shape_recompiles": shape_recompiles(failures)}


def _judge_recompiles(ctx, state) -> list[str]:
    """Fail on a recompilation for a new size of a dim the check does not declare in
    `specializes` (with the reason the kernel must read it); the declared ones, described."""
    allowed = set((ctx.spec.get("specializes") or {}).get("dims") or ())
    seen, bad = [], []
    for arg, axis, a, b in state["shape_recompiles"]:
        dim = _dim_of(ctx, arg, axis)
        text = f"{arg}.shape[{axis}]" + (f" ({dim})" if dim is not None else "") + f" {a} → {b}"
        (seen if dim in allowed else bad).append(text)
    if bad:
        raise CheckFailed(
            f"{len(bad)} recompilation(s) for a new tensor size under torch.compile: "
            f"{'; '.join(bad[:5])}. The kernel's Python reads the size as a number (a chunk "
            "loop over range(0, n, c), min(n, ...), a shape hashed into a set), so a compiled "
            "model recompiles for every new size of it (declare the dim in `specializes`, "
            "with why, if the kernel must)")
    return seen


def run(ctx, case):
    import torch

    if ctx.backend != "torch":
        raise ValueError(f"{ctx.contract.id}: check {ctx.check.id}: the compile kind runs "
                         f"torch bindings only, not {ctx.backend!r}")
    eager, cfn = _compiled(ctx, case)
    grad_id = ctx.spec.get("gradient")
    gspec = ctx.contract.check(grad_id).spec if grad_id else {}
    # the backward is compared in the dtypes its gradient check runs (the forward in all)
    ran = {r.variant for r in runs(ctx.contract, ctx.contract.check(grad_id))} if grad_id else ()
    wrt = tuple(gspec.get("wrt") or ()) if case.dtype in ran else ()

    e_args, c_args = ctx.args(case, requires_grad=wrt), ctx.args(case, requires_grad=wrt)
    eager_out = backends.call(eager, **e_args)
    compiled_out = _call_compiled(cfn, **c_args)
    state = _graph_state()
    if state["graphs"] == 0 and not state["reasons"]:
        raise CompileUnavailable("torch.compile captured no graph: Dynamo skipped the function "
                                 "(disabled, or its code is on Dynamo's skip list), so the "
                                 "compiled call ran eagerly and proves nothing")
    limit = int(ctx.spec.get("max_graph_breaks", 0))
    if len(state["reasons"]) > limit:
        raise CheckFailed(f"{len(state['reasons'])} graph break(s) under torch.compile "
                          f"(max_graph_breaks: {limit}): " + "; ".join(
                              " ".join(r.split())[:300] for r in state["reasons"][:5]))

    e_list = list(eager_out) if isinstance(eager_out, (tuple, list)) else [eager_out]
    c_list = list(compiled_out) if isinstance(compiled_out, (tuple, list)) else [compiled_out]
    if len(c_list) != len(e_list):
        raise CheckFailed(f"compiled call returned {len(c_list)} output(s), eager {len(e_list)}")
    e_np, c_np = backends.outputs(e_list), backends.outputs(c_list)
    for i in ctx.output_indices(range(len(e_np))):
        atol, rtol, terms = _bound(ctx, case, ctx.spec.get("parity"), e_np[i])
        compare(c_np[i], e_np[i], atol, rtol,
                f"compiled (got) vs eager (reference), output {i}", None, terms)

    if wrt:
        ge = _grads(ctx, case, gspec, grad_id, wrt, e_list, e_args, "eager", backends.call)
        gc = _grads(ctx, case, gspec, grad_id, wrt, c_list, c_args, "compiled", _call_compiled)
        for w in wrt:
            atol, rtol, terms = _bound(ctx, case, grad_id, ge[w])
            compare(gc[w], ge[w], atol, rtol,
                    f"compiled (got) vs eager (reference), d/d{w}", None, terms)
        state = _graph_state()  # the backward compiles on first use
    specialized = _judge_recompiles(ctx, state)
    return {"graph_breaks": len(state["reasons"]), "graphs": state["graphs"],
            "shape_recompiles": specialized,
            "backward": bool(wrt), "dynamic": True,
            "torch": torch.__version__.split("+")[0]}


def _grads(ctx, case, gspec, grad_id, wrt, outs, args, label, call) -> dict:
    """Autograd's gradients of L = Σ_k Σ y_k·dy_k (the gradient check's outputs and upstream
    gradients) with respect to its `wrt` arguments, as float64 numpy arrays."""
    import torch

    from falsify.harness.plan import output_index

    eq = ctx.contract.equations.get(ctx.equation)
    selected = [output_index(eq, e) for e in gspec.get("outputs") or [0]]
    dtype = case.dtype if case.dtype.startswith(("float", "bfloat")) else "float64"
    ys, dys = [], []
    for k in selected:
        y = outs[k] if k < len(outs) else None
        if not (isinstance(y, torch.Tensor) and y.requires_grad):
            raise CheckFailed(f"{label} output {k} has no autograd graph, but {grad_id} "
                              "differentiates it")
        dy = _upstream(tuple(y.shape), case.seed if k == 0 else [case.seed, k], dtype)
        ys.append(y)
        dys.append(torch.from_numpy(dy).to(device=y.device, dtype=y.dtype))
    grads = call(torch.autograd.grad, ys, [args[w] for w in wrt], grad_outputs=dys,
                 allow_unused=True)
    out = {}
    for w, g in zip(wrt, grads):
        if g is None:
            raise CheckFailed(f"{label}: no gradient reached {w!r}")
        out[w] = backends.to_numpy(g)
    return out
