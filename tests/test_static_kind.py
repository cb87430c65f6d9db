"""The static kind's compile server (falsify/harness/kinds/static.py): every compilation sees
the kernel source on disk now, in the caller's directory and path, as a fresh subprocess
would; a compile error or a crashed compiler fails the check with its reason; the warm
server is reused across checks."""

import os
import textwrap

import pytest

from falsify.harness.kinds import static
from falsify.harness.runtime import CheckFailed

SIG = {"x_ptr": "*fp16", "y_ptr": "*fp16", "BLOCK": "constexpr"}
DOT_SIG = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BLOCK": "constexpr"}

ELEMENTWISE = """
import triton
import triton.language as tl

@triton.jit
def k(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(c_ptr + o, tl.load(a_ptr + o).to(tl.float32) * 2)
"""

DOT = """
import triton
import triton.language as tl

@triton.jit
def k(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    tl.store(c_ptr + r, tl.dot(tl.load(a_ptr + r), tl.load(b_ptr + r)))
"""


def _module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{name}:k"


def test_an_edited_kernel_is_compiled_as_it_is_now(tmp_path, monkeypatch):
    ref = _module(tmp_path, monkeypatch, "kern_edit", DOT)
    first = static.compile_in_subprocess(ref, DOT_SIG, {"BLOCK": 16}, 80)
    assert first["mma"] is True
    server = static._SERVER.proc.pid
    (tmp_path / "kern_edit.py").write_text(textwrap.dedent(ELEMENTWISE))
    second = static.compile_in_subprocess(ref, DOT_SIG, {"BLOCK": 16}, 80)
    assert second["mma"] is False, "the server compiled the source it saw first"
    assert static._SERVER.proc.pid == server, "the server was restarted, not reused"


def test_a_compile_error_fails_the_check_with_the_compilers_reason(tmp_path, monkeypatch):
    ref = _module(tmp_path, monkeypatch, "kern_bad", ELEMENTWISE)
    with pytest.raises(CheckFailed, match="sm_90.*power of 2"):
        static.compile_in_subprocess(ref, DOT_SIG, {"BLOCK": 100}, 90)


def test_a_crashed_compiler_fails_its_check_and_the_next_one_still_runs(tmp_path, monkeypatch):
    crash = _module(tmp_path, monkeypatch, "kern_crash",
                    "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    with pytest.raises(CheckFailed, match="died"):
        static.compile_in_subprocess(crash, SIG, {"BLOCK": 64}, 80)
    ok = _module(tmp_path, monkeypatch, "kern_ok", ELEMENTWISE)
    assert static.compile_in_subprocess(ok, DOT_SIG, {"BLOCK": 64}, 80)["target"] == "sm_80"


def test_the_compiler_runs_without_the_interpreter(tmp_path, monkeypatch):
    """The checking process interprets Triton; a compilation under TRITON_INTERPRET would get
    an InterpretedFunction and fail, so passing here shows the switch is off in the child."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    ref = _module(tmp_path, monkeypatch, "kern_env", ELEMENTWISE)
    assert static.compile_in_subprocess(ref, DOT_SIG, {"BLOCK": 64}, 90)["wgmma"] is False


def test_a_compile_server_that_cannot_start_says_why(tmp_path, monkeypatch):
    """The server's own failure (here: a Triton that cannot be imported) reaches the check's
    message; a server started afterwards, with a working Triton, compiles again."""
    fake = tmp_path / "broken"
    (fake / "triton").mkdir(parents=True)
    (fake / "triton" / "__init__.py").write_text("raise ImportError('this triton is broken')\n")
    env = static._compile_env()
    monkeypatch.setattr(static, "_compile_env",
                        lambda: {**env, "PYTHONPATH": f"{fake}:{env.get('PYTHONPATH', '')}"})
    static._SERVER.stop()
    with pytest.raises(CheckFailed, match="this triton is broken"):
        static.compile_in_subprocess("kern:k", SIG, {"BLOCK": 64}, 80)
    monkeypatch.setattr(static, "_compile_env", lambda: env)
    ok = _module(tmp_path, monkeypatch, "kern_after", ELEMENTWISE)
    assert static.compile_in_subprocess(ok, DOT_SIG, {"BLOCK": 64}, 80)["target"] == "sm_80"
