"""`falsify parity --plot FILE.png`: log₁₀ relative error per point, one line per backend.

Neither matplotlib nor Pillow is installed in this project's environment, and the picture is
a handful of polylines, so it is rasterised here and written as a PNG with the standard
library (zlib + struct): no plotting dependency for one chart.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
W, H, PAD = 640, 360, 30


def _png(pixels: list[bytearray]) -> bytes:
    raw = b"".join(b"\x00" + bytes(row) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _line(px, x0, y0, x1, y1, c):
    n = max(abs(x1 - x0), abs(y1 - y0), 1)
    for i in range(n + 1):
        x, y = round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n)
        for dy in (0, 1):
            if 0 <= x < W and 0 <= y + dy < H:
                px[y + dy][3 * x:3 * x + 3] = bytes(c)


def write(path: str | Path, series: dict[str, list[float]]) -> None:
    """series: backend -> relative error per point (forward order). Grey horizontal lines mark
    each power of ten; the y range spans the data's decades."""
    px = [bytearray(b"\xff" * 3 * W) for _ in range(H)]
    logs = {k: [math.log10(max(v, 1e-18)) for v in vs] for k, vs in series.items()}
    allv = [v for vs in logs.values() for v in vs] or [0.0]
    lo, hi = math.floor(min(allv)), math.ceil(max(allv)) + (min(allv) == max(allv))
    n = max((len(v) for v in logs.values()), default=1)

    def xy(i, v):
        return (PAD + (W - 2 * PAD) * i / max(n - 1, 1),
                H - PAD - (H - 2 * PAD) * (v - lo) / (hi - lo))
    for dec in range(lo, hi + 1):
        _, y = xy(0, dec)
        _line(px, PAD, round(y), W - PAD, round(y), (220, 220, 220))
    _line(px, PAD, PAD, PAD, H - PAD, (0, 0, 0))
    _line(px, PAD, H - PAD, W - PAD, H - PAD, (0, 0, 0))
    for (_name, vs), c in zip(logs.items(), COLORS, strict=False):
        pts = [xy(i, v) for i, v in enumerate(vs)]
        for (a, b), (p, q) in zip(pts, pts[1:]):
            _line(px, round(a), round(b), round(p), round(q), c)
    Path(path).write_bytes(_png(px))
