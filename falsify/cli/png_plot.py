"""Line charts written as PNG with the standard library (zlib + struct).

Neither matplotlib nor Pillow is installed in this project's environment, and the pictures the
CLI draws are a handful of polylines (`falsify parity --plot`: log₁₀ relative error per point;
`falsify finetune --method grpo`: the mean reward per step), so they are rasterised here: no
plotting dependency for a few charts.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from pathlib import Path

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
GRID, AXIS = (220, 220, 220), (0, 0, 0)
W, H, PAD = 640, 360, 30


def png_bytes(pixels: list[bytearray], width: int, height: int) -> bytes:
    """An 8-bit RGB PNG of `pixels` (height rows of 3·width bytes)."""
    raw = b"".join(b"\x00" + bytes(row) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


class Canvas:
    def __init__(self, width: int = W, height: int = H):
        self.w, self.h = width, height
        self.px = [bytearray(b"\xff" * 3 * width) for _ in range(height)]

    def line(self, x0, y0, x1, y1, c) -> None:
        """A 2-pixel-thick segment (a polyline stays visible when scaled down)."""
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(n + 1):
            x, y = round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n)
            for dy in (0, 1):
                if 0 <= x < self.w and 0 <= y + dy < self.h:
                    self.px[y + dy][3 * x:3 * x + 3] = bytes(c)

    def write(self, path: str | Path) -> None:
        """Atomically: beside the target, then renamed over it."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(png_bytes(self.px, self.w, self.h))
        os.replace(tmp, path)


def line_chart(series: dict[str, list[float]], grid: list[float], lo: float, hi: float,
               width: int = W, height: int = H) -> Canvas:
    """Each series a polyline over its index (x from 0 to the longest series' end), y from lo
    (bottom) to hi (top); grey horizontal lines at the `grid` values; axes in black."""
    cv = Canvas(width, height)
    n = max((len(v) for v in series.values()), default=1)
    span = (hi - lo) or 1.0

    def xy(i, v):
        return (PAD + (width - 2 * PAD) * i / max(n - 1, 1),
                height - PAD - (height - 2 * PAD) * (v - lo) / span)
    for g in grid:
        _, y = xy(0, g)
        cv.line(PAD, round(y), width - PAD, round(y), GRID)
    cv.line(PAD, PAD, PAD, height - PAD, AXIS)
    cv.line(PAD, height - PAD, width - PAD, height - PAD, AXIS)
    for vs, c in zip(series.values(), COLORS, strict=False):
        pts = [xy(i, v) for i, v in enumerate(vs)]
        for (a, b), (p, q) in zip(pts, pts[1:]):
            cv.line(round(a), round(b), round(p), round(q), c)
    return cv


def write_log10(path: str | Path, series: dict[str, list[float]]) -> None:
    """log₁₀ of each (positive) value; grey lines mark each power of ten, the y range spans
    the data's decades."""
    logs = {k: [math.log10(max(v, 1e-18)) for v in vs] for k, vs in series.items()}
    allv = [v for vs in logs.values() for v in vs] or [0.0]
    lo, hi = math.floor(min(allv)), math.ceil(max(allv)) + (min(allv) == max(allv))
    line_chart(logs, list(range(lo, hi + 1)), lo, hi).write(path)


def write_linear(path: str | Path, series: dict[str, list[float]], lo: float, hi: float,
                 ticks: int = 4) -> None:
    """Values on a linear axis from lo to hi, with `ticks` + 1 grey grid lines."""
    grid = [lo + (hi - lo) * k / ticks for k in range(ticks + 1)]
    line_chart(series, grid, lo, hi).write(path)
