"""What a person watching a long command sees while it goes on, shared by `falsify run`,
`falsify mutants`, `falsify soak` and the benches.

On a terminal: a live rich display with units done of total, a status text (checks passed and
failed so far, what runs now, an ETA) and the time elapsed. In a log (no terminal): one line per
finished unit, since a live display there is a stream of control codes and a person reading the
log afterwards wants each unit's counts and seconds. In both, a failure is printed when it
happens, not only in the summary at the end.

It lives in the harness, the lowest layer every command can import (cli, bench and the pytest
plugin alike), and it holds no measurement: callers update it between measurements only.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def fmt_seconds(secs: float) -> str:
    """An ETA or time left, to the unit a person reads at a glance."""
    return f"{secs / 60:.0f} min" if secs >= 90 else f"{secs:.0f} s"


class Progress:
    """A context manager; `console` is a rich Console (its is_terminal picks the mode).

    `label` names the units ("contracts", "cases"); `total` is how many there are (None while
    unknown: `set_total` later). The ETA is `eta()` where the caller knows better (a ledger's
    durations, a time budget), else the mean seconds of the units finished so far times the
    units left.

    `ticking=False` is for benches: rich's refresh thread would wake ten times a second inside
    the measured region and take a core from the kernel under test; without it the display is
    redrawn only when the caller updates it, between measurements."""

    def __init__(self, console, label: str, total: int | None = None,
                 eta: Callable[[], str] | None = None, ticking: bool = True):
        self.console = console
        self.ticking = ticking
        self.label = label
        self.total = total
        self._eta = eta
        self.done = self.passed = self.failed_n = 0
        self.now = ""
        self.extra = ""  # a caller's own status words (e.g. a soak's contracts covered)
        self.started = time.monotonic()
        self.live = self.task = None

    def __enter__(self) -> Progress:
        if self.console.is_terminal:
            from rich.progress import BarColumn, ProgressColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress
            from rich.text import Text

            view = self

            class Status(ProgressColumn):
                # worded at each redraw, so a time budget's "left" counts down between events
                def render(self, task):
                    return Text.from_markup(view.status())

            self.live = RichProgress(TextColumn(f"[bold]{self.label} " + "{task.fields[done]}"),
                                     BarColumn(), Status(), TimeElapsedColumn(),
                                     console=self.console, transient=False,
                                     auto_refresh=self.ticking)
            self.live.start()
            self.task = self.live.add_task(self.label, total=self.total, done=self._done())
            self.refresh()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.now = "-"
            self.refresh()
            self.live.stop()
            self.live = None

    def set_total(self, total: int) -> None:
        self.total = total
        self.refresh()

    def start(self, unit: str) -> None:
        """`unit` is what runs now."""
        self.now = unit
        self.refresh()

    def check(self, ok: bool, n: int = 1) -> None:
        """`n` checks finished, passed or failed."""
        if ok:
            self.passed += n
        else:
            self.failed_n += n
        self.refresh()

    def failed(self, msg: str) -> None:
        """Print a failure now: on a terminal rich prints it above the live display."""
        self.console.print(msg, markup=False, style="bold red", soft_wrap=True)

    def finished(self, line: str) -> None:
        """One unit finished; `line` (its counts and seconds) is printed in a log only: on a
        terminal the display already shows it."""
        self.done += 1
        if self.live is None:
            self.console.print(line, markup=False, soft_wrap=True)
        self.refresh()

    def eta(self) -> str:
        if self._eta is not None:
            return self._eta()
        if not self.total or not self.done:
            return ""
        left = max(0, self.total - self.done)
        return f"ETA {fmt_seconds((time.monotonic() - self.started) / self.done * left)}"

    def status(self) -> str:
        """The display's status words, as rich markup: the caller's own words are escaped (a
        contract's path or a case's label may hold brackets)."""
        from rich.markup import escape

        failed = f", [red]{self.failed_n} failed[/]" if self.failed_n else ""
        words = [f"checks {self.passed} passed{failed}" if self.passed or self.failed_n else "",
                 escape(self.extra), escape(f"now {self.now}") if self.now else "",
                 escape(self.eta())]
        return "; ".join(w for w in words if w)

    def refresh(self) -> None:
        if self.live is None:
            return
        total = self.total
        self.live.update(self.task, total=total, completed=min(self.done, total or self.done),
                         done=self._done(), refresh=not self.ticking)

    def _done(self) -> str:
        return f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
