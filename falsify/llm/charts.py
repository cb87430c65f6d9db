"""Line charts written as PNG, drawn with matplotlib's Agg backend (no display needed):
`falsify parity --plot` (relative error per point, log scale) and `falsify finetune --method
grpo` (the mean reward per batch)."""

from __future__ import annotations

import os
from pathlib import Path


def line_chart(path: str | Path, series: dict[str, list[float]], **how) -> Path:
    """`figure(series, **how)` written as PNG atomically (beside the target, then renamed
    over it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    figure(series, **how).savefig(tmp, format="png")
    os.replace(tmp, path)
    return path


def figure(series: dict[str, list[float]], *, title: str, xlabel: str, ylabel: str,
           log: bool = False, ylim: tuple[float, float] | None = None,
           xticks: list[str] | None = None):
    """One polyline per series over its index, a legend, a grid. `xticks` names the x
    positions (rotated)."""
    from matplotlib.figure import Figure  # Figure without pyplot: no global state, no GUI

    fig = Figure(figsize=(8, 4.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for name, values in series.items():
        zeros = sum(v <= 0 for v in values) if log else 0
        # a log axis cannot place 0 (an exact result): it is left out, and the legend says so
        label = f"{name} ({zeros} exact 0, not drawn)" if zeros else name
        ax.plot(range(len(values)), values, marker="." if len(values) <= 60 else None,
                label=label)
    if log:
        ax.set_yscale("log", nonpositive="mask")
    if ylim is not None:
        ax.set_ylim(*ylim)
    if xticks is not None:
        ax.set_xticks(range(len(xticks)), xticks, rotation=60, ha="right", fontsize=7)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig
