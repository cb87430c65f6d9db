"""The sandbox `falsify eval` runs model-written code in: each escape a program might try is
contained, and each containment is shown to hold by a program that tries it.

Each test also shows the probe could have escaped: the same action succeeds outside the
sandbox, or inside it where it is allowed (a write in the working directory), so a pass is
not an artefact of a probe that was broken to begin with.
"""

from __future__ import annotations

import socket
import sys
import threading
import uuid
from pathlib import Path

import pytest

from falsify.llm.sandbox import Limits, run_python

FAST = Limits(cpu_s=2, wall_s=10.0, memory_mb=256, file_mb=1)


def test_a_plain_program_runs_and_reports_its_containment():
    r = run_python("print('hi')\nimport math\nprint(math.factorial(5))\n", FAST)
    assert r.status == "passed" and r.stdout == "hi\n120\n", r
    assert r.containment["rlimits"] is True
    assert r.containment["seccomp"] is True
    assert r.containment["audit_hook"] is True
    assert r.containment["landlock"] >= 3  # the ABI in force
    assert set(r.containment) == {"rlimits", "network_namespace", "landlock", "seccomp",
                                  "audit_hook"}


def test_a_failing_assertion_fails():
    r = run_python("assert 1 + 1 == 3, 'arithmetic'\n", FAST)
    assert r.status == "failed" and r.returncode == 1 and "AssertionError: arithmetic" in r.stderr


def test_a_busy_loop_is_stopped_by_the_cpu_limit():
    r = run_python("while True:\n    pass\n", Limits(cpu_s=1, wall_s=20.0))
    assert r.status == "cpu-limit" and r.wall_s < 10, r


def test_a_sleeping_program_is_killed_at_the_wall_clock_limit():
    r = run_python("import time\ntime.sleep(60)\n", Limits(cpu_s=5, wall_s=1.0))
    assert r.status == "timeout" and r.wall_s < 5, r


def test_an_unbounded_allocation_ends_in_memory_error():
    r = run_python("x = []\nwhile True:\n    x.append(bytearray(10**7))\n", FAST)
    assert r.status == "failed" and "MemoryError" in r.stderr, r


def _sentinel() -> Path:
    return Path("/tmp") / f"falsify-escape-{uuid.uuid4().hex}"


@pytest.mark.parametrize("how", [
    "import os\nif os.fork() == 0:\n    open(S, 'w').write('x')\n    os._exit(0)\n",
    "import subprocess\nsubprocess.run(['touch', S])\n",
    "import os\nos.system('touch ' + S)\n",
    "import os\nos.execv('/usr/bin/touch', ['touch', S])\n",
    "import multiprocessing\n",
    "import ctypes\n",
])
def test_no_process_can_be_started(how):
    s = _sentinel()
    r = run_python(f"S = {str(s)!r}\n" + how, FAST)
    assert r.status == "failed" and not s.exists(), r
    assert "PermissionError: sandbox:" in r.stderr or "No module named" in r.stderr, r


@pytest.mark.parametrize("how", [
    "import os\nif os.fork() == 0:\n    open(S, 'w').write('x')\n    os._exit(0)\n",
    "import os\nos.execv('/usr/bin/touch', ['touch', S])\n",
    "import socket\nsocket.socket()\n",
    "import os\nos.kill(1, 0)\n",
])
def test_the_kernel_layer_holds_without_the_interpreter_layer(how):
    """With the audit hook left out, seccomp alone refuses a new process, an exec, a socket
    and a signal to another process: the kernel answers EPERM."""
    s = _sentinel()
    r = run_python(f"S = {str(s)!r}\n" + how, FAST, audit_hook=False)
    assert r.containment["audit_hook"] is False
    assert r.status == "failed" and not s.exists(), r
    assert "Operation not permitted" in r.stderr and "sandbox:" not in r.stderr, r


def test_without_the_interpreter_layer_the_kernel_still_refuses_a_write_outside():
    """Landlock holds on its own: the write outside the working directory that
    test_writes_stay_in_the_working_directory shows refused by the audit hook is refused by
    the kernel without it (EACCES, not the hook's message)."""
    s = _sentinel()
    try:
        r = run_python(f"open({str(s)!r}, 'w').write('x')\n", FAST, audit_hook=False)
        assert r.status == "failed" and "Permission denied" in r.stderr and not s.exists(), r
        assert "sandbox:" not in r.stderr
    finally:
        s.unlink(missing_ok=True)


def test_threads_still_run():
    r = run_python("from concurrent.futures import ThreadPoolExecutor\n"
                   "with ThreadPoolExecutor(4) as ex:\n"
                   "    print(sum(ex.map(lambda i: i * i, range(10))))\n", FAST)
    assert r.status == "passed" and r.stdout == "285\n", r


def test_writes_stay_in_the_working_directory(tmp_path):
    target = _sentinel()
    r = run_python(f"open({str(target)!r}, 'w').write('x')\n", FAST)
    assert r.status == "failed" and "PermissionError" in r.stderr and not target.exists(), r
    r = run_python(f"import os\nos.rename('program.py', {str(target)!r})\n", FAST)
    assert r.status == "failed" and not target.exists(), r
    # the same kind of write inside the working directory is allowed
    r = run_python("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())\n",
                   FAST)
    assert r.status == "passed" and r.stdout == "ok\n", r


def test_reads_stay_in_the_working_directory_and_the_python_installation(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    r = run_python(f"print(open({str(secret)!r}).read())\n", FAST)
    assert r.status == "failed" and "sandbox: reading" in r.stderr and "s3cret" not in r.stdout
    r = run_python("import os\nfd = os.open('/etc/hostname', os.O_RDONLY | os.O_TRUNC)\n",
                   FAST)
    assert r.status == "failed" and "sandbox:" in r.stderr, r
    # the stdlib and the working directory stay readable: json and its submodules import
    r = run_python("import json, decimal, fractions\nopen('a.txt', 'w').write('1')\n"
                   "print(json.dumps(open('a.txt').read()))\n", FAST)
    assert r.status == "passed" and r.stdout == '"1"\n', r
    # without the interpreter layer Landlock refuses the same read (the file itself is
    # readable: this process just wrote it)
    r = run_python(f"print(open({str(secret)!r}).read())\n", FAST, audit_hook=False)
    assert r.status == "failed" and "Permission denied" in r.stderr, r
    assert "s3cret" not in r.stdout and secret.read_text() == "s3cret"


def test_no_connection_leaves_the_sandbox():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(3)
    port = srv.getsockname()[1]
    got = []
    t = threading.Thread(target=lambda: got.append(_accept(srv)))
    t.start()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
    r = run_python(code, FAST)
    t.join()
    srv.close()
    assert r.status == "failed" and got == [None], (r, got)
    # the listener did accept connections: the same probe outside the sandbox connects
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    with socket.create_connection(("127.0.0.1", srv.getsockname()[1]), timeout=2):
        pass
    srv.close()


def _accept(srv):
    try:
        conn, _ = srv.accept()
        conn.close()
        return "connected"
    except OSError:
        return None


def test_output_is_bounded_by_the_file_size_limit():
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", FAST)
    assert r.status in ("file-limit", "failed"), r
    assert len(r.stdout) <= Limits().output_chars


def test_the_interpreter_is_isolated_from_the_environment(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/nonexistent-falsify")
    monkeypatch.setenv("SECRET_TOKEN", "s3cret")
    r = run_python("import os, sys\nprint(os.environ.get('SECRET_TOKEN'))\n"
                   "print(any('nonexistent-falsify' in p for p in sys.path))\n", FAST)
    assert r.status == "passed" and r.stdout == "None\nFalse\n", r
    assert sys.executable  # the sandbox runs this same interpreter, isolated (-I -S)
