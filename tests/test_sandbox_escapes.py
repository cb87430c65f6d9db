"""Escapes from the evaluation sandbox, each refused.

Every probe runs twice: with both layers (the audit hook and the kernel's Landlock, seccomp)
and with the audit hook left out, so the kernel layer is shown to hold on its own. Every probe
targets a fresh file outside the sandbox's directory; the test asserts the file is absent
afterwards and that the same probe works where it is allowed (run unsandboxed in a scratch
directory), so a pass is not an artefact of a broken probe.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from falsify.llm.sandbox import Limits, SandboxError, run_python

FAST = Limits(cpu_s=3, wall_s=15.0, memory_mb=256, file_mb=1)


def _landlock_abi() -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))


pytestmark = pytest.mark.skipif(_landlock_abi() < 3, reason="the kernel offers no Landlock "
                                "ABI 3; the sandbox refuses to run (tested below)")

# each probe gets OUT (a directory outside the sandbox) and S (a fresh path in it)
ESCAPES = {
    "chdir": "import os\nos.chdir(OUT)\nopen(os.path.basename(S), 'w').write('x')\n",
    "dir_fd": "import os\nfd = os.open(OUT, os.O_RDONLY)\n"
              "os.close(os.open(os.path.basename(S), os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n",
    "mkfifo": "import os\nos.mkfifo(S)\n",
    "mkfifo_dir_fd": "import os\nfd = os.open(OUT, os.O_RDONLY)\n"
                     "os.mkfifo(os.path.basename(S), dir_fd=fd)\n",
    "symlink_then_write": "import os\nos.symlink(S, 'link')\nopen('link', 'w').write('x')\n",
    "symlink_dir_then_write": "import os\nos.symlink(OUT, 'd')\n"
                              "open(os.path.join('d', os.path.basename(S)), 'w').write('x')\n",
    "proc_self_cwd": "import os\nos.chdir(OUT)\n"
                     "open('/proc/self/cwd/' + os.path.basename(S), 'w').write('x')\n",
    "mkdir_after_chdir": "import os\nos.chdir(OUT)\nos.mkdir(os.path.basename(S))\n",
}


def _probe(body: str, out: Path, target: Path) -> str:
    return f"OUT = {str(out)!r}\nS = {str(target)!r}\n" + body


def _unsandboxed(src: str, tmp_path: Path) -> subprocess.CompletedProcess:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", src], cwd=scratch, capture_output=True,
                          text=True, timeout=30)


@pytest.mark.parametrize("audit_hook", [True, False], ids=["both-layers", "kernel-only"])
@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_an_escape_is_refused(name, audit_hook, tmp_path):
    out = tmp_path / "outside"
    out.mkdir()
    target = out / f"escape-{uuid.uuid4().hex}"
    src = _probe(ESCAPES[name], out, target)
    r = run_python(src, FAST, audit_hook=audit_hook)
    assert r.status == "failed", r
    assert "PermissionError" in r.stderr or "Permission denied" in r.stderr, r.stderr
    assert not target.exists() and not target.is_symlink()
    assert r.containment["landlock"] >= 3
    assert _unsandboxed(src, tmp_path).returncode == 0  # the probe itself works
    assert target.exists()


@pytest.mark.parametrize("audit_hook", [True, False], ids=["both-layers", "kernel-only"])
def test_a_hard_link_to_a_file_outside_cannot_be_written_through(audit_hook, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    src = (f"import os\nos.link({str(victim)!r}, 'h')\nopen('h', 'w').write('changed')\n")
    r = run_python(src, FAST, audit_hook=audit_hook)
    assert r.status == "failed", r
    assert victim.read_text() == "original"


def test_an_inherited_file_descriptor_is_not_there_to_write_through(tmp_path):
    victim = tmp_path / "victim.txt"
    fd = os.open(victim, os.O_CREAT | os.O_WRONLY)
    os.set_inheritable(fd, True)  # even a descriptor marked inheritable is closed
    try:
        src = f"import os\nos.write({fd}, b'escaped')\n"
        r = run_python(src, FAST)
        assert r.status == "failed" and "Bad file descriptor" in r.stderr, r
        assert victim.read_bytes() == b""
        os.write(fd, b"")  # the descriptor was open in the parent all along
    finally:
        os.close(fd)


def test_ctypes_to_libc_open_is_refused_by_the_kernel(tmp_path):
    # the audit hook refuses `import ctypes` (next test); without it, C code reaches openat
    # directly, and Landlock still refuses the create
    target = tmp_path / f"escape-{uuid.uuid4().hex}"
    src = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
           f"fd = libc.open({str(target).encode()!r}, os.O_CREAT | os.O_WRONLY, 0o644)\n"
           f"fd2 = libc.openat(-100, {str(target).encode()!r}, os.O_CREAT | os.O_WRONLY, 0o644)\n"
           "print(fd, fd2, ctypes.get_errno())\nassert fd < 0 and fd2 < 0\n"
           "ok = libc.open(b'mine', os.O_CREAT | os.O_WRONLY, 0o644)\nassert ok >= 0\n")
    r = run_python(src, FAST, audit_hook=False)
    assert r.status == "passed", r  # both refused, the create inside allowed
    assert r.stdout.split()[-1] == "13"  # EACCES
    assert not target.exists()


def test_ctypes_is_refused_at_import_with_the_audit_hook():
    r = run_python("import ctypes\n", FAST)
    assert r.status == "failed" and "import ctypes is not allowed" in r.stderr, r


@pytest.mark.parametrize("audit_hook", [True, False], ids=["both-layers", "kernel-only"])
def test_a_connect_to_a_local_listener_is_refused(audit_hook):
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.settimeout(0.5)
        port = srv.getsockname()[1]
        src = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), 2)\n"
               "s.sendall(b'escaped')\n")
        r = run_python(src, FAST, audit_hook=audit_hook)
        assert r.status == "failed", r
        with pytest.raises(TimeoutError):
            srv.accept()
        with socket.create_connection(("127.0.0.1", port), 2):  # the listener was reachable
            conn, _ = srv.accept()
            conn.close()


def test_without_landlock_the_program_is_refused_unless_the_caller_opts_out(monkeypatch):
    from falsify.llm import sandbox

    # a kernel without Landlock, simulated by asking for an ABI no kernel offers
    monkeypatch.setattr(sandbox, "BOOTSTRAP", sandbox.BOOTSTRAP.replace(
        "LANDLOCK_MIN_ABI = 3", "LANDLOCK_MIN_ABI = 10**6"))
    with pytest.raises(SandboxError, match="Landlock ABI 1000000 or later is needed"):
        sandbox.run_python("print('ran')\n", FAST)
    r = sandbox.run_python("print('ran')\n", FAST, allow_unconfined=True)
    assert r.stdout == "ran\n" and r.containment["landlock"] is False


@pytest.mark.parametrize("audit_hook", [True, False], ids=["both-layers", "kernel-only"])
def test_dir_fd_into_the_python_installation_is_refused(audit_hook):
    # the installation is readable (the interpreter needs it), so a descriptor on it can be
    # had; a file created through it would run in every later interpreter (a .pth file)
    target = Path(sys.base_prefix) / f"escape-{uuid.uuid4().hex}"
    src = (f"import os\nfd = os.open({sys.base_prefix!r}, os.O_RDONLY)\n"
           f"os.close(os.open({target.name!r}, os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n")
    try:
        r = run_python(src, FAST, audit_hook=audit_hook)
        assert r.status == "failed" and "PermissionError" in r.stderr, r
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)
