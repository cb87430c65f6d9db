"""The one hand-over between the `falsify run` / `falsify mutants` command and pytest.

The command validates and parses the selected contracts, then writes a **run manifest** (one
JSON file, written atomically into a private temporary directory) and starts pytest with
`--falsify-manifest PATH`. pytest-xdist hands the same option to every worker. The manifest
holds everything the pytest plugin and the runtime need to know about the run:

    {"version": 1,
     "project_root": "<project>",             # put on sys.path: the project's own modules
     "contracts": {"<id>": {"path": "<absolute path>.yaml", "sha256": "..."}},
     "binds": {"softmax.torch": "mymod:fn"},   # `--bind` overrides (EQUATION.BACKEND)
     "policy": {"softmax.torch": {"dtypes": ["float64"], "zero_size": {"n": "empty"}}},
                                               # a bound function's own API policy (conformance)
     "only": ["run:<ledger key>", ...],        # when given, the only checks kept
     "profile": "fast",                        # hypothesis profile (fast | ci | thorough)
     "backends": ["reference", "torch", ...],  # backends whose tests are kept
     "select": "checks",                       # checks | mutants | all
     "ledger": "<project>/.falsify/ledger.json",  # where the controller merges the results
     "results": "<run tmp dir>/results.json",  # this session's entries, for the command
     "reuse": ["run:<ledger key>", ...],       # `--changed`: passing results kept, not re-run
     "example_db": "<dir>" | null,             # hypothesis' example database (null: the project's)
     "durations": {"<node id>": 12.5}}         # seconds each test took last time: longest first

The plugin activates the manifest in each process (`activate`); the runtime reads the profile,
the binds and the contract table from `active()` and nothing else. At session end the
controller merges the entries into the ledger and writes exactly this session's entries to
`results` (`write_results`), which the command reads back (`read_results`): nothing returns
through module globals or environment variables. A plain `pytest` run has no manifest: the
plugin then takes the ledger and profile from the project (falsify.harness.project).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from falsify.harness.files import atomic_write

VERSION = 1
SELECT = ("checks", "mutants", "all")


class HandoverError(RuntimeError):
    pass


@dataclass(frozen=True)
class Manifest:
    project_root: str
    contracts: dict[str, dict] = field(default_factory=dict)
    binds: dict[str, str] = field(default_factory=dict)
    policy: dict[str, dict] = field(default_factory=dict)
    only: list[str] = field(default_factory=list)
    profile: str = "fast"
    backends: list[str] = field(default_factory=list)
    select: str = "checks"
    ledger: str | None = None
    results: str | None = None
    reuse: list[str] = field(default_factory=list)
    example_db: str | None = None
    durations: dict[str, float] = field(default_factory=dict)
    version: int = VERSION

    def contract_path(self, contract_id: str) -> Path | None:
        e = self.contracts.get(contract_id)
        return Path(e["path"]) if e else None


def atomic_write_json(path: Path, data) -> None:
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True, default=str))


def write(path: Path, m: Manifest) -> Path:
    if m.select not in SELECT:
        raise HandoverError(f"select must be one of {', '.join(SELECT)}, not {m.select!r}")
    atomic_write_json(path, asdict(m))
    return Path(path)


def read(path: str | Path) -> Manifest:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise HandoverError(f"run manifest {path}: {e}") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise HandoverError(f"run manifest {path}: not a version-{VERSION} manifest")
    try:
        return Manifest(**data)
    except TypeError as e:
        raise HandoverError(f"run manifest {path}: {e}") from None


_ACTIVE: list[Manifest] = []  # at most one: the manifest of the run this process serves


def activate(m: Manifest | None) -> None:
    _ACTIVE[:] = [m] if m is not None else []


def active() -> Manifest | None:
    return _ACTIVE[0] if _ACTIVE else None


def write_results(path: str | Path, runs: list[dict], mutants: list[dict]) -> None:
    atomic_write_json(Path(path), {"version": VERSION, "runs": runs, "mutants": mutants})


def read_results(path: str | Path) -> dict:
    p = Path(path)
    if not p.exists():  # pytest stopped before the session finished (collection error)
        return {"runs": [], "mutants": []}
    return json.loads(p.read_text(encoding="utf-8"))
