"""Run untrusted Python (a model's completion and its unit tests) in a contained subprocess.

Evaluation (`falsify eval`) and reward functions execute code a model wrote. Each program runs
in a fresh interpreter (`python -I -S`: no site packages, no environment variables read), in a
fresh temporary working directory, with a bootstrap that contains it before the first line of
the program runs:

kernel-enforced (they hold whatever the program does, C code included, and as root too)
  - CPU time: RLIMIT_CPU, then SIGXCPU/SIGKILL;
  - memory: RLIMIT_AS (address space), so an unbounded allocation ends in MemoryError;
  - file size: RLIMIT_FSIZE on every file it writes, its stdout and stderr included;
  - system calls (seccomp, through libseccomp): no new process (fork, vfork, a clone without
    CLONE_THREAD; threads may run), no exec, no socket, no signal to another process, no
    ptrace, mount, namespace change, module or BPF load;
  - network, a second layer: a new, empty network namespace (unshare(CLONE_NEWNET), or
    CLONE_NEWUSER|NEWNET without root), where the kernel allows one;
  - wall clock: the parent kills the whole process group after `wall_s`.
interpreter-level (an audit hook, PEP 578; it cannot be removed once installed)
  - any write, rename, removal, chmod or link outside the working directory is refused, and
    any read outside it and the Python installation (so a program cannot copy the user's
    files into its output, the one channel it has). This is the one containment C code could
    step around: a program that needs to reach elsewhere must first load C code, and ctypes,
    cffi and the like are refused at import;
  - the process, socket and signal calls above fail earlier, with a message naming the call.

The result records what was in force (`containment`). Without libseccomp the bootstrap stops
before the program's first line (SandboxError): the program never runs less contained than
this says. Only the network namespace may be missing (some container runtimes refuse it);
seccomp's socket rule holds the network then, and the result says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MARK = "@@falsify-sandbox "  # the bootstrap's first stderr line: the containment in force


class SandboxError(RuntimeError):
    """The containment could not be set up; nothing of the program ran."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    file_mb: int = 1           # any one file, stdout and stderr included
    output_chars: int = 8192   # how much of stdout/stderr the result keeps


@dataclass
class Result:
    status: str          # passed | failed | timeout | cpu-limit | file-limit | killed
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    containment: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


BOOTSTRAP = r'''
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
work = os.getcwd()
done = {"rlimits": True}
mb = 1 << 20
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * mb, cfg["file_mb"] * mb))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
NEWNET, NEWUSER = 0x40000000, 0x10000000
done["network_namespace"] = (libc.unshare(NEWNET) == 0
                             or libc.unshare(NEWUSER | NEWNET) == 0)
# seccomp through libseccomp: the kernel refuses these system calls to this process and to
# anything it might still create, whoever it runs as (root included)
try:
    sc = ctypes.CDLL("libseccomp.so.2")
except OSError as e:
    raise SystemExit(f"sandbox: libseccomp is not installed ({e}); Debian: libseccomp2")

class Cmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64),
                ("b", ctypes.c_uint64)]

sc.seccomp_init.restype = ctypes.c_void_p
sc.seccomp_init.argtypes = [ctypes.c_uint32]
sc.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                      ctypes.c_uint, ctypes.POINTER(Cmp)]
sc.seccomp_load.argtypes = [ctypes.c_void_p]
ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
NE, MASKED_EQ, CLONE_THREAD = 1, 7, 0x00010000
ctx = sc.seccomp_init(ALLOW)

def deny(name, action=EPERM, *cmps):
    nr = sc.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:
        return  # not a system call on this architecture
    arr = (Cmp * max(1, len(cmps)))(*cmps)
    if sc.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr) != 0:
        raise SystemExit(f"sandbox: seccomp rule for {name} refused")

for name in ("fork", "vfork", "execve", "execveat", "socket", "socketpair", "ptrace",
             "process_vm_readv", "process_vm_writev", "mount", "umount2", "unshare", "setns",
             "chroot", "pivot_root", "bpf", "perf_event_open", "init_module", "finit_module",
             "delete_module", "kexec_load", "reboot", "keyctl", "add_key", "iopl", "ioperm"):
    deny(name)
deny("clone", EPERM, Cmp(0, MASKED_EQ, CLONE_THREAD, 0))  # a new process; threads may run
deny("clone3", ENOSYS)  # its flags sit behind a pointer: glibc then falls back to clone
deny("kill", EPERM, Cmp(0, NE, os.getpid(), 0))
if sc.seccomp_load(ctx) != 0:
    raise SystemExit("sandbox: seccomp_load failed")
done["seccomp"] = True
del libc, sc, ctx, ctypes, Cmp, deny
for m in [m for m in sys.modules if m == "ctypes" or m.startswith("ctypes.")]:
    del sys.modules[m]
resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb, cfg["memory_mb"] * mb))
DENY_IMPORT = {"ctypes", "_ctypes", "cffi", "_posixsubprocess", "multiprocessing",
               "_multiprocessing", "socket", "_socket", "ssl", "_ssl", "select", "selectors",
               "asyncio", "mmap", "pty", "resource", "signal", "_signal", "faulthandler"}
DENY = {"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
        "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
        "os.kill", "os.killpg", "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.call_function", "os.setuid", "os.chroot", "sys.setprofile", "sys.settrace",
        "sys.remote_exec", "os.add_dll_directory"}
PATHS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.link": 2,
         "os.symlink": 2, "os.chmod": 1, "os.chown": 1, "os.truncate": 1, "os.utime": 1,
         "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.move": 2}
real = os.path.realpath
READABLE = [real(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]  # the stdlib
DEVICES = {"/dev/null", "/dev/urandom", "/dev/random"}
WRITE_FLAGS = 3 | os.O_CREAT | os.O_TRUNC  # O_WRONLY/O_RDWR, or a create or a truncate

def under(r, roots):
    return any(r == d or r.startswith(d + os.sep) for d in roots)

def inside(p):
    return under(real(os.path.join(work, os.fsdecode(p))), [work])

def readable(p):
    r = real(os.path.join(work, os.fsdecode(p)))
    return r in DEVICES or under(r, [work] + READABLE)

def hook(event, args):
    if event in DENY:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args[0].split(".")[0] in DENY_IMPORT:
        raise PermissionError(f"sandbox: import {args[0]} is not allowed")
    if event == "open" and isinstance(args[0], (str, bytes)):  # an fd was checked when opened
        path, mode, flags = args
        writes = (mode and any(c in mode for c in "wax+")) or (flags and flags & WRITE_FLAGS)
        if writes and not inside(path):
            raise PermissionError(f"sandbox: writing {path} is not allowed")
        if not readable(path):
            raise PermissionError(f"sandbox: reading {path} is not allowed")
    n = PATHS.get(event)
    if n:
        for p in args[:n]:
            if isinstance(p, (str, bytes, os.PathLike)) and not inside(p):
                raise PermissionError(f"sandbox: {event} on {p} is not allowed")

for m in [m for m in sys.modules if m.split(".")[0] in DENY_IMPORT]:
    del sys.modules[m]  # a later import runs the import hook again, and is refused
if cfg["audit_hook"]:
    sys.addaudithook(hook)
done["audit_hook"] = cfg["audit_hook"]
sys.stderr.write("@@falsify-sandbox " + json.dumps(done) + "\n")
sys.stderr.flush()
del json, resource, cfg, mb, done
src = open("program.py").read()
sys.argv = ["program.py"]
exec(compile(src, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
'''


def _signal_status(rc: int | None, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
    if rc == 0:
        return "passed"
    if rc is not None and rc < 0:
        sig = -rc
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return "cpu-limit"  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard
        if sig == signal.SIGXFSZ:
            return "file-limit"
        return "killed"
    return "failed"


def _read(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", "replace")


def run_python(source: str, limits: Limits = Limits(), *, audit_hook: bool = True) -> Result:
    """Run `source` contained (module docstring); passed means exit status 0. `audit_hook`
    False leaves out the interpreter layer, only so that tests can show the kernel layer
    holds on its own."""
    work = Path(tempfile.mkdtemp(prefix="falsify-sandbox-"))
    logs = Path(tempfile.mkdtemp(prefix="falsify-sandbox-logs-"))  # not the program's to touch
    try:
        (work / "program.py").write_text(source)
        os.chmod(work / "program.py", 0o644)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work)}
        cfg = json.dumps({**{k: v for k, v in asdict(limits).items() if k != "output_chars"},
                          "audit_hook": audit_hook})
        t0 = time.perf_counter()
        timed_out = False
        with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
            p = subprocess.Popen([sys.executable, "-I", "-S", "-c", BOOTSTRAP, cfg], cwd=work,
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                 start_new_session=True, close_fds=True)
            try:
                p.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        wall = time.perf_counter() - t0
        stderr = _read(logs / "err", limits.output_chars + 4096)
        if not stderr.startswith(MARK):  # the bootstrap itself failed: never run uncontained
            raise SandboxError(f"the sandbox could not contain the program: {stderr[-2000:]}")
        line, _, stderr = stderr.partition("\n")
        containment = json.loads(line[len(MARK):])
        return Result(_signal_status(p.returncode, timed_out), p.returncode,
                      _read(logs / "out", limits.output_chars), stderr[:limits.output_chars],
                      round(wall, 3), containment)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
