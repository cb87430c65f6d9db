"""Checkpoints: everything needed to continue a run bit-identically.

    <run>/checkpoints/step-00000100/
        model.safetensors      weights, HF-style names (falsify/llm/model.py), fp32
        optimizer.safetensors  AdamW exp_avg / exp_avg_sq / step per parameter name
        rng.safetensors        torch CPU (and CUDA) generator states
        state.json             step, data position, python + numpy RNG states, config,
                               optimizer hyperparameters, metrics (val_loss), timestamp
        manifest.json          size and sha256 of each file above; written last

A data-parallel run writes the sharded layout instead (falsify/llm/sharded_checkpoint.py: DCP
shards, an RNG file per rank, the whole weights); verify and find read both, and
falsify/llm/checkpoint_load.py loads both.

Atomicity is directory-level: the checkpoint is written into `.tmp-...` in the same directory
and renamed into place with os.replace, so a reader (or a resume after `kill -9`) sees either a
complete checkpoint or none; names starting with '.' are never considered. Retention keeps the
last N and the best (lowest val_loss); a pruned directory is renamed to `.trash-...` before it is
deleted so a half-deleted checkpoint can never look complete.

Damage after the fact (a truncated copy, a disk error, a file deleted by hand) is caught before
resuming (`verify_checkpoint`): state.json must parse, every safetensors header must parse and
cover its file, and every file must have the size and sha256 the manifest recorded. A resume
names the damaged file; `find_checkpoint(..., fallback=True)` (`--resume` without a directory)
takes the newest intact checkpoint instead and says so. Checkpoints written before manifests
existed, or whose manifest was deleted, are verified against the sha256 of each file that
state.json records; one whose state.json records none is unverified, so damaged.

Orphans. A writer killed mid-save leaves its `.tmp-...` directory. Each writer first creates
`.tmp-<name>-XXXX.lock` and holds an exclusive flock on it for the whole write, and only then
creates the directory `.tmp-<name>-XXXX`; the lock file is removed after the directory is gone.
`remove_orphans` (run before every save and on resume) deletes a temp directory only after
taking that flock itself, so it never touches one whose writer is alive (the kernel drops a
flock when its process dies, `kill -9` included). A temp directory without a lock file predates
this rule and is removed only once nothing in it changed for ORPHAN_MIN_AGE_S. `.trash-...`
directories (a prune cut off mid-delete) are always removed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file as _save_file

from falsify.harness.files import atomic_write, plain_mode

STATE = "state.json"
MANIFEST = "manifest.json"
STATE_HASHES = "sha256"  # state.json's record of its checkpoint's other files
PREFIX = "step-"
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
STATE_KEYS = ("step", "data", "rng", "config", "optimizer_groups", "param_names")
SHARDS = "shards"  # the sharded layout's DCP directory (falsify/llm/sharded_checkpoint.py)
ORPHAN_MIN_AGE_S = 600.0  # a lock-less temp dir untouched this long has no live writer

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    pass


class CheckpointDamaged(CheckpointError):
    """A checkpoint with a damaged or missing file; the message names the file and, when there
    is one, the newest intact checkpoint to resume from instead (`fallback`)."""

    def __init__(self, ckpt: Path, file: str, why: str, fallback: Path | None = None):
        self.ckpt, self.file, self.why, self.fallback = Path(ckpt), file, why, fallback
        msg = f"checkpoint {self.ckpt} is damaged: {file}: {why}"
        if fallback is not None:
            msg += (f"; the newest intact checkpoint is {fallback} (step "
                    f"{_step_of(fallback)}): resume from it with `--resume {fallback}`")
        else:
            msg += f"; no intact checkpoint under {self.ckpt.parent}"
        super().__init__(msg)

    def offering(self, fallback: Path | None) -> CheckpointDamaged:
        return CheckpointDamaged(self.ckpt, self.file, self.why, fallback)


# ------------------------------------------------------------------------------------ RNG
def rng_state() -> tuple[dict, dict[str, torch.Tensor]]:
    """(JSON-able python/numpy states, tensors for torch generators)."""
    py = random.getstate()
    np_state = np.random.get_state()
    js = {"python": [py[0], list(py[1]), py[2]],
          "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]),
                    float(np_state[4])]}
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    return js, tensors


def set_rng_state(js: dict, tensors: dict[str, torch.Tensor]) -> None:
    v, internal, gauss = js["python"]
    random.setstate((v, tuple(internal), gauss))
    n = js["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def rng_file(rank: int) -> str:
    """A rank's RNG streams in the sharded layout."""
    return f"rng-rank{rank:05d}.safetensors"


def save_file(tensors: dict, filename: str | Path, metadata: dict | None = None) -> None:
    """safetensors' save_file, with the mode a plain open() gives (it writes 0600): every
    .safetensors falsify writes goes through here."""
    _save_file(tensors, str(filename), metadata=metadata)
    plain_mode(filename)


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A fresh hidden directory next to its final place (same file system, so os.replace is
    atomic), with the permissions a plain mkdir would give (mkdtemp's are 0700)."""
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def atomic_dir(out: str | Path, fill) -> Path:
    """Write a directory whole or not at all: `fill(tmp)` fills a temp dir beside `out`, which
    then replaces `out` (an older `out` is moved aside first, then removed)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out.parent, f".{out.name}-")
    try:
        fill(tmp)
        if out.exists():
            trash = out.with_name(f".{out.name}-old-{os.getpid()}")
            os.replace(out, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------- layout
def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints (state.json present, not a temp/trash dir), oldest first."""
    d = checkpoints_dir(run_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and (p / STATE).is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def _step_of(ckpt: Path) -> int | str:
    tail = Path(ckpt).name[len(PREFIX):]
    return int(tail) if tail.isdigit() else "?"


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Every `step-*` directory, complete or not, newest first (what a resume chooses from)."""
    d = checkpoints_dir(run_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if p.is_dir() and p.name.startswith(PREFIX)
             and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]), reverse=True)


def read_state(ckpt: str | Path) -> dict:
    """state.json; a missing, torn or non-object file is a CheckpointDamaged naming it."""
    ckpt = Path(ckpt)
    try:
        state = json.loads((ckpt / STATE).read_bytes())
    except FileNotFoundError:
        raise CheckpointDamaged(ckpt, STATE, "missing") from None
    except OSError as e:
        raise CheckpointDamaged(ckpt, STATE, f"cannot read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointDamaged(ckpt, STATE, f"not valid JSON ({e}); torn or overwritten") \
            from None
    if not isinstance(state, dict):
        raise CheckpointDamaged(ckpt, STATE, f"not a JSON object ({type(state).__name__})")
    return state


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: str | Path) -> Path | None:
    scored = []
    for p in list_checkpoints(run_dir):
        try:
            s = read_state(p)
        except CheckpointDamaged:
            continue  # cannot be the best: it could not be resumed from
        if s.get("metrics", {}).get("val_loss") is not None:
            scored.append((s["metrics"]["val_loss"], int(s["step"]), p))
    return min(scored)[2] if scored else None


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_manifest(ckpt: Path) -> dict | None:
    try:
        m = json.loads((ckpt / MANIFEST).read_bytes())
    except FileNotFoundError:
        return None  # written before manifests: structural checks only
    except (OSError, ValueError) as e:
        raise CheckpointDamaged(ckpt, MANIFEST, f"unreadable ({e})") from None
    files = m.get("files") if isinstance(m, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("bytes"), int)
            and isinstance(v.get("sha256"), str) for v in files.values()):
        raise CheckpointDamaged(ckpt, MANIFEST, "not a manifest (files: {name: {bytes, sha256}})")
    return files


def verify_checkpoint(ckpt: str | Path, for_resume: bool = True, hashes: bool = True) -> dict:
    """Raise CheckpointDamaged naming the first damaged file; return state.json. Checks: each
    file present (for a resume all of them; else the weights, as for a fine-tuning base);
    state.json parses (for a resume, with every key a resume reads); each safetensors header
    parses and covers its file exactly (safe_open); with a manifest, sizes and (with `hashes`)
    sha256 equal what was recorded at save time."""
    ckpt = Path(ckpt)
    files = _read_manifest(ckpt)
    sharded = _is_sharded(ckpt, files)
    if sharded:  # falsify/llm/sharded_checkpoint.py; the RNG files of ranks > 0 once W is known
        whole = ("model.safetensors", f"{SHARDS}/.metadata", rng_file(0), STATE)
    else:
        whole = (*TENSOR_FILES, STATE)
    needed = whole if for_resume else ("model.safetensors", STATE)
    for name in needed:
        if not (ckpt / name).is_file():
            raise CheckpointDamaged(ckpt, name, "missing")
        if files is not None and name not in files:
            raise CheckpointDamaged(ckpt, MANIFEST, f"does not list {name}")
    for name, rec in (files or {}).items():
        f = ckpt / name
        if not f.is_file():
            raise CheckpointDamaged(ckpt, name, "missing (listed in the manifest)")
        size = f.stat().st_size
        if size != rec["bytes"]:
            how = "truncated" if size < rec["bytes"] else "grown"
            raise CheckpointDamaged(ckpt, name, f"{size} bytes, the manifest recorded "
                                                f"{rec['bytes']} ({how})")
    state = read_state(ckpt)
    missing = [k for k in STATE_KEYS if k not in state] if for_resume else []
    if missing:
        raise CheckpointDamaged(ckpt, STATE, f"not a resumable state (lacks {missing})")
    if sharded and for_resume:
        ranks = state.get("world_size", 1)
        if not isinstance(ranks, int) or ranks < 1:
            raise CheckpointDamaged(ckpt, STATE, f"world_size={ranks!r}: not a process count")
        for r in range(1, ranks):
            if not (ckpt / rng_file(r)).is_file():
                raise CheckpointDamaged(ckpt, rng_file(r), f"missing (written by {ranks} "
                                                           "processes)")
        needed = (*needed, *(rng_file(r) for r in range(1, ranks)))
    tensor_files = [n for n in dict.fromkeys((*needed, *(files or {})))
                    if n.endswith(".safetensors")]
    for name in tensor_files:
        try:
            with safe_open(str(ckpt / name), "pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise CheckpointDamaged(ckpt, name, f"not a valid safetensors file ({e})") from None
    if files is None:
        _verify_state_hashes(ckpt, state, needed)
    elif hashes:
        for name, rec in files.items():
            if _sha256(ckpt / name) != rec["sha256"]:
                raise CheckpointDamaged(ckpt, name, "sha256 differs from the manifest's "
                                                    "(contents changed after the save)")
    return state


def _verify_state_hashes(ckpt: Path, state: dict, needed: tuple[str, ...]) -> None:
    """Without a manifest the checkpoint is unverified unless state.json's own record of its
    files' sha256 (STATE_HASHES) covers every file the load reads and agrees with them: a
    deleted manifest must not turn corrupt weights into trusted ones."""
    recorded = state.get(STATE_HASHES)
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise CheckpointDamaged(ckpt, MANIFEST, f"missing, and {STATE} records no sha256 of "
                                                "the files: the contents cannot be verified")
    for name in needed:
        if name != STATE and name not in recorded:
            raise CheckpointDamaged(ckpt, MANIFEST, f"missing, and {STATE} records no sha256 "
                                                    f"of {name}: it cannot be verified")
    for name, digest in recorded.items():
        f = ckpt / name
        if not f.is_file():
            raise CheckpointDamaged(ckpt, name, f"missing (listed in {STATE})")
        if _sha256(f) != digest:
            raise CheckpointDamaged(ckpt, name, f"sha256 differs from the one {STATE} recorded "
                                                "(contents changed after the save)")


def content_hashes(tmp: Path) -> dict[str, str]:
    """sha256 of every file written so far (state.json and the manifest come later), recorded
    in state.json so that a checkpoint whose manifest is lost can still be verified."""
    return {f.relative_to(tmp).as_posix(): _sha256(f) for f in sorted(tmp.rglob("*"))
            if f.is_file() and f.name not in (STATE, MANIFEST)}


def _is_sharded(ckpt: Path, files: dict | None) -> bool:
    """A data-parallel run's checkpoint (shards/ written by torch.distributed.checkpoint)."""
    if files is not None:
        return any(n.startswith("shards/") for n in files)
    return (ckpt / "shards").is_dir()


def find_checkpoint(target: str | Path, fallback: bool = False,
                    for_resume: bool = False) -> Path:
    """`target` is a checkpoint directory or a run directory (its latest checkpoint), verified
    intact (verify_checkpoint; `for_resume`: everything a resume reads, else the weights). A
    damaged one raises CheckpointDamaged offering the newest intact checkpoint of the run; with
    `fallback`, that one is returned instead and a warning names the damaged one(s)."""
    p = Path(target)
    explicit = _is_checkpoint_dir(p)
    run = run_dir_of(p)
    candidates = [p] if explicit else checkpoint_dirs(p)
    if not candidates:
        raise CheckpointError(f"no complete checkpoint under {p} (looked for "
                              f"{checkpoints_dir(p)}/{PREFIX}*/{STATE})")
    try:
        verify_checkpoint(candidates[0], for_resume)
        return candidates[0]
    except CheckpointDamaged as e:
        damaged = e
    intact = _newest_intact(run, candidates[0], for_resume)
    if not fallback or intact is None:
        raise damaged.offering(intact)
    log.warning("%s; resuming from %s (step %s), the newest intact checkpoint", damaged.args[0]
                .split("; ", 1)[0], intact, _step_of(intact))
    return intact


def _is_checkpoint_dir(p: Path) -> bool:
    return (p / STATE).is_file() or (p.is_dir() and p.name.startswith(PREFIX)
                                     and p.parent.name == "checkpoints")


def run_dir_of(target: str | Path) -> Path:
    """The run directory of `target`, a checkpoint directory or a run directory."""
    p = Path(target)
    return p.parent.parent if _is_checkpoint_dir(p) else p


def _newest_intact(run_dir: Path, exclude: Path, for_resume: bool) -> Path | None:
    for c in checkpoint_dirs(run_dir):
        if c.resolve() == exclude.resolve():
            continue
        try:
            verify_checkpoint(c, for_resume)
            return c
        except CheckpointDamaged as e:
            log.warning("%s", e.args[0].split("; ", 1)[0])
    return None


# --------------------------------------------------------------------------------- save
def _optimizer_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> dict:
    """Flatten AdamW state to name-keyed tensors; `names` are the parameter names in the
    optimizer's own parameter order."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if len(params) != len(names):
        raise CheckpointError(f"{len(names)} names for {len(params)} optimizer parameters")
    out = {}
    for name, p in zip(names, params):
        for k, v in optimizer.state.get(p, {}).items():
            t = v if torch.is_tensor(v) else torch.tensor(float(v))
            out[f"{name}.{k}"] = t.detach().to("cpu").contiguous()
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, param_names: list[str], *,
                    data_state: dict, config: dict, metrics: dict | None = None,
                    extra: dict | None = None, keep_last: int = 2) -> Path:
    """Write checkpoint `step` atomically, then prune to the last `keep_last` + best."""
    if keep_last < 1:
        raise CheckpointError(f"keep_last={keep_last}: must keep at least one checkpoint")
    root = checkpoints_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    remove_orphans(run_dir)
    final = root / f"{PREFIX}{step:08d}"
    tmp, lock_fd, lock = _locked_temp_dir(root, f".tmp-{final.name}-")
    try:
        weights = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        save_file(weights, str(tmp / "model.safetensors"))
        save_file(_optimizer_tensors(optimizer, param_names), str(tmp / "optimizer.safetensors"))
        rng_js, rng_t = rng_state()
        save_file(rng_t, str(tmp / "rng.safetensors"))
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        state = {"step": step, "time": time.time(), "data": data_state, "rng": rng_js,
                 "config": config, "optimizer_groups": groups, "param_names": param_names,
                 "metrics": metrics or {}, **(extra or {}), STATE_HASHES: content_hashes(tmp)}
        (tmp / STATE).write_text(json.dumps(state, indent=1, default=_json_default))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        write_manifest(tmp)
        if final.exists():
            # Re-saving a step (e.g. resumed at it): move the old one aside first; os.replace
            # cannot replace a non-empty directory.
            _discard(final)
        os.replace(tmp, final)
        _fsync_dir(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        Path(lock).unlink(missing_ok=True)  # only after the temp dir is gone (remove_orphans)
        os.close(lock_fd)
    prune(run_dir, keep_last)
    return final


def write_manifest(tmp: Path) -> None:
    """Last file of a checkpoint: size + sha256 of every other file (those in subdirectories,
    the shards of a sharded checkpoint, by their relative path), atomically replaced in."""
    files = {f.relative_to(tmp).as_posix(): {"bytes": f.stat().st_size, "sha256": _sha256(f)}
             for f in sorted(tmp.rglob("*")) if f.is_file() and f.name != MANIFEST
             and not f.name.startswith(f".{MANIFEST}")}
    part = tmp / f".{MANIFEST}.part"
    with open(part, "w") as fh:
        json.dump({"format": 1, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, tmp / MANIFEST)


# ------------------------------------------------------------------------------ orphans
def _locked_temp_dir(root: Path, prefix: str) -> tuple[Path, int, str]:
    """(temp dir, fd holding its writer lock, lock path); the lock exists and is held before
    the directory is created (see the module docstring)."""
    while True:
        fd, lock = tempfile.mkstemp(dir=root, prefix=prefix, suffix=".lock")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # a cleaner may have taken and removed the new lock before we locked it
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    tmp = Path(lock[: -len(".lock")])
    umask = os.umask(0)
    os.umask(umask)
    tmp.mkdir(mode=0o777 & ~umask)
    return tmp, fd, lock


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _newest_mtime(path: Path) -> float:
    return max([path.stat().st_mtime] + [f.stat().st_mtime for f in path.rglob("*")])


def remove_orphans(run_dir: str | Path) -> list[Path]:
    """Delete temp directories of killed writers and cut-off prunes; returns what was removed.
    A directory whose writer still holds its lock is never touched."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    removed = []
    for entry in sorted(root.iterdir()):
        try:
            if entry.name.startswith(".tmp-") and entry.name.endswith(".lock"):
                removed += _remove_locked_orphan(entry)
            elif entry.name.startswith(".tmp-") and entry.is_dir():
                if not Path(f"{entry}.lock").exists() and \
                        time.time() - _newest_mtime(entry) > ORPHAN_MIN_AGE_S:
                    removed.append(_remove(entry, "a checkpoint write without a writer lock, "
                                                  f"untouched for over {ORPHAN_MIN_AGE_S:.0f} s"))
            elif entry.name.startswith(".trash-") and entry.is_dir():
                removed.append(_remove(entry, "a pruned checkpoint whose deletion was cut off"))
        except FileNotFoundError:
            continue  # another cleaner (or the writer itself) got there first
    return removed


def _remove_locked_orphan(lock: Path) -> list[Path]:
    fd = os.open(lock, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # its writer is alive
        tmp = Path(str(lock)[: -len(".lock")])
        gone = [_remove(tmp, "a checkpoint write that was killed (its writer's lock is free)")] \
            if tmp.is_dir() else []
        lock.unlink(missing_ok=True)
        return gone
    finally:
        os.close(fd)


def _remove(path: Path, why: str) -> Path:
    size = _dir_bytes(path)
    shutil.rmtree(path, ignore_errors=True)
    log.warning("removed %s (%.1f MB): %s", path, size / 1e6, why)
    return path


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"not JSON-serialisable in checkpoint state: {type(o).__name__}")


def _discard(path: Path) -> None:
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def prune(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the last `keep_last` checkpoints and the best one; returns the deleted."""
    found = list_checkpoints(run_dir)
    keep = set(found[-keep_last:])
    best = best_checkpoint(run_dir)
    if best is not None:
        keep.add(best)
    gone = [p for p in found if p not in keep]
    for p in gone:
        _discard(p)
    return gone


# ------------------------------------------------------------------------------ metrics
def truncate_metrics(path: str | Path, step: int, records: list[dict] | None = None) -> None:
    """After resuming at `step`, drop the metrics.jsonl records a killed run wrote for later
    steps. A torn last line (the kill cut a write short) is dropped and said so; a damaged line
    before it is not something a kill leaves, so it is an error naming path:line. `records`:
    the checkpoint's copy of step `step`'s records, which replace whatever the file holds for
    that step (a torn one included), so the file equals an uninterrupted run's."""
    path = Path(path)
    if not path.exists() and records is None:
        return
    lines = path.read_bytes().split(b"\n") if path.exists() else []
    keep = _intact_records(path, lines, step if records is None else step - 1)
    keep += [json.dumps(r).encode() for r in records or []]
    atomic_write(path, b"".join(ln + b"\n" for ln in keep), durable=True)


def _intact_records(path: Path, lines: list[bytes], step: int) -> list[bytes]:
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    keep = []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
            if not isinstance(rec, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            if i == last and i == len(lines) - 1:  # no newline after it: a cut-off write
                log.warning("%s:%d: torn last line (%d bytes, no newline: a write cut off by "
                            "a kill) dropped; the file now ends at the last complete record",
                            path, i + 1, len(ln))
                continue
            raise CheckpointError(f"{path}:{i + 1}: not a metrics record ({e}); fix or remove "
                                  "the line, then resume again") from None
        if not isinstance(rec.get("step", 0), int) or rec.get("step", 0) <= step:
            keep.append(ln)
    return keep


