"""The `falsify bench kernels` baseline file: its format and its validated reading.

Apart from the benchmark (which imports every kernel) so that the dispatcher
(falsify/llm/dispatch.py) can read a file's timings without importing them; here, below
the benchmark, because the application must not import falsify/bench.
"""

from __future__ import annotations

import json
from pathlib import Path

from falsify.errors import UsageError

BASELINE_FORMAT = "falsify-bench-kernels-baseline-v1"


def load_baseline(path: Path) -> dict:
    """The baseline file, validated; any problem is a one-line UsageError naming the file."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: baseline file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read the baseline file: {e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != BASELINE_FORMAT:
        raise UsageError(f"{path}: not a bench-kernels baseline (expected \"format\": "
                         f"\"{BASELINE_FORMAT}\"; write one with --save-baseline)")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise UsageError(f"{path}: \"rows\" must be a list")
    seen = set()
    for i, r in enumerate(rows):
        ok = (isinstance(r, dict) and all(isinstance(r.get(k), str)
                                          for k in ("kernel", "shape", "pass"))
              and isinstance(r.get("time_ratio"), (int, float))
              and not isinstance(r.get("time_ratio"), bool) and r["time_ratio"] > 0)
        if not ok:
            raise UsageError(f"{path}: row {i} needs string kernel/shape/pass and a positive "
                             "number time_ratio")
        key = (r["kernel"], r["shape"], r["pass"])
        if key in seen:
            raise UsageError(f"{path}: row {i} repeats {' '.join(key)}")
        seen.add(key)
    return doc
