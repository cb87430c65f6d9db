"""pytest plugin (`-p falsify.harness.mutation_apply`): run the selected checks against one
mutant, served by the import system; the file on disk is never edited.

`falsify mutate` starts pytest in a subprocess with FALSIFY_MUTATION naming a JSON file:
    {"module": "pkg.kern", "path": "/abs/pkg/kern.py", "source": "<the mutated module>",
     "keep": [["<contract id>", "<check id>", "<backend>"], ...],
     "order": [["<contract id>", "<check id>", "<backend>"], ...],  # run first, in this order
     "report": "<file this plugin writes: the first failing check>"}
`-p` plugins load before pytest's entry-point plugins, the conftests and the test modules, so
the finder is first on sys.meta_path before anything imports the module. A module imported
earlier still (by this plugin's own imports: falsify's package `__init__`s) cannot be served:
the run stops with an error naming it rather than testing the original. The mutated text also
goes into linecache under the file's name, so code that reads its own source (`inspect`,
`triton.jit`) sees the mutant too.

Only the standard library is imported here: the less this module loads, the more modules can
be mutated.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import linecache
import os
import sys
from pathlib import Path

ENV = "FALSIFY_MUTATION"


class _Loader(importlib.abc.Loader):
    def __init__(self, source: str, path: str):
        self.source, self.path = source, path

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        exec(compile(self.source, self.path, "exec"), module.__dict__)


class MutantFinder(importlib.abc.MetaPathFinder):
    """Finds `module` at `path` with `source` as its text; every other name falls through."""

    def __init__(self, module: str, path: str, source: str):
        self.module, self.path, self.source = module, path, source

    def find_spec(self, name, target_path=None, target=None):
        if name != self.module:
            return None
        package = Path(self.path).name == "__init__.py"
        return importlib.util.spec_from_file_location(
            name, self.path, loader=_Loader(self.source, self.path),
            submodule_search_locations=[str(Path(self.path).parent)] if package else None)


def install(spec: dict) -> MutantFinder:
    if spec["module"] in sys.modules:
        raise RuntimeError(f"{spec['module']} was imported before the mutant could be served "
                           "(falsify's own start-up imports it): it cannot be mutated this way")
    finder = MutantFinder(spec["module"], spec["path"], spec["source"])
    sys.meta_path.insert(0, finder)
    lines = spec["source"].splitlines(keepends=True)
    linecache.cache[spec["path"]] = (len(spec["source"]), None, lines, spec["path"])
    return finder


_SPEC: dict | None = None
_NAMES: dict[str, str] = {}  # node id -> "contract check backend (test name)"
if os.environ.get(ENV):
    _SPEC = json.loads(Path(os.environ[ENV]).read_text(encoding="utf-8"))
    if _SPEC.get("module"):  # none: the unmutated baseline, selection only
        install(_SPEC)


def pytest_configure(config):
    """No shrinking: a kill needs one failing example, not the smallest, and shrinking a
    mutant's failure can take minutes. The checks' own settings inherit the phases from the
    loaded profile (falsify.harness.runtime.check_settings sets none)."""
    if _SPEC is None:
        return
    from hypothesis import Phase, settings

    settings.register_profile("falsify-mutate",
                              phases=[p for p in Phase if p is not Phase.shrink])
    settings.load_profile("falsify-mutate")


def _key(item) -> tuple[str, str, str] | None:
    mark = item.get_closest_marker("falsify")
    if mark is None:
        return None
    c = mark.kwargs.get("contract")
    return (getattr(c, "id", c), mark.kwargs.get("check"), mark.kwargs.get("backend"))


def pytest_collection_modifyitems(config, items):
    """Keep the checks whose fingerprint reaches the mutated function, and nothing else."""
    if _SPEC is None:
        return
    keep = {tuple(k) for k in _SPEC["keep"]}
    rank = {tuple(k): n for n, k in enumerate(_SPEC.get("order") or ())}
    # the likeliest killers first (mutate's order); a stable sort keeps each check's dtypes
    kept = sorted((i for i in items if _key(i) in keep), key=lambda i: rank.get(_key(i),
                                                                                 len(rank)))
    _NAMES.update({i.nodeid: " ".join(_key(i)) + f" ({i.name})" for i in kept})
    dropped = [i for i in items if _key(i) not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _first_failure(what: str) -> None:
    out = Path(_SPEC["report"])
    if not out.exists():
        out.write_text(json.dumps({"killed_by": what}), encoding="utf-8")


def pytest_runtest_logreport(report):
    if _SPEC is not None and report.failed:
        _first_failure(_NAMES.get(report.nodeid, report.nodeid))


def pytest_collectreport(report):
    if _SPEC is not None and report.failed:
        _first_failure(f"collection error in {report.nodeid or 'the session'}")
