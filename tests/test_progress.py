"""The shared progress display (falsify.harness.progress): on a terminal a live display with
units done of total; in a log one line per finished unit; a failure printed when it happens."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from falsify.harness.progress import Progress, fmt_seconds


def _console(terminal: bool) -> tuple[Console, StringIO]:
    out = StringIO()
    return Console(file=out, force_terminal=terminal, width=200, color_system=None), out


def _go(console) -> None:
    with Progress(console, "cases", total=3) as p:
        p.start("first")
        p.check(True)
        p.finished("bench: first: 1 passed, 0 failed, 0 s")
        p.start("second")
        p.check(False)
        p.failed("FAILED second: boom")
        p.finished("bench: second: 0 passed, 1 failed, 0 s")


def test_in_a_log_one_line_per_finished_unit_and_the_failure_in_between():
    console, out = _console(False)
    assert not console.is_terminal
    _go(console)
    assert out.getvalue().splitlines() == ["bench: first: 1 passed, 0 failed, 0 s",
                                           "FAILED second: boom",
                                           "bench: second: 0 passed, 1 failed, 0 s"]


def test_on_a_terminal_the_display_shows_done_of_total_and_the_failure():
    console, out = _console(True)
    with Progress(console, "cases", total=3) as p:
        p.start("first")
        p.check(True)
        p.finished("bench: first: 1 passed, 0 failed, 0 s")
        p.failed("FAILED second: boom")
        # printed at once, above the live display, not kept for the end
        assert "FAILED second: boom" in out.getvalue()
        p.live.refresh()
        assert "cases 1/3" in out.getvalue() and "now first" in out.getvalue()
    text = out.getvalue()
    assert "checks 1 passed" in text
    # the per-unit lines are for a log: on a terminal the display says it
    assert "bench: first: 1 passed" not in text


def test_the_eta_is_the_callers_where_it_knows_better():
    console, _ = _console(False)
    p = Progress(console, "rounds", eta=lambda: "12 s left")
    assert p.eta() == "12 s left"
    q = Progress(console, "cases", total=4)
    assert q.eta() == ""  # nothing finished yet: no mean to go by
    q.finished("x")
    assert q.eta().startswith("ETA ")
    assert fmt_seconds(30) == "30 s" and fmt_seconds(600) == "10 min"
