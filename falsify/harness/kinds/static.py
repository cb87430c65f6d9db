"""static: a Triton kernel compiles offline for a GPU target (no GPU needed) and meets its
resource expectations: `expect.mma` (tensor-core instructions in the PTX — `mma`, or `wgmma`
on sm_90), `expect.max_shared` (bytes of shared memory).

Compilation runs in a subprocess with FALSIFY_TRITON=compile: under the interpreter `@triton.jit`
yields an InterpretedFunction, which the compiler cannot take, and the interpreter switch is
process-wide.
"""

import json
import os
import re
import subprocess
import sys

from falsify.harness.runtime import CheckFailed


def compile_facts(kernel_ref: str, signature: dict, constexprs: dict, cc: int) -> dict:
    """Compile in this process (which must not be interpreting) and report PTX facts."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from falsify.harness.backends import resolve

    kernel = resolve(kernel_ref)
    src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs or {})
    compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32))
    ptx = compiled.asm["ptx"]
    return {"target": f"sm_{cc}", "shared_bytes": int(compiled.metadata.shared),
            "mma": bool(re.search(r"\b(w?gmma|mma)\.", ptx)), "wgmma": "wgmma" in ptx,
            "ptx_lines": ptx.count("\n")}


def compile_in_subprocess(kernel_ref: str, signature: dict, constexprs: dict, cc: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FALSIFY_TRITON"] = "compile"
    payload = json.dumps([kernel_ref, signature, constexprs or {}, cc])
    r = subprocess.run([sys.executable, "-m", "falsify.harness.kinds.static", payload],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
        raise CheckFailed(f"does not compile for sm_{cc}: {' | '.join(tail)}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(ctx, case=None):
    cc = int(ctx.variant.removeprefix("sm_"))
    a = ctx.spec.get("args") or {}
    if "signature" not in a:
        raise CheckFailed("static check needs args.signature")
    facts = compile_in_subprocess(ctx.spec["kernel"], a["signature"], a.get("constexprs"), cc)
    expect = ctx.spec.get("expect") or {}
    if "mma" in expect and bool(expect["mma"]) != facts["mma"]:
        state = "absent" if expect["mma"] else "present"
        raise CheckFailed(f"sm_{cc}: tensor-core instructions {state} in PTX "
                          f"(expected mma={expect['mma']})")
    if "max_shared" in expect and facts["shared_bytes"] > int(expect["max_shared"]):
        raise CheckFailed(f"sm_{cc}: {facts['shared_bytes']} bytes of shared memory > "
                          f"{expect['max_shared']}")
    return facts


if __name__ == "__main__":
    ref, sig, consts, target = json.loads(sys.argv[1])
    print(json.dumps(compile_facts(ref, sig, consts, int(target))))
