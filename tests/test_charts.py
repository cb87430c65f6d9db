"""The CLI's PNG charts (falsify/cli/charts.py): a real image, labelled, written atomically."""

from __future__ import annotations

import numpy as np
from matplotlib.image import imread

from falsify.cli import charts

HOW = dict(title="t", xlabel="batch", ylabel="reward")


def test_the_chart_is_a_png_with_the_curve_drawn(tmp_path):
    p = charts.line_chart(tmp_path / "r.png", {"mean reward": [0.1, 0.3, 0.2, 0.6]},
                          ylim=(0.0, 1.0), **HOW)
    img = imread(p)
    assert img.shape[:2] == (450, 800)
    # the series colour (matplotlib's first, #1f77b4) is on the canvas: the line was drawn
    blue = np.all(np.abs(img[..., :3] - np.array([0x1F, 0x77, 0xB4]) / 255) < 0.02, axis=-1)
    assert blue.sum() > 100
    assert [q.name for q in tmp_path.iterdir()] == ["r.png"]  # no temporary left behind


def test_a_log_axis_says_which_exact_zeros_it_leaves_out():
    fig = charts.figure({"torch": [0.0, 1e-7, 2e-6], "triton": [1e-8, 2e-7, 1e-6]}, log=True,
                        xticks=["embedding", "L0.block", "logits"], **HOW)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "torch (1 exact 0, not drawn)", "triton"]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["embedding", "L0.block", "logits"]
