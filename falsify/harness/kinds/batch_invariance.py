"""batch_invariance: a row's result does not depend on how many other rows share the call.

`batch` names the input dim the rows run along (`m` for x [m, n]). Row 0 of the drawn case is
computed alone (batch size 1), then placed in the middle of batches of each size in `sizes`
(default 7 and 4099) whose other rows are the case's rows drawn at random, and its output row
(axis 0 of every output) must be bit-identical to the one computed alone. Inference engines
need this for reproducible sampling: a reduction whose split depends on the batch size (a
GEMM choosing another blocking for m = 1, a split-K picked from the grid size) breaks it.

A kernel that is not batch-invariant says so: the check's `tolerance` (with its `why`) is the
bound on the difference it then enforces, and the ledger entry records `invariant: false`.
Arguments without the dim (weights, positions, scalars) are passed unchanged.

Under the Triton interpreter every program instance runs as Python (~1.5 ms each), so there a
batch is capped at INTERPRETED_MAX_ROWS rows (67: past a 64-row block, where a launch
configuration chosen from the row count would flip) and at INTERPRETED_MAX_ELEMENTS elements of
the largest batched argument, never below the smallest declared size; the ledger entry
records the sizes that ran, and a GPU runs the declared ones. What is interpreted is measured,
not read from the backend's name: the call of row 0 alone counts the grids it launched under the
interpreter, so a third-party Triton kernel bound as `torch` is capped as ours are (uncapped,
Liger's cross-entropy spent 470 of its 519 seconds here, on 4,099 interpreted rows per
example), and a torch function is never capped."""

import numpy as np

from falsify import triton_env
from falsify.harness import backends, cases
from falsify.harness.kinds.determinism import compare
from falsify.harness.runtime import CheckFailed

DEFAULT_SIZES = (7, 4099)
INTERPRETED_MAX_ROWS = 67
INTERPRETED_MAX_ELEMENTS = 1 << 14


def sizes_for(ctx, case, interpreted: bool) -> list[int]:
    """The batch sizes to run: the declared ones, capped when the function runs interpreted
    Triton kernels (`interpreted`)."""
    sizes = list(ctx.spec.get("sizes") or DEFAULT_SIZES)
    if interpreted:
        axes = _batched_axes(ctx, case)
        per_row = max(int(np.prod(case.args[n].shape)) // max(case.args[n].shape[a], 1)
                      for n, a in axes.items())
        cap = max(min(sizes), min(INTERPRETED_MAX_ROWS, INTERPRETED_MAX_ELEMENTS // per_row))
        sizes = sorted({min(s, cap) for s in sizes})
    return sizes


def _batched_axes(ctx, case) -> dict:
    dim = ctx.spec["batch"]
    if dim not in case.dims:
        raise ValueError(f"batch: {dim!r} is not a dim of input {ctx.spec.get('input')!r} "
                         f"(dims: {', '.join(case.dims) or 'none'})")
    axes = {}
    for name, a in ctx.input_spec.get("args", {}).items():
        shape = a.get("shape") or []
        if dim in shape:
            axes[name] = shape.index(dim)
    if not axes:
        raise ValueError(f"batch: no argument of input {ctx.spec.get('input')!r} has dim {dim!r}")
    return axes


def rebatched(ctx, case, rows: np.ndarray):
    """The case with every batched argument gathered at `rows` along its batch axis."""
    axes = _batched_axes(ctx, case)
    args = dict(case.args)
    for name, axis in axes.items():
        args[name] = np.take(case.args[name], rows, axis=axis)
    dims = {**case.dims, ctx.spec["batch"]: len(rows)}
    return cases.Case(case.dtype, dims, args, case.params, case.seed, case.label)


def run(ctx, case):
    _batched_axes(ctx, case)  # a contract error before any call
    fn = ctx.fn()
    m = case.dims[ctx.spec["batch"]]
    launched = triton_env.interpreted_launches()
    alone = backends.outputs(backends.call(fn, **ctx.args(rebatched(ctx, case, np.array([0])))))
    interpreted = triton_env.interpreted_launches() > launched
    rng = np.random.default_rng(case.seed)
    worst = 0.0
    sizes = sizes_for(ctx, case, interpreted)
    for size in sizes:
        rows = rng.integers(0, m, size)
        mid = size // 2
        rows[mid] = 0
        outs = backends.outputs(backends.call(fn, **ctx.args(rebatched(ctx, case, rows))))
        picked = list(outs)
        for i in ctx.output_indices(range(len(outs))):
            o = outs[i]
            if o.ndim == 0:
                raise ValueError(f"output {i} is a scalar: batch invariance compares rows of "
                                 f"outputs along axis 0; name the per-row outputs in `outputs`")
            if o.shape[0] != size:
                raise CheckFailed(f"output {i} has {o.shape[0]} rows on axis 0 for a batch of "
                                  f"{size}")
            picked[i] = o[mid:mid + 1]
        worst = max(worst, compare(ctx, case, alone, picked,
                                   f"as row {mid} of a batch of {size} (against the row alone)"))
    return {"invariant": "tolerance" not in ctx.spec, "max_diff": worst, "sizes": sizes}
