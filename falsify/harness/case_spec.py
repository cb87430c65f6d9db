"""What an input declaration says, read without drawing anything: the facts contract
validation needs (falsify/harness/validate.py) and the case generator builds on
(falsify/harness/cases.py). Kept apart from the generator so that reading and validating
contracts (`pv validate`, `pv status`, `pv coverage`) does not import hypothesis."""

from __future__ import annotations

from falsify.harness import expr

FLOAT_DTYPES = {"float64", "float32", "float16", "bfloat16"}
DEFAULT_TEXT_MAX = 64  # a `text:` argument's max_size when the contract gives none


def dtype_takers(spec: dict, call: dict | None) -> list[str]:
    """What the case dtype reaches: array arguments of the input declaration `spec` without a
    `dtype` of their own, and `call:` keys whose expression reads `dtype` (an output-dtype
    parameter). Empty: every dtype variant of a check runs the same computation."""
    out = [k for k, a in (spec.get("args") or {}).items()
           if isinstance(a, dict) and "shape" in a and "dtype" not in a]
    out += [k for k, v in (call or {}).items()
            if isinstance(v, str) and "dtype" in expr.names_in(v)]
    return out


def pin_admitted(argspec: dict, value) -> bool:
    """Whether an input argument's domain holds an equation variant's pinned value: one of its
    `choices`, its `const`; any value of a drawn scalar. Never a drawn array or text: a
    variant fixes scalars (a loss's reduction, a weight offset), not data."""
    if "shape" in argspec or "text" in argspec:
        return False
    if "choices" in argspec:
        return value in argspec["choices"]
    if "const" in argspec:
        return argspec["const"] == value
    return True


def pin_domain(argspec: dict) -> str:
    """What an input argument holds, said where a pinned value lies outside it."""
    if "shape" in argspec:
        return "a drawn array"
    if "text" in argspec:
        return "drawn text"
    if "choices" in argspec:
        return repr(argspec["choices"])
    if "const" in argspec:
        return repr(argspec["const"])
    return f"values {argspec.get('values', [-1.0, 1.0])}"
