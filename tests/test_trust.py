"""`--bind` and a GRPO reward's `module:function` import code by design, but only from the
current project and the installed packages unless `--allow-any-import` is given
(falsify/harness/trust.py). Locating the module runs none of its code: each refusal below is
shown to leave the module's side effect (a file it would write on import) undone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from falsify.cli import main
from falsify.harness import trust
from falsify.harness.project import find_project
from falsify.harness.trust import import_origin_error

SOFTMAX = """\
import pathlib
pathlib.Path({mark!r}).write_text("imported")

def softmax(x):
    import numpy as np
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

def score(prompt, completion, problem):
    return 0.0
"""


@pytest.fixture()
def outsider(tmp_path, monkeypatch):
    """A project directory (the working directory) and, beside it, a module `outsidemod` on
    sys.path that lies in neither the project nor the installed packages."""
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    (proj / "falsify.toml").write_text('generated = "gen"\nledger = "l.json"\n')
    mark = tmp_path / "IMPORTED"
    (elsewhere / "outsidemod.py").write_text(SOFTMAX.format(mark=str(mark)))
    (proj / "projmod.py").write_text(SOFTMAX.format(mark=str(tmp_path / "PROJ-IMPORTED")))
    monkeypatch.chdir(proj)
    monkeypatch.syspath_prepend(str(elsewhere))
    monkeypatch.syspath_prepend(str(proj))
    for m in ("outsidemod", "projmod"):
        monkeypatch.delitem(sys.modules, m, raising=False)
    return dict(proj=proj, elsewhere=elsewhere, mark=mark)


def test_a_module_outside_the_project_and_installed_packages_is_named(outsider):
    err = import_origin_error("outsidemod", outsider["proj"])
    assert err is not None and str(outsider["elsewhere"] / "outsidemod.py") in err
    assert "--allow-any-import" in err and str(outsider["proj"]) in err
    assert not outsider["mark"].exists()  # located, not imported


@pytest.mark.parametrize("module", ["projmod", "numpy", "json", "os", "falsify.kernels.torch",
                                    "no_such_module_anywhere"])
def test_project_installed_builtin_and_missing_modules_pass(outsider, module):
    # a missing module passes here: the import's own error reports it, with the binding
    assert import_origin_error(module, outsider["proj"]) is None


def test_without_a_project_the_working_directory_is_the_project(outsider):
    assert import_origin_error("outsidemod", None) is not None
    assert import_origin_error("projmod", None) is None


def test_editable_installs_count_as_installed():
    # falsify itself is installed editable in development, and from a wheel in CI's
    # packaging test: either way its directory is trusted
    import falsify

    assert any(Path(falsify.__file__).resolve().is_relative_to(r)
               for r in trust.installed_roots())


def test_run_bind_outside_is_refused_before_import(outsider, capsys):
    code = main(["run", "softmax-kernel-v1", "--bind", "softmax.torch=outsidemod:softmax",
                 "--backend", "torch"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--bind 'softmax.torch=outsidemod:softmax'" in err and "--allow-any-import" in err
    assert not outsider["mark"].exists()


def test_run_bind_outside_is_accepted_with_the_flag(outsider):
    from falsify.cli.run import _parse_binds
    from falsify.cli.session import select_contracts

    contracts = select_contracts(["softmax-kernel-v1"], find_project())
    ref = "outsidemod:softmax"
    with pytest.raises(Exception, match="allow-any-import"):
        _parse_binds([f"softmax.torch={ref}"], contracts, False)
    assert _parse_binds([f"softmax.torch={ref}"], contracts, True) == \
        {"softmax.torch": ref}
    assert outsider["mark"].exists()  # allowed: imported


def test_grpo_reward_outside_is_refused_before_import(outsider, capsys):
    code = main(["finetune", "method=grpo", "reward=outsidemod:score",
                 f"out_dir={outsider['proj'] / 'out'}"])
    out = capsys.readouterr()
    assert code == 2
    assert "config field reward='outsidemod:score'" in out.out + out.err
    assert "--allow-any-import" in out.out + out.err
    assert not outsider["mark"].exists()
    assert not (outsider["proj"] / "out").exists()
