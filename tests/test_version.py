"""`falsify --version` and `pv --version` name the installed package's version."""

from __future__ import annotations

from importlib.metadata import version

import pytest

import falsify
from falsify.cli import main as falsify_main
from falsify.cli.pv import main as pv_main


@pytest.mark.parametrize("main", [falsify_main, pv_main], ids=["falsify", "pv"])
def test_version_flag_prints_the_package_version(main, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"falsify {falsify.__version__}"


def test_package_version_matches_the_distribution_metadata():
    assert falsify.__version__ == version("falsify") == "0.1.0"
