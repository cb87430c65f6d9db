"""Decide how Triton runs, once, before `triton` is first imported.

torch 2.13 imports triton on its first matmul, so the decision cannot wait for our kernel
modules: `import falsify` makes it. Without a GPU the kernels run under the Triton interpreter
(TRITON_INTERPRET=1), and a command that runs them says so on stderr (`announce`) — never
silently. FALSIFY_TRITON overrides:
`gpu` (a missing GPU is an error), `interpret` (always interpret), `compile` (neither: for
offline compilation to PTX in the static checks).
"""

import os
import sys

MODES = ("auto", "gpu", "interpret", "compile")


def gpu_visible() -> bool:
    """An NVIDIA driver node, checked without importing torch (cheap at `import falsify`)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia/version")


def configure() -> None:
    mode = os.environ.get("FALSIFY_TRITON", "auto")
    if mode not in MODES:
        raise RuntimeError(f"FALSIFY_TRITON={mode!r}: choose one of {', '.join(MODES)}")
    # Triton 3.9 warns that its FP-fusion default flips in 3.10. Fusion (FMA contraction)
    # changes rounding, so we pin it rather than inherit whichever default ships.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if "triton" in sys.modules or mode == "compile":
        return
    if mode == "gpu":
        if not gpu_visible():
            raise RuntimeError("FALSIFY_TRITON=gpu but no NVIDIA GPU is visible")
        return
    if (mode == "interpret" or not gpu_visible()) and os.environ.get("TRITON_INTERPRET") != "1":
        os.environ["TRITON_INTERPRET"] = "1"
        global _interpreted
        _interpreted = True


_interpreted = False  # configure() chose the interpreter: announce() says so
_announced = False


def announce() -> None:
    """Say once, on stderr, that Triton kernels run under the interpreter — from a command
    that is about to run them, where it changes what runs and how long it takes; not at import,
    where `--help` and verbs that run nothing would print it too."""
    global _announced
    if _interpreted and not _announced and os.environ.get("FALSIFY_QUIET") != "1":
        _announced = True
        print("falsify: no GPU visible; Triton kernels run under TRITON_INTERPRET=1",
              file=sys.stderr)


def pin_interpreter_dot() -> None:
    """Under the interpreter, compute `tl.dot` so that each output row's value does not depend
    on where the row sits in its tile.

    Triton's interpreter evaluates `tl.dot` with `np.matmul`, i.e. the machine's BLAS, and
    OpenBLAS's sgemm kernels (seen: 0.3.31, Haswell/SkylakeX paths) sum a row's K products in
    an order that depends on the row's position in the M tile: row 33 of a 64-row tile and
    the same row alone at position 0 differ in the last bit. A kernel whose tiles do not
    depend on the batch then fails the batch-invariance checks on some CPUs and passes on
    others, a property of the BLAS and not of the kernel. `np.einsum` without `optimize` does
    not call BLAS: it sums each element's K products in K order, in the accumulator dtype, the
    same for every row. Floating-point dots only; fp8 and integer dots keep the interpreter's
    own path."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_falsify_pinned", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        floats = all(x.dtype.is_floating() and x.dtype.primitive_bitwidth >= 16
                     for x in (a, b)) and d.data.dtype.kind == "f"
        if not floats:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        prod = np.einsum("...mk,...kn->...mn", a.data, b.data, dtype=d.data.dtype,
                         optimize=False)
        return interpreter.TensorHandle(prod + d.data, d.dtype.scalar)

    create_dot._falsify_pinned = True
    builder.create_dot = create_dot


def skip_discarded_overflow_checks() -> None:
    """Under the interpreter, skip the integer-overflow sanitizer whose verdict is discarded.

    Triton 3.9 wraps every signed integer add, sub and mul (index arithmetic, mostly) in
    `binary_op_sanitize_overflow_impl`: cast both sides to int64, redo the op, compare with the
    type's bounds, and hand the result to `device_assert`, which returns without looking at it
    unless the options ask for debugging. The interpreter's options never do
    (InterpreterOptions() is built with debug=False, and TRITON_DEBUG does not reach it), so an
    overflow is never reported there: the six extra interpreted ops per integer op decide
    nothing. Profiled on rope's batch-invariance check they were 58 % of the interpreter's
    time. Skipped exactly when `device_assert` would discard them, so nothing a kernel computes
    or reports changes; tests/test_interpreter_overflow.py holds Triton to that premise."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import types

    from triton.runtime import interpreter

    semantic = interpreter.interpreter_semantic
    original = semantic.binary_op_sanitize_overflow_impl
    if getattr(original, "_falsify_skipped", False):
        return

    def binary_op_sanitize_overflow_impl(self, lhs, rhs, binary_op):
        if not self.builder.options.debug:  # device_assert would return unread
            return None
        return original(lhs, rhs, binary_op)

    binary_op_sanitize_overflow_impl._falsify_skipped = True
    semantic.binary_op_sanitize_overflow_impl = types.MethodType(
        binary_op_sanitize_overflow_impl, semantic)


def memoize_interpreter_dtypes() -> None:
    """Under the interpreter, map Triton dtypes to numpy's from a table built once.

    Triton 3.9's interpreter converts a dtype on every operation of every program instance,
    and its `_get_np_dtype` builds its 19-entry table afresh on each call, hashing each Triton
    dtype in Python. Profiled on rope's batch-invariance check under the interpreter: 0.44 M
    calls, 15 of its 150 seconds. The mapping is the same one: a block maps as its element
    type, a pointer to uint64, a scalar type to what the original returns for it (asked once
    per type, so an unknown type still raises as it did)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._get_np_dtype
    if getattr(original, "_falsify_memoized", False):
        return
    table: dict = {}
    pointer = np.dtype(np.uint64)

    def _get_np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        found = table.get(tt_dtype)
        if found is None:
            found = table[tt_dtype] = original(tt_dtype)
        return found

    _get_np_dtype._falsify_memoized = True
    interpreter._get_np_dtype = _get_np_dtype


def patch_language_once_per_launch() -> None:
    """Under the interpreter, let a device-function call reuse the launch's language patches.

    Triton 3.9's interpreter swaps `triton.language`'s builtins for interpreted ones when a
    kernel launches (`_patch_lang`) and swaps them back when the grid is done. A call to
    another `@triton.jit` function from inside the kernel (`InterpretedFunction.__call__`)
    runs `_patch_lang` again, in every program instance: it scans every member of
    `triton.language`, its tensor class and its math module with `inspect.getmembers`, finds
    no builtin left to swap (the launch swapped them all), re-installs the same lambdas on the
    tensor class and the dtypes, and drops the scope without restoring it: the launch's own
    restore puts the originals back. Profiled on rmsnorm's Triton checks: 2,049 such calls,
    13 of the 38 interpreted seconds. Skipped exactly when the function's languages are already
    swapped (their `load` is no longer the builtin), so what a kernel computes is unchanged;
    tests/test_interpreter_patches.py holds it to that."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime import interpreter

    cls = interpreter.InterpretedFunction
    original = cls.__call__
    if getattr(original, "_falsify_once", False):
        return

    def patched(lang) -> bool:
        return not tl.core.is_builtin(lang.load)

    def __call__(self, *args, **kwargs):
        langs = [v for v in self.fn.__globals__.values() if v is tl or v is tl.core]
        if not langs or not all(patched(lang) for lang in langs):
            return original(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    __call__._falsify_once = True
    cls.__call__ = __call__


_launches = 0  # grids launched under the interpreter since the counter was installed


def interpreted_launches() -> int:
    """How many Triton grids this process has launched under the interpreter, counted from
    the first call of this function (which installs the counter on Triton's `GridExecutor`);
    always 0 when not interpreting. A check compares two readings to tell whether the function
    it calls runs interpreted Triton kernels, whatever backend the function is bound as: a
    third-party Triton kernel bound as `torch` (Liger's, in the third-party guide) runs
    interpreted as ours do, and costs what ours cost."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return 0
    from triton.runtime import interpreter

    cls = interpreter.GridExecutor
    if not getattr(cls.__call__, "_falsify_counted", False):
        original = cls.__call__

        def __call__(self, *args, **kwargs):
            global _launches
            _launches += 1
            return original(self, *args, **kwargs)

        __call__._falsify_counted = True
        cls.__call__ = __call__
    return _launches
