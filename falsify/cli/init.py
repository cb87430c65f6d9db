"""`falsify init [--kernel NAME] [--package PKG]`: set up falsify in the project in the current
directory.

Writes the `[tool.falsify]` config (appended to pyproject.toml, else falsify.toml), a minimal
contract `contracts/NAME-kernel-v1.yaml` (one parity obligation, one check, one mutant) bound to
a stub numpy reference and a stub torch implementation in the user's package, a GitHub Actions
workflow, a pre-commit configuration and a `.falsify/` line in .gitignore (the ledger and caches
are local state). A file that is already there is never overwritten: it is listed as kept. In
a flat-layout setuptools project it also names the package (`[tool.setuptools.packages.find]`),
so the workflow's `pip install -e .` does not stop on contracts/ as a second top-level package.
Until the two stubs are written, `falsify run` fails on the parity check and says what to
write; that is the intended first state.
"""

from __future__ import annotations

import re
import string
import sys
from importlib import resources
from pathlib import Path

from falsify.errors import UsageError
from falsify.harness.files import atomic_write

KERNEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")  # a Python module name and a contract equation


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest depends on the backport there
        import tomli as tomllib
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise UsageError(f"{path}: cannot read it as TOML: {e}") from None


def _template(name: str, **subs) -> str:
    # Python templates are stored as NAME.py.tmpl: `$name` placeholders are not Python, and a
    # .py file would be linted and byte-compiled as package code.
    stored = f"{name}.tmpl" if name.endswith(".py") else name
    text = (resources.files("falsify") / "templates" / stored).read_text(encoding="utf-8")
    return string.Template(text).substitute(subs)


def _package(root: Path, explicit: str | None) -> tuple[str, Path, str]:
    """(import name, directory, how it was chosen)."""
    if explicit:
        name, how = explicit, "--package"
    else:
        project = _toml(root / "pyproject.toml").get("project", {}) \
            if (root / "pyproject.toml").is_file() else {}
        if project.get("name"):
            name, how = project["name"], "pyproject.toml [project].name"
        else:
            name, how = root.name, "the directory name"
        name = re.sub(r"[-.]+", "_", name).lower()
    if not name.isidentifier():
        raise UsageError(f"package name {name!r} (from {how}) is not a Python identifier: "
                         "pass --package NAME")
    for d in (root / "src" / name, root / name):  # src layout first, as packaging tools do
        if d.is_dir():
            return name, d, how
    return name, root / name, how


def _config(root: Path) -> tuple[Path, str | None]:
    """(file, new content) for the config; None: a config is there already, kept."""
    table = _template("config.toml")
    pyproject, standalone = root / "pyproject.toml", root / "falsify.toml"
    if standalone.is_file():
        return standalone, None
    if pyproject.is_file():
        if "falsify" in _toml(pyproject).get("tool", {}):
            return pyproject, None
        return pyproject, _append(pyproject.read_text(encoding="utf-8"),
                                  f"[tool.falsify]\n{table}")
    return standalone, table


SETUPTOOLS_BACKENDS = ("setuptools.build_meta", "setuptools.build_meta:__legacy__")


def _packaging(root: Path, pkg: str, pkg_dir: Path) -> str | None:
    """The `[tool.setuptools.packages.find]` table that names the package, when the workflow's
    `pip install -e .` needs it; None when it does not. contracts/ and site/ sit next to a
    flat-layout package, and setuptools' automatic discovery takes every top-level directory
    with an importable name for a package ("Multiple top-level packages discovered in a
    flat-layout"). Left alone: no [project] (the workflow installs nothing), another build
    backend, a src layout (discovery looks under src/ only), packages or modules the user
    set, or a setup.py/setup.cfg (which may set them)."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or pkg_dir != root / pkg:
        return None
    data = _toml(pyproject)
    backend = data.get("build-system", {}).get("build-backend", SETUPTOOLS_BACKENDS[1])
    tool = data.get("tool", {}).get("setuptools", {})
    if ("project" not in data or backend not in SETUPTOOLS_BACKENDS
            or {"packages", "py-modules"} & set(tool)
            or (root / "setup.py").exists() or (root / "setup.cfg").exists()):
        return None
    return ("\n# Written by `falsify init`: contracts/ and site/ are not packages; without this,\n"
            "# setuptools' flat-layout discovery stops `pip install -e .`.\n"
            f'[tool.setuptools.packages.find]\ninclude = ["{pkg}", "{pkg}.*"]\n')


def _append(old: str, table: str) -> str:
    sep = "" if old.endswith("\n\n") else ("\n" if old.endswith("\n") else "\n\n")
    return f"{old}{sep}{table.lstrip(chr(10))}"


def _gitignore(root: Path) -> str | None:
    """.gitignore with `.falsify/` (the ledger, caches and run locks: local state) added to
    the user's lines; None when an entry for it is there already."""
    path = root / ".gitignore"
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if {".falsify", ".falsify/", "/.falsify", "/.falsify/"} & {ln.strip() for ln in
                                                              old.splitlines()}:
        return None
    sep = "" if not old or old.endswith("\n") else "\n"
    return f"{old}{sep}.falsify/\n"


def plan(root: Path, kernel: str, package: str | None) -> tuple[list[tuple[Path, str]], str]:
    """The files `init` would write, in order, and how the package name was chosen."""
    pkg, pkg_dir, how = _package(root, package)
    from importlib.metadata import version

    # the workflow installs the falsify release and the torch build this one runs with
    subs = dict(kernel=kernel, package=pkg, prefix=kernel.upper().replace("_", ""),
                version=version("falsify"),
                torch=version("torch").split("+")[0])
    files = [(root / "contracts" / f"{kernel}-kernel-v1.yaml", _template("contract.yaml", **subs)),
             (pkg_dir / "__init__.py", _template("package_init.py", **subs)),
             (pkg_dir / f"{kernel}_reference.py", _template("reference.py", **subs)),
             (pkg_dir / f"{kernel}.py", _template("impl.py", **subs)),
             (pkg_dir / f"{kernel}_mutants.py", _template("mutants.py", **subs)),
             (root / ".github" / "workflows" / "falsify.yml", _template("workflow.yml", **subs)),
             (root / ".pre-commit-config.yaml", _template("pre-commit-config.yaml", **subs))]
    return files, f"package {pkg} ({how}) in {pkg_dir.relative_to(root) or '.'}/"


def cmd_init(args) -> int:
    kernel = args.kernel
    if not KERNEL_RE.match(kernel):
        raise UsageError(f"--kernel {kernel!r}: use a lowercase Python module name "
                         "(letters, digits, underscores), e.g. rms_norm")
    root = Path.cwd()
    files, chosen = plan(root, kernel, args.package)
    cfg, cfg_text = _config(root)
    pkg = _package(root, args.package)
    packaging = _packaging(root, *pkg[:2])
    wrote, kept = [], []
    if packaging is not None:  # the package named for setuptools, with the config or alone
        pyproject = root / "pyproject.toml"
        base = cfg_text if cfg == pyproject and cfg_text is not None \
            else pyproject.read_text(encoding="utf-8")
        atomic_write(pyproject, _append(base, packaging))
        wrote.append(pyproject)
    ignore = _gitignore(root)
    if ignore is not None:
        atomic_write(root / ".gitignore", ignore)
        wrote.append(root / ".gitignore")
    if cfg_text is None:
        kept += [] if cfg in wrote else [cfg]
    elif cfg not in wrote:
        atomic_write(cfg, cfg_text)
        wrote.append(cfg)
    for path, text in files:
        if path.exists():
            kept.append(path)
        else:
            atomic_write(path, text)
            wrote.append(path)
    print(f"falsify init: kernel {kernel}, {chosen}")
    for p in wrote:
        print(f"  wrote {p.relative_to(root)}")
    if packaging is not None:
        print(f"  (pyproject.toml: [tool.setuptools.packages.find] include = [\"{pkg[0]}\", "
              f"\"{pkg[0]}.*\"], so `pip install -e .` does not take contracts/ for a package)")
    for p in kept:
        print(f"  kept  {p.relative_to(root)} (already there, not overwritten)")
    _next_steps(kernel, files)
    return 0


def _next_steps(kernel: str, files) -> None:
    ref, impl = (p for p, _ in files if p.name in (f"{kernel}_reference.py", f"{kernel}.py"))
    print(f"next:\n  write {ref.relative_to(Path.cwd())} (numpy float64) and "
          f"{impl.relative_to(Path.cwd())} (torch)\n"
          f"  pv validate\n"
          f"  falsify run {kernel}-kernel-v1     # fails on the stubs until you write them\n"
          f"  falsify mutants {kernel}-kernel-v1\n"
          f"  pv coverage --min 100")
    sys.stdout.flush()


def register(sub) -> None:
    p = sub.add_parser("init", help="scaffold a project: config, contract, stubs, CI, pre-commit")
    p.add_argument("--kernel", default="mykernel",
                   help="kernel name: contracts/NAME-kernel-v1.yaml, PACKAGE/NAME.py "
                        "(default: mykernel)")
    p.add_argument("--package", default=None,
                   help="the Python package the stubs go in (default: pyproject.toml's "
                        "[project].name, else the directory name)")
    p.set_defaults(func=cmd_init)
