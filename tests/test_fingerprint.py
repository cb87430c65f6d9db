"""A result goes stale only when the code its check executes changes: comments, docstrings and
functions the check never reaches do not count; the bound function, a helper it calls in
another module, a constant it reads and its default arguments do.

A temporary project binds one contract to `fp_kern:f`; `fp_kern.g` is unrelated and `f` calls
`fp_helper.h`. Each edit is checked with the harness's own `impl_hash`, the hash `pv coverage`
compares a ledger entry against.
"""

from __future__ import annotations

import sys

import pytest
import yaml

from falsify.harness import fingerprint
from falsify.harness.model import load_contract
from falsify.harness.project import library_dir

KERN = '''"""Kernels."""
from fp_helper import h

SCALE = 2.0  # the scale


def f(x, dim=-1):
    """Scaled."""
    return h(x) * SCALE


def g(x):
    return x + 1
'''
HELPER = '''def h(x):
    return x
'''


@pytest.fixture
def proj(tmp_path, monkeypatch):
    (tmp_path / "contracts").mkdir()
    (tmp_path / "falsify.toml").write_text('backends = ["reference", "torch"]\n')
    data = yaml.safe_load((library_dir() / "softmax-kernel-v1.yaml").read_text())
    eq = data["equations"]["softmax"]
    eq["bindings"].pop("triton")
    eq["bindings"]["torch"] = "fp_kern:f"
    (tmp_path / "contracts" / "fp-v1.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "fp_kern.py").write_text(KERN)
    (tmp_path / "fp_helper.py").write_text(HELPER)
    monkeypatch.chdir(tmp_path)
    fingerprint.reset_cache()
    yield tmp_path
    fingerprint.reset_cache()
    # the audit imports the bound modules; a loaded module is found before any file, so the
    # next test's project would be hashed from this one's
    for name in [m for m in sys.modules if m.split(".")[0] in ("fp_kern", "fp_helper", "fp_pkg")]:
        del sys.modules[name]


def _hashes(proj) -> dict[tuple[str, str], str]:
    fingerprint.reset_cache()
    c, _ = load_contract(proj / "contracts" / "fp-v1.yaml")
    return {(ch.id, b): fingerprint.impl_hash(c, b, ch)
            for ch in c.checks for b in ("reference", "torch")}


def _staled(proj, path: str, old: str, new: str) -> set[tuple[str, str]]:
    before = _hashes(proj)
    p = proj / path
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new))
    after = _hashes(proj)
    p.write_text(text)
    return {k for k in before if before[k] != after[k]}


def test_only_edits_to_what_runs_stale(proj):
    c, _ = load_contract(proj / "contracts" / "fp-v1.yaml")
    # the checks that execute f: everything on torch except symbolic/static ones with a target
    torch_checks = {(ch.id, "torch") for ch in c.checks
                    if (ch.spec or {}).get("kind") not in ("symbolic", "static")}
    assert torch_checks
    assert _staled(proj, "fp_kern.py", "# the scale", "# a comment edit") == set()
    assert _staled(proj, "fp_kern.py", '"""Scaled."""', '"""Scaled, edited."""') == set()
    assert _staled(proj, "fp_kern.py", '"""Kernels."""', '"""Kernels, edited."""') == set()
    assert _staled(proj, "fp_kern.py", "return x + 1", "return x + 2") == set()  # g
    for path, old, new in [("fp_kern.py", "* SCALE", "* SCALE * 1"),        # f's body
                           ("fp_helper.py", "return x", "return x * 1"),   # the helper f calls
                           ("fp_kern.py", "SCALE = 2.0", "SCALE = 3.0"),   # a constant f reads
                           ("fp_kern.py", "dim=-1", "dim=0")]:             # f's default
        assert _staled(proj, path, old, new) == torch_checks, (path, old)


def test_a_dynamic_lookup_counts_the_whole_module_and_says_so(proj):
    (proj / "fp_kern.py").write_text(KERN.replace("return h(x) * SCALE",
                                                  "return globals()['g'](h(x))"))
    c, _ = load_contract(proj / "contracts" / "fp-v1.yaml")
    fb = fingerprint.fallbacks(c, ("torch",))
    assert fb and {m for _, m, _ in fb} == {"fp_kern"}
    assert _staled(proj, "fp_kern.py", "return x + 1", "return x + 2")  # g now counts


def test_getattr_on_a_value_is_an_attribute_but_on_a_module_counts_it_whole(proj):
    # getattr(x, name) with a computed name reaches what x.attr would: on a value, nothing the
    # check's closure does not hold already; on a module object, any function of that module
    (proj / "fp_kern.py").write_text(KERN.replace("return h(x) * SCALE",
                                                  "return getattr(x, str(dim)) * SCALE"))
    c, _ = load_contract(proj / "contracts" / "fp-v1.yaml")
    assert fingerprint.fallbacks(c, ("torch",)) == []
    assert _staled(proj, "fp_kern.py", "return x + 1", "return x + 2") == set()
    (proj / "fp_kern.py").write_text("import fp_helper\n" + KERN.replace(
        "return h(x) * SCALE", "return getattr(fp_helper, str(dim))(x)"))
    (proj / "fp_helper.py").write_text(HELPER + "\n\ndef k(x):\n    return x\n")
    fingerprint.reset_cache()
    fb = fingerprint.fallbacks(c, ("torch",))
    assert {m for _, m, _ in fb} == {"fp_helper"}, fb
    assert _staled(proj, "fp_helper.py", "def k(x):\n    return x", "def k(x):\n    return -x")


def test_the_audit_names_each_module_counted_whole(proj):
    from falsify.harness import audit

    c, _ = load_contract(proj / "contracts" / "fp-v1.yaml")
    assert audit.audit_checks(c).fingerprint_fallbacks == []
    (proj / "fp_kern.py").write_text(KERN.replace("return h(x) * SCALE",
                                                  "return globals()['g'](h(x))"))
    fingerprint.reset_cache()
    a = audit.audit_checks(c)
    assert {f["module"] for f in a.fingerprint_fallbacks} == {"fp_kern"}
    line = next(x for x in a.chain if "whole fp_kern" in x)
    assert "globals() with a name known only at run time" in line


def test_a_backend_dispatch_by_f_string_counts_every_module_it_can_name(proj):
    # f(x) imports fp_pkg.<backend>.kern at run time: an edit to any kern it can pick stales
    # the check, an edit to a module the pattern cannot name does not
    for backend in ("a", "b"):
        d = proj / "fp_pkg" / backend
        d.mkdir(parents=True)
        (d / "__init__.py").write_text("")
        (d / "kern.py").write_text("def run(x):\n    return x\n")
        (d / "other.py").write_text("def run(x):\n    return x\n")
    (proj / "fp_pkg" / "__init__.py").write_text("")
    (proj / "fp_kern.py").write_text("import importlib\n\nKERN = 'kern'\n" + KERN.replace(
        "return h(x) * SCALE",
        "name = f'fp_pkg.{x.backend}.{KERN}'\n    return importlib.import_module(name).run(x)"))
    c, _ = load_contract(proj / "contracts" / "fp-v1.yaml")
    fb = fingerprint.fallbacks(c, ("torch",))
    assert {m for _, m, _ in fb} == {"fp_pkg.a.kern", "fp_pkg.b.kern"}, fb
    edit = ("return x", "return x * 1")
    assert _staled(proj, "fp_pkg/b/kern.py", *edit)
    assert _staled(proj, "fp_pkg/a/other.py", *edit) == set()


def test_a_fixture_the_contract_declares_stales_every_check_when_its_bytes_change(proj):
    """A data file the checks read (a trained tokenizer) counts by its bytes, for every check
    on every backend; a file beside it that the contract does not declare does not count."""
    path = proj / "contracts" / "fp-v1.yaml"
    data = yaml.safe_load(path.read_text())
    data["metadata"]["fixtures"] = ["fixtures/table.json"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (proj / "contracts" / "fixtures").mkdir()
    (proj / "contracts" / "fixtures" / "table.json").write_text('{"a": 1}\n')
    (proj / "contracts" / "fixtures" / "other.json").write_text('{"b": 1}\n')
    every = set(_hashes(proj))
    assert _staled(proj, "contracts/fixtures/table.json", '"a": 1', '"a": 2') == every
    assert _staled(proj, "contracts/fixtures/other.json", '"b": 1', '"b": 2') == set()
    before = _hashes(proj)
    (proj / "contracts" / "fixtures" / "table.json").unlink()  # a missing fixture: stale too
    after = _hashes(proj)
    assert {k for k in before if before[k] != after[k]} == every
