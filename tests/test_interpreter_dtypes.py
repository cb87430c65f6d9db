"""falsify.triton_env.memoize_interpreter_dtypes: the interpreter's Triton-to-numpy dtype
mapping from a table built once gives exactly what Triton's own function gives."""

from __future__ import annotations

import pytest

import falsify.kernels.triton  # noqa: F401 - installs the memoized mapping under the interpreter


def test_the_memoized_mapping_is_tritons_own():
    import triton.language as tl
    from triton.runtime import interpreter

    fast = interpreter._get_np_dtype
    assert getattr(fast, "_falsify_memoized", False), "the mapping was not replaced"
    # Triton's own, restored from its source module's code object
    ns = dict(interpreter.__dict__)
    exec(compile(_original_source(interpreter), interpreter.__file__, "exec"), ns)
    own = ns["_get_np_dtype"]
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64,
               tl.uint64, tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5,
               tl.float8e4nv]
    for t in scalars:
        for form in (t, tl.block_type(t, [4, 8]), tl.pointer_type(t),
                     tl.block_type(tl.pointer_type(t), [16])):
            assert fast(form) == own(form), form
            assert fast(form) == own(form), form  # the second, memoized answer too
    with pytest.raises(KeyError):  # a type the table lacks fails as it did
        own(tl.void)
    with pytest.raises(KeyError):
        fast(tl.void)


def _original_source(module) -> str:
    import inspect

    src = inspect.getsource(module)
    start = src.index("def _get_np_dtype(")
    end = src.index("\ndef ", start + 1)
    return src[start:end]
