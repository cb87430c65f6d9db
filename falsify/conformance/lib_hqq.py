"""hqq 0.2.8 (PyPI `hqq`): read against quantize-kernel-v1; nothing is bound.

`hqq.core.quantize.Quantizer.quantize` is the library's only weight quantizer, and no
contract equation is its math:

- it is asymmetric only: range [min, max] of the group itself (not extended to contain 0, so
  0.0 is not exact unless `round_zero`), codes `round(W·inv_scale + zero)` clamped to
  [0, 2^nbits − 1] with inv_scale = (2^nbits − 1)/(max − min) multiplied, not divided (a
  range below 1e-4 gets inv_scale 1, clamped at 2e4), a float zero point −min·inv_scale
  (rounded only with `round_zero=True`), and by default (`optimize=True`) the HQQ proximal
  solver moves scale and zero after that; it casts every weight to float32 first and stores
  1/inv_scale;
- int8_per_channel and the symmetric half of int4_groupwise (whose cases draw `symmetric`
  true and false) are symmetric, which hqq has no mode for.

An adapter would have to refuse every symmetric case and would still judge, on the
asymmetric ones, a different rule for the range, the zero point and the rounding point, so the
matrix carries hqq with no binding rather than cells that only restate these differences.
"""

from __future__ import annotations

from falsify.conformance.registry import Library

LIBRARY = Library(name="hqq", distribution="hqq", bindings=())
