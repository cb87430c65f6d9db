"""Arbitration of a failed comparison: which side is closer to the true value?

When an implementation and the float64 reference disagree beyond the tolerance, the failing
element is evaluated again in high precision by running the *reference itself* on the same
inputs held in a wider type:

1. mpmath (128-bit significand): float arguments become object arrays of `HP`, a small wrapper
   around mpmath.mpf that supplies the methods numpy's object ufunc loops call (`np.exp(a)`
   calls `a.exp()`) and refuses to be converted to a float, so a reference that casts to
   float64 (`np.asarray(x, np.float64)`, `np.float64(s)`) is detected, not silently trusted;
2. np.longdouble where it is real (eps < 1e-18: the x87 80-bit type, 64-bit significand), when
   the reference runs on it and returns it (a reference that casts an argument back to float64
   returns float64 and is refused).

Neither is a proof about the *math* (a reference with a wrong formula is wrong in every
precision): it tells apart "the implementation is off by N ulps" from "the float64 reference
lost precision here (cancellation, underflow): the contract's reference is wrong". Where neither
evaluation is possible the verdict says "no high-precision arbiter for this equation".
Float constants inside the reference (np.pi, 0.044715) stay float64 values: their error is
below half an ulp of float64, so the arbiter resolves to about one float64 ulp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PREC_BITS = 128
LONGDOUBLE_REAL = float(np.finfo(np.longdouble).eps) < 1e-18


class DowncastRefused(TypeError):
    """The reference tried to turn a high-precision value into a float."""


def _mp():
    import mpmath

    return mpmath


def _v(x):
    if isinstance(x, HP):
        return x.v
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)  # exact: numpy floats of the reference are float64 or narrower
    return x


class HP:
    """An mpmath number that numpy object arrays can compute with."""

    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v if not isinstance(v, HP) else v.v

    # arithmetic: mpmath does the work at the context's precision
    def __add__(self, o):
        return HP(self.v + _v(o))

    def __radd__(self, o):
        return HP(_v(o) + self.v)

    def __sub__(self, o):
        return HP(self.v - _v(o))

    def __rsub__(self, o):
        return HP(_v(o) - self.v)

    def __mul__(self, o):
        return HP(self.v * _v(o))

    def __rmul__(self, o):
        return HP(_v(o) * self.v)

    def __truediv__(self, o):
        return HP(self.v / _v(o))

    def __rtruediv__(self, o):
        return HP(_v(o) / self.v)

    def __pow__(self, o):
        return HP(self.v ** _v(o))

    def __rpow__(self, o):
        return HP(_v(o) ** self.v)

    def __neg__(self):
        return HP(-self.v)

    def __pos__(self):
        return self

    def __abs__(self):
        return HP(abs(self.v))

    def __lt__(self, o):
        return self.v < _v(o)

    def __le__(self, o):
        return self.v <= _v(o)

    def __gt__(self, o):
        return self.v > _v(o)

    def __ge__(self, o):
        return self.v >= _v(o)

    def __eq__(self, o):
        return self.v == _v(o)

    def __ne__(self, o):
        return self.v != _v(o)

    def __hash__(self):
        return hash(self.v)

    def __bool__(self):
        return bool(self.v)

    def __float__(self):
        raise DowncastRefused("the reference converts to float64 (no high-precision path)")

    def __repr__(self):
        return f"HP({self.v})"

    # the methods numpy's object loops call for np.<name>(object array)
    def exp(self):
        return HP(_mp().exp(self.v))

    def expm1(self):
        return HP(_mp().expm1(self.v))

    def log(self):
        return HP(_mp().log(self.v))

    def log1p(self):
        return HP(_mp().log1p(self.v))

    def log2(self):
        return HP(_mp().log(self.v, 2))

    def sqrt(self):
        return HP(_mp().sqrt(self.v))

    def cos(self):
        return HP(_mp().cos(self.v))

    def sin(self):
        return HP(_mp().sin(self.v))

    def tanh(self):
        return HP(_mp().tanh(self.v))

    def arctan(self):
        return HP(_mp().atan(self.v))

    def conjugate(self):
        return self


def _array_is_numpys(op):
    """An array operand is numpy's to broadcast, element by element (each an HP operation):
    mpmath would take the whole array as one operand and wrap the array in an HP."""
    def wrapped(self, o):
        return NotImplemented if isinstance(o, np.ndarray) else op(self, o)

    return wrapped


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "pow", "rpow",
              "lt", "le", "gt", "ge"):
    setattr(HP, f"__{_name}__", _array_is_numpys(getattr(HP, f"__{_name}__")))


def _to_hp(v):
    mp = _mp()
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        out = np.empty(v.shape, dtype=object)
        flat = v.reshape(-1)
        out.reshape(-1)[:] = [HP(mp.mpf(float(x))) for x in flat]  # exact: mpf(float)
        return out
    if isinstance(v, (float, np.floating)) and not isinstance(v, bool):
        return HP(mp.mpf(float(v)))
    return v


def _to_longdouble(v):
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return v.astype(np.longdouble)
    if isinstance(v, (float, np.floating)) and not isinstance(v, bool):
        return np.longdouble(v)
    return v


def _outputs(result) -> list:
    if isinstance(result, dict):
        return result
    if isinstance(result, (tuple, list)):
        return [np.asarray(r) if not isinstance(r, np.ndarray) else r for r in result]
    return [np.asarray(result) if not isinstance(result, np.ndarray) else result]


def _mp_value(fn, args: dict, pick) -> tuple[object, str] | None:
    mp = _mp()
    with mp.workprec(PREC_BITS), np.errstate(all="ignore"):
        try:
            out = pick(_outputs(fn(**{k: _to_hp(v) for k, v in args.items()})))
        except Exception:  # unsupported ufunc, a float downcast, a dtype check: no arbiter
            return None
        val = out.item() if isinstance(out, np.ndarray) and out.ndim == 0 else out
        if not isinstance(val, HP):
            return None  # the element was not computed from the high-precision inputs
        return val.v, f"mpmath, {PREC_BITS}-bit significand"


def _longdouble_value(fn, args: dict, pick) -> tuple[object, str] | None:
    if not LONGDOUBLE_REAL:
        return None
    with np.errstate(all="ignore"):
        try:
            out = pick(_outputs(fn(**{k: _to_longdouble(v) for k, v in args.items()})))
        except Exception:
            return None
    arr = np.asarray(out)
    if arr.dtype != np.longdouble:
        return None  # the reference cast back to float64 somewhere on this output's path
    bits = np.finfo(np.longdouble).nmant + 1
    return arr.item() if arr.ndim == 0 else arr, f"np.longdouble, {bits}-bit significand"


def true_value(fn, args: dict, pick):
    """(value, method) of the reference re-run in high precision, or (None, why not).
    `pick(outputs)` selects the failing element (outputs: list of arrays, or a dict)."""
    for attempt in (_mp_value, _longdouble_value):
        got = attempt(fn, args, pick)
        if got is not None:
            return got
    return None, "no high-precision arbiter for this equation"


def ulp(x: float, dtype: str) -> float:
    """The spacing of `dtype` at |x| (its subnormal spacing below the smallest normal)."""
    if dtype == "bfloat16":
        finfo_tiny, mant = 2.0 ** -126, 7
    else:
        fi = np.finfo(np.dtype(dtype))
        finfo_tiny, mant = float(fi.tiny), int(fi.nmant)
    a = abs(float(x))
    if not math.isfinite(a):
        return math.inf
    e = math.frexp(max(a, finfo_tiny))[1] - 1
    return 2.0 ** (e - mant)


@dataclass
class Verdict:
    method: str
    truth: object = None
    impl_ulps: float | None = None
    ref_ulps: float | None = None
    dtype: str = ""

    @property
    def side(self) -> str:
        if self.truth is None:
            return "unknown"
        return "implementation" if self.impl_ulps >= self.ref_ulps else "reference"

    def sentence(self) -> str:
        if self.truth is None:
            return f"arbiter: {self.method}"
        ulps = f"ulps of {self.dtype}"
        if self.side == "implementation":
            return (f"arbiter ({self.method}): the implementation is off by "
                    f"{self.impl_ulps:.3g} {ulps} from the truth, the reference by "
                    f"{self.ref_ulps:.3g}")
        return (f"arbiter ({self.method}): the reference is off by {self.ref_ulps:.3g} {ulps} "
                f"from the truth, the implementation by {self.impl_ulps:.3g}: the "
                "contract's reference is wrong here")

    def evidence(self) -> dict:
        return dict(method=self.method, truth=None if self.truth is None else str(self.truth),
                    impl_ulps=self.impl_ulps, ref_ulps=self.ref_ulps, dtype=self.dtype,
                    side=self.side)


def arbitrate(fn, args: dict, pick, got: float, ref: float, dtype: str) -> Verdict:
    """Which of `got` (implementation) and `ref` (float64 reference) is closer to the truth
    at one element, in ulps of the implementation's dtype."""
    truth, method = true_value(fn, args, pick)
    if truth is None:
        return Verdict(method)
    mp = _mp()
    with mp.workprec(PREC_BITS):
        t = mp.mpf(truth) if not isinstance(truth, np.longdouble) else mp.mpf(
            np.format_float_scientific(truth, unique=True))
        unit = ulp(float(t), dtype)

        def dist(x):
            x = float(x)
            if not math.isfinite(x) or not mp.isfinite(t):
                same = x == t or (math.isnan(x) and mp.isnan(t))
                return 0.0 if same else math.inf
            return float(abs(mp.mpf(x) - t) / unit)

        return Verdict(method, mp.nstr(t, 25), dist(got), dist(ref), dtype)
