"""`falsify --version` and `pv --version` name themselves and the installed package's version."""

from __future__ import annotations

from importlib.metadata import version

import pytest

import falsify
from falsify.cli import main as falsify_main
from falsify.cli.pv import main as pv_main


@pytest.mark.parametrize(("main", "name"), [(falsify_main, "falsify"),
                                            (pv_main, "pv (falsify)")], ids=["falsify", "pv"])
def test_version_flag_names_the_command_and_the_package_version(main, name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"{name} {falsify.__version__}"


def test_package_version_matches_the_distribution_metadata():
    assert falsify.__version__ == version("falsify") == "0.1.0"
