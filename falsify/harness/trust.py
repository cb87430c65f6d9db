"""Where a module named on a command line or in a config would be imported from.

`falsify run --bind EQ=module:function`, `falsify parity --bind` and a GRPO config's
`reward = "module:function"` import code by design. What falsify refuses without
`--allow-any-import` is code from anywhere else than:

- the current project (the directory of its falsify.toml / pyproject.toml, or the working
  directory when there is none);
- the installed packages: the standard library, the interpreter's site-packages (system and
  user) and the source trees of editable installs (`pip install -e`), as their
  `direct_url.json` records them;
- falsify itself.

A module reached only through PYTHONPATH or a `sys.path` entry pointing elsewhere (a download
directory, /tmp, another checkout) is the case this catches. The module is located with
`importlib.util.find_spec` on its top-level name, which runs none of its code."""

from __future__ import annotations

import importlib.util
import json
import site
import sys
import sysconfig
from functools import cache
from importlib import metadata
from pathlib import Path

FLAG = "--allow-any-import"


@cache
def installed_roots() -> tuple[Path, ...]:
    """The directories whose modules count as installed."""
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    dirs += [site.getusersitepackages()] if site.ENABLE_USER_SITE else []
    dirs += [str(Path(__file__).resolve().parents[1])]  # falsify itself
    dirs += editable_roots()
    return tuple(sorted({Path(d).resolve() for d in dirs}))


def editable_roots() -> list[str]:
    """Source trees installed with `pip install -e` (PEP 610 `direct_url.json`)."""
    out = []
    for dist in metadata.distributions():
        raw = dist.read_text("direct_url.json")
        if not raw:
            continue
        try:
            info = json.loads(raw)
        except ValueError:
            continue
        url = info.get("url", "")
        if info.get("dir_info", {}).get("editable") and url.startswith("file://"):
            out.append(url[len("file://"):])
    return out


def locations(module: str) -> list[Path] | None:
    """The files or package directories `module`'s top-level name resolves to; [] for a
    built-in or frozen module; None when it cannot be found (the import's own error will
    say so)."""
    top = module.split(".")[0]
    loaded = sys.modules.get(top)
    try:
        spec = loaded.__spec__ if loaded is not None else importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return [Path(p).resolve() for p in spec.submodule_search_locations]
    if spec.origin in (None, "built-in", "frozen"):
        return []
    return [Path(spec.origin).resolve()]


def import_origin_error(module: str, project_root: Path | None) -> str | None:
    """Why importing `module` would run code from outside the project and the installed
    packages (a sentence naming where it lies), or None."""
    found = locations(module)
    if not found:
        return None
    root = Path(project_root or Path.cwd()).resolve()
    trusted = (root, *installed_roots())
    outside = [p for p in found if not any(p.is_relative_to(t) for t in trusted)]
    if not outside:
        return None
    return (f"module {module!r} would be imported from {outside[0]}, outside the project "
            f"({root}) and the installed packages; pass {FLAG} to import it anyway")
