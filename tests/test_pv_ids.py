"""Every `pv` verb takes a contract id as well as a path, and a name that resolves to nothing
is a usage error (exit 2) — never an empty report that exits 0."""

from __future__ import annotations

import pytest

from falsify.cli.pv import main


@pytest.mark.parametrize("verb", [["status"], ["validate"], ["audit"], ["equations"]])
def test_verbs_accept_a_contract_id(verb, capsys):
    code = main([*verb, "softmax-kernel-v1"])
    out = capsys.readouterr().out
    assert "softmax-kernel-v1" in out or "1 contract(s)" in out, out
    assert code in (0, 1)  # audit exits 1 on gaps when the ledger lacks results


@pytest.mark.parametrize("verb", [["status"], ["validate"], ["audit"], ["coverage"]])
def test_unknown_contract_is_a_usage_error(verb, capsys):
    assert main([*verb, "no-such-contract-v1"]) == 2
    assert "no-such-contract-v1" in capsys.readouterr().err
