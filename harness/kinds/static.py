"""static: a Triton kernel compiles offline for a GPU target (no GPU needed) and meets its
resource expectations: `expect.mma` (tensor-core instructions in the PTX — `mma`, or `wgmma`
on sm_90), `expect.max_shared` (bytes of shared memory)."""

import re

from falsify.harness import backends
from falsify.harness.runtime import CheckFailed


def compile_kernel(kernel, signature: dict, constexprs: dict, cc: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs or {})
    return triton.compile(src, target=GPUTarget("cuda", cc, 32))


def run(ctx, case=None):
    kernel = backends.resolve(ctx.spec["kernel"])
    cc = int(ctx.variant.removeprefix("sm_"))
    a = ctx.spec.get("args") or {}
    if "signature" not in a:
        raise CheckFailed("static check needs args.signature")
    try:
        compiled = compile_kernel(kernel, a["signature"], a.get("constexprs"), cc)
    except Exception as e:
        raise CheckFailed(f"does not compile for sm_{cc}: {type(e).__name__}: {e}") from None
    ptx = compiled.asm["ptx"]
    shared = int(compiled.metadata.shared)
    has_mma = bool(re.search(r"\b(w?gmma|mma)\.", ptx))
    expect = ctx.spec.get("expect") or {}
    if "mma" in expect and bool(expect["mma"]) != has_mma:
        state = "absent" if expect["mma"] else "present"
        raise CheckFailed(f"sm_{cc}: tensor-core instructions {state} in PTX "
                          f"(expected mma={expect['mma']})")
    if "max_shared" in expect and shared > int(expect["max_shared"]):
        raise CheckFailed(f"sm_{cc}: {shared} bytes of shared memory > {expect['max_shared']}")
    return {"target": f"sm_{cc}", "shared_bytes": shared, "mma": has_mma,
            "wgmma": "wgmma" in ptx, "ptx_lines": ptx.count("\n")}
