"""Run untrusted Python (a model's completion and its unit tests) in a contained subprocess.

Evaluation (`falsify eval`) and reward functions execute code a model wrote. Each program runs
in a fresh interpreter (`python -I -S`: no site packages, no environment variables read), in a
fresh temporary working directory, with a bootstrap that contains it before the first line of
the program runs:

kernel-enforced (they hold whatever the program does, C code included, and as root too)
  - CPU time: RLIMIT_CPU, then SIGXCPU/SIGKILL;
  - memory: RLIMIT_AS (address space), so an unbounded allocation ends in MemoryError;
  - file size: RLIMIT_FSIZE on every file it writes, its stdout and stderr included;
  - file system (Landlock, ABI 3 or later): writes of every kind only beneath the working
    directory, reads only beneath it, the Python installation, /usr, /lib*, /etc and three
    devices, however a path is reached (chdir, dir_fd, /proc/self/cwd, links, C code); with
    ABI 4 or later TCP bind and connect are refused too;
  - system calls (seccomp, through libseccomp): no new process (fork, vfork, a clone without
    CLONE_THREAD; threads may run), no exec, no socket, no signal to another process, no
    ptrace, mount, namespace change, module or BPF load;
  - network, a second layer: a new, empty network namespace (unshare(CLONE_NEWNET), or
    CLONE_NEWUSER|NEWNET without root), where the kernel allows one;
  - wall clock: the parent kills the whole process group after `wall_s`.
interpreter-level (an audit hook, PEP 578; it cannot be removed once installed)
  - any write, rename, removal, chmod, link, fifo or node outside the working directory is
    refused, and any read outside it and the Python installation, each path resolved against
    the current directory at the time of the call or the directory behind its dir_fd; ctypes,
    cffi and the like are refused at import. C code could step around this layer; Landlock
    holds it then;
  - the process, socket and signal calls above fail earlier, with a message naming the call.

The result records what was in force (`containment`, with the Landlock ABI). Without
libseccomp, or without Landlock ABI 3 unless the caller passes `allow_unconfined`, the
bootstrap stops before the program's first line (SandboxError): the program never runs less
contained than this says. Only the network namespace may be missing (some container
runtimes refuse it); seccomp's socket rule and Landlock hold the network then, and the result
says so.
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
LANDLOCK_MIN_ABI = 3  # 3: truncate(2) is handled; below it a path outside could be truncated
# Landlock: the kernel refuses this process and its threads any write outside the working
# directory, however the path is reached (chdir, dir_fd, /proc/self/cwd, a symlink, C code),
# and reads outside the interpreter, its libraries and the working directory
libc.syscall.restype = ctypes.c_long
abi = libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1))  # create_ruleset VERSION
done["landlock"] = False
if abi >= LANDLOCK_MIN_ABI:
    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
    WRITE = (1 << 1) | sum(1 << b for b in range(4, 15))  # write, remove, make *, refer, truncate
    every = READ | WRITE | ((1 << 15) if abi >= 5 else 0)  # 5: ioctl on devices
    net = 3 if abi >= 4 else 0  # 4: TCP bind and connect, with no port allowed
    attr = RulesetAttr(every, net)
    size = ctypes.sizeof(attr) if net else 8
    rfd = libc.syscall(444, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        raise SystemExit(f"sandbox: landlock_create_ruleset failed (errno {ctypes.get_errno()})")

    def allow(path, access):
        if not os.path.exists(path):
            return
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = PathBeneath(access if os.path.isdir(path) else access & ~0x3FF8, fd)
        ok = libc.syscall(445, rfd, 1, ctypes.byref(rule), ctypes.c_uint32(0)) == 0
        os.close(fd)
        if not ok:
            raise SystemExit(f"sandbox: landlock_add_rule {path} failed "
                             f"(errno {ctypes.get_errno()})")

    allow(work, every)
    for root in sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix,
                        sys.exec_prefix, "/usr", "/lib", "/lib64", "/lib32", "/etc")}):
        allow(root, READ)  # the interpreter, its stdlib, libc and the loader's configuration
    for dev in ("/dev/null", "/dev/urandom", "/dev/random", "/proc/self"):
        allow(os.path.realpath(dev), READ)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, rfd, ctypes.c_uint32(0)) != 0:
        raise SystemExit(f"sandbox: landlock_restrict_self failed (errno {ctypes.get_errno()})")
    os.close(rfd)
    done["landlock"] = int(abi)
elif not cfg["allow_unconfined"]:
    raise SystemExit(f"sandbox: Landlock ABI {LANDLOCK_MIN_ABI} or later is needed to confine "
                     f"the program's file system access and this kernel offers "
                     f"{'none' if abi < 0 else f'ABI {abi}'}; the program was not run (opt out "
                     "only with allow_unconfined=True, which runs it without that confinement)")
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
# event -> (path index, index of the dir_fd it is relative to, or None) for each path
PATHS = {"os.remove": [(0, 1)], "os.rmdir": [(0, 1)], "os.mkdir": [(0, 2)],
         "os.rename": [(0, 2), (1, 3)], "os.link": [(0, 2), (1, 3)],
         "os.symlink": [(0, 2), (1, 2)], "os.chmod": [(0, 2)], "os.chown": [(0, 3)],
         "os.truncate": [(0, None)], "os.utime": [(0, 3)], "shutil.rmtree": [(0, 1)],
         "shutil.copyfile": [(0, None), (1, None)], "shutil.move": [(0, None), (1, None)]}
real = os.path.realpath
READABLE = [real(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}]  # the stdlib
DEVICES = {"/dev/null", "/dev/urandom", "/dev/random"}
WRITE_FLAGS = 3 | os.O_CREAT | os.O_TRUNC  # O_WRONLY/O_RDWR, or a create or a truncate
_readlink, _getcwd, _fsdecode, _join = os.readlink, os.getcwd, os.fsdecode, os.path.join

def under(r, roots):
    return any(r == d or r.startswith(d + os.sep) for d in roots)

def resolve(p, dir_fd=None):
    # a relative path means the directory the kernel will use: the current one at the time
    # of the call (after any chdir), or the directory behind dir_fd
    if isinstance(p, int):
        return None  # an fd was checked when it was opened
    try:
        base = _getcwd() if dir_fd in (None, -100, -1) else _readlink(f"/proc/self/fd/{dir_fd}")
    except OSError:
        return ""  # no directory to resolve against: refused below
    return real(_join(base, _fsdecode(p)))

def inside(p, dir_fd=None):
    r = resolve(p, dir_fd)
    return r is None or under(r, [work])

def readable(p, dir_fd=None):
    r = resolve(p, dir_fd)
    return r is None or r in DEVICES or under(r, [work] + READABLE)

def check_open(path, flags, dir_fd=None, mode=None):
    writes = (mode and any(c in mode for c in "wax+")) or (flags and flags & WRITE_FLAGS)
    if writes and not inside(path, dir_fd):
        raise PermissionError(f"sandbox: writing {path} is not allowed")
    if not readable(path, dir_fd):
        raise PermissionError(f"sandbox: reading {path} is not allowed")

def hook(event, args):
    if event in DENY:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args[0].split(".")[0] in DENY_IMPORT:
        raise PermissionError(f"sandbox: import {args[0]} is not allowed")
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        check_open(args[0], args[2], mode=args[1])  # os.open's dir_fd: its wrapper checks
    for i, d in PATHS.get(event, ()):
        p = args[i] if i < len(args) else None
        fd = args[d] if d is not None and d < len(args) else None
        if isinstance(p, (str, bytes, os.PathLike)) and not inside(p, fd):
            raise PermissionError(f"sandbox: {event} on {p} is not allowed")

def guarded(fn, name, check):
    # the audit event of os.open carries no dir_fd and mkfifo/mknod raise none: these
    # wrappers check the path against the directory the call resolves it in
    def call(path, *a, dir_fd=None, **kw):
        check(path, a, dir_fd)
        return fn(path, *a, dir_fd=dir_fd, **kw) if dir_fd is not None else fn(path, *a, **kw)
    call.__name__ = call.__qualname__ = name
    return call

def make_check(path, a, dir_fd):
    if not inside(path, dir_fd):
        raise PermissionError(f"sandbox: creating {path} is not allowed")

if cfg["audit_hook"]:
    import posix
    _open = guarded(os.open, "open",
                    lambda path, a, fd: check_open(path, a[0] if a else 0, fd))
    for mod in (os, posix):
        mod.open = _open
        mod.mkfifo = guarded(os.mkfifo, "mkfifo", make_check)
        mod.mknod = guarded(os.mknod, "mknod", make_check)
    del posix, _open, mod
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


def run_python(source: str, limits: Limits = Limits(), *, audit_hook: bool = True,
               allow_unconfined: bool = False) -> Result:
    """Run `source` contained (module docstring); passed means exit status 0. `audit_hook`
    False leaves out the interpreter layer, only so that tests can show the kernel layer
    holds on its own. Without Landlock the program is refused (SandboxError) unless
    `allow_unconfined` says to run it without file system confinement; the result's
    `containment["landlock"]` is then False."""
    work = Path(tempfile.mkdtemp(prefix="falsify-sandbox-"))
    logs = Path(tempfile.mkdtemp(prefix="falsify-sandbox-logs-"))  # not the program's to touch
    try:
        (work / "program.py").write_text(source)
        os.chmod(work / "program.py", 0o644)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work)}
        cfg = json.dumps({**{k: v for k, v in asdict(limits).items() if k != "output_chars"},
                          "audit_hook": audit_hook, "allow_unconfined": allow_unconfined})
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
