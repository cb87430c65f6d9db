"""static: a Triton kernel compiles offline for a GPU target (no GPU needed) and meets its
resource expectations: `expect.mma` (tensor-core instructions in the PTX — `mma`, or `wgmma`
on sm_90), `expect.max_shared` (bytes of shared memory).

Compilation runs outside the checking process, with FALSIFY_TRITON=compile: under the
interpreter `@triton.jit` yields an InterpretedFunction, which the compiler cannot take, and the
interpreter switch is process-wide. A fresh interpreter per check spent most of the check on
importing torch and Triton (about 4.5 CPU-seconds each, 76 checks in this repository), so each
checking process keeps one compile server: it imports them once, then forks a child per
compilation. The child starts from that warm state and from nothing else — no kernel module
is imported before the fork — takes the caller's working directory, `sys.path` and
environment (less TRITON_INTERPRET), compiles and exits. So a compilation sees exactly the
kernel source on disk now, as a fresh subprocess would, and a crash takes down only its child.
"""

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import traceback

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


TIMEOUT_S = 600  # one compilation; a hung LLVM pass fails the check instead of the run


def _compile_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["FALSIFY_TRITON"] = "compile"
    return env


class _Server:
    """The checking process's side of the compile server: started on first use, restarted if
    it died or timed out, closed at exit (end of input ends it)."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.log = None  # the server's own stderr: why it died, if it dies

    def _start(self) -> subprocess.Popen:
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "falsify.harness.kinds.static", "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, env=_compile_env(), start_new_session=True)
        return self.proc

    def _why(self) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        log, self.log = self.log, None
        if log is not None:
            log.close()
        if proc is None:
            return
        with _quietly():
            proc.stdin.close()
            proc.wait(timeout=10)
        if proc.poll() is None:
            with _quietly():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def compile(self, request: dict) -> dict:
        proc = self.proc if self.proc and self.proc.poll() is None else self._start()
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            why = self._why()
            self.stop()
            return {"error": f"{why}\nthe compile server exited before taking the request"}
        ready, _, _ = select.select([proc.stdout], [], [], TIMEOUT_S)
        line = proc.stdout.readline() if ready else ""
        if not line:
            why = self._why()
            self.stop()
            return {"error": f"{why}\n" + (f"no answer from the compiler within {TIMEOUT_S} s"
                                           if not ready else "the compile server exited")}
        return json.loads(line)


class _quietly:
    """Suppress the errors of tearing down a process that may already be gone."""

    def __enter__(self):
        return self

    def __exit__(self, kind, value, tb):
        return kind is not None and issubclass(kind, (OSError, subprocess.SubprocessError))


_SERVER = _Server()
atexit.register(_SERVER.stop)


def compile_in_subprocess(kernel_ref: str, signature: dict, constexprs: dict, cc: int) -> dict:
    out = _SERVER.compile({"kernel": kernel_ref, "signature": signature,
                           "constexprs": constexprs or {}, "cc": cc, "cwd": os.getcwd(),
                           "path": list(sys.path), "env": _compile_env()})
    if "error" in out:
        tail = out["error"].strip().splitlines()[-3:]
        raise CheckFailed(f"does not compile for sm_{cc}: {' | '.join(tail)}")
    return out["facts"]


def _child(request: dict, log_fd: int, answer_fd: int) -> None:
    """In the forked child: become the caller (directory, path, environment), compile, write
    the answer, exit without running the server's exit handlers."""
    out: dict
    try:
        os.dup2(log_fd, 1)  # the compiler's own prints must not reach the answer channel
        os.dup2(log_fd, 2)
        os.chdir(request["cwd"])
        sys.path[:] = request["path"]
        os.environ.clear()
        os.environ.update(request["env"])
        out = {"facts": compile_facts(request["kernel"], request["signature"],
                                      request["constexprs"], int(request["cc"]))}
    except BaseException:  # noqa: BLE001 - everything becomes the check's failure message
        out = {"error": traceback.format_exc()}
    data = json.dumps(out).encode()
    while data:
        data = data[os.write(answer_fd, data):]
    os._exit(0)


def _serve() -> None:
    """The server: warm imports, then one forked child per request line on stdin; answers are
    written to the original stdout, which nothing else may write to."""
    import torch  # noqa: F401 - the warm state every child starts from: the kernel modules
    import triton  # noqa: F401    import torch and Triton, which are most of a fresh start
    import triton.backends.compiler  # noqa: F401
    import triton.compiler  # noqa: F401

    import falsify.harness.backends  # noqa: F401

    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as log:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                _child(request, log.fileno(), w)
            os.close(w)
            with os.fdopen(r, "rb") as f:
                data = f.read()
            _, status = os.waitpid(pid, 0)
            if not data:
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                data = json.dumps({"error": f"{tail}\nthe compiler process died "
                                            f"(wait status {status})"}).encode()
        answers.write(data.decode() + "\n")
        answers.flush()


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
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:  # one compilation, for a person debugging a kernel: JSON [kernel, signature, ...]
        ref, sig, consts, target = json.loads(sys.argv[1])
        print(json.dumps(compile_facts(ref, sig, consts, int(target))))
