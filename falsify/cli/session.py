"""What `falsify run`, `falsify mutants` and `falsify soak` share: choosing and parsing the
contracts, keeping their generated modules current, the run manifest handed to the pytest
plugin, and hypothesis seeds (`--seed N|commit` and the one line that reruns a seeded check).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from falsify.errors import UsageError


def select_contracts(names: list[str], proj):
    """Contracts by id (the project's or the library's) or by path; the project's own
    contracts when none is named. Each is parsed once, here, and handed to the runtime."""
    from falsify.harness import runtime
    from falsify.harness.model import resolve_arg
    from falsify.harness.project import id_space, project_contracts
    from falsify.harness.validate import validate

    space = id_space(proj)  # a project contract that clashes with a library id is an error
    paths = []
    for n in names:
        p = resolve_arg(n)
        if not p.exists():
            raise UsageError(f"no contract {n!r}: not a file, and not a contract id of the "
                             "project or the library (`pv list` shows the library)")
        known = space.get(p.name.rsplit(".", 1)[0])
        if p.is_file() and known is not None and known.path != p.resolve():
            # its results and generated module would be filed under the other file's id
            raise UsageError(f"{p} has the id of {known.origin} contract {known.path}: rename "
                             "it, or put it in the project and list the id under `overrides`")
        paths.append(p)
    if not names:
        paths = project_contracts(proj)
        if not paths:
            raise UsageError(f"no contracts in {', '.join(map(str, proj.contract_dirs))}: add "
                             "one, or name library contracts by id (`pv list` shows them)")
    rep = validate(paths)
    if rep.errors:
        for f in rep.errors:
            print(f, file=sys.stderr)
        raise UsageError(f"{len(rep.errors)} validation error(s); run `pv validate`")
    return [runtime.remember(c) for c in rep.contracts if c.mode == "native"]


def ensure_generated(contracts, proj) -> list[Path]:
    """The contracts' test modules, regenerated where stale; their paths, in order.

    The project's own contracts get theirs in its `generated` dir, as `pv generate` writes
    them. Any other contract (a library contract run by id, bound with --bind or not; a file
    outside the project's contract directories) gets its module in the project's scratch dir
    (`Project.scratch_generated_dir`, local state): in `generated` it would be a module no
    project contract generates, and `pv generate --check`, the CI and pre-commit gate, would
    fail on it."""
    from falsify.harness import generate
    from falsify.harness.files import atomic_write
    from falsify.harness.project import project_files

    mine = set(project_files(proj).values())
    own = [c for c in contracts if c.path.resolve() in mine]
    others = [c for c in contracts if c.path.resolve() not in mine]
    where = {}
    # the scratch dir has no __init__.py: its modules import under their own names, never as
    # a package that could shadow the project's generated package (both may run together)
    for out, group, package in ((proj.generated_dir, own, True),
                                (proj.scratch_generated_dir, others, False)):
        if not group:
            continue
        expected = generate.plan_tests(group, out)
        if not package:
            expected.pop(out / "__init__.py")
        # only the selected contracts' modules: never delete others
        stale = [p for p, _ in generate.stale_files(expected, out, prune=False)]
        for p in stale:
            atomic_write(p, expected[p])
        if stale and package:
            print(f"falsify: regenerated {len(stale)} test module(s) in {out}", file=sys.stderr)
        where.update({c.id: out / generate.module_name(c.id) for c in group})
    return [where[c.id] for c in contracts]


def run_manifest(proj, contracts, select: str, profile: str, backends: list[str],
              binds: dict, ledger_path: Path, reuse: list[str] = ()) -> dict:
    return dict(project_root=str(proj.root), select=select, profile=profile,
                backends=list(backends), binds=binds, ledger=str(ledger_path),
                reuse=list(reuse),
                contracts={c.id: {"path": str(c.path.resolve()), "sha256": c.sha256}
                           for c in contracts})


def commit_seed(cwd: Path | None = None) -> tuple[int, str]:
    """A 32-bit seed derived from the checked-out commit of the project in `cwd`, and the
    commit: every CI run of one commit explores the same examples, each new commit new ones."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"--seed commit: `git rev-parse HEAD` failed here ({e}); "
                         "give a number instead") from None
    digest = hashlib.sha256(f"falsify-seed:{head}".encode()).hexdigest()
    return int(digest[:8], 16), head


def resolve_seed(text: str | None) -> tuple[int | None, str]:
    """`--seed N` (decimal or 0x...) or `--seed commit`; returns (seed, where it came from)."""
    if text is None:
        return None, ""
    if text == "commit":
        n, head = commit_seed()
        return n, f"from commit {head[:12]}"
    try:
        n = int(text, 0)
    except ValueError:
        raise UsageError(f"--seed {text!r}: expected an integer or 'commit'") from None
    if not 0 <= n < 2**32:
        raise UsageError(f"--seed {n}: must be in [0, 2^32)")
    return n, "given"


def repro_command(contract: str, seed: int, nodeid: str, backend: str | None = None,
                  flags: str = "") -> str:
    """The one line that reruns a single check of a seeded run (`flags`: the run's --bind and
    --thorough, which change what is checked or how much)."""
    test = nodeid.split("::")[-1].split("[")[0]
    b = f" --backend {backend}" if backend else ""
    f = f" {flags}" if flags else ""
    return f"falsify run {contract} --seed {seed}{b}{f} -k {test}"
