"""Input cases: the YAML `inputs` declarations turned into hypothesis strategies (and into a
seeded sampler for statistical checks).

A case holds every argument in its *storage* dtype, already rounded (float16 values are float16,
bfloat16 values are float32 numbers representable in bf16), so that every backend — the float64
reference included — sees exactly the same numbers.

Strategies are composed from small named pieces: `dim_strategy`, `array_strategy`,
`text_strategy`, `param_strategy`, `case_strategy`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from falsify.harness import expr
from falsify.harness.binding import resolve
from falsify.harness.case_spec import DEFAULT_TEXT_MAX, FLOAT_DTYPES, dtype_takers  # noqa: F401

NP_STORAGE = {"float64": np.float64, "float32": np.float32, "float16": np.float16,
              "bfloat16": np.float32, "int64": np.int64, "int32": np.int32, "uint8": np.uint8,
              "bool": np.bool_}
FLOAT_WIDTH = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 32}
DEFAULT_MAX_ELEMENTS = 1 << 16


class InputError(Exception):
    """An input declaration that cannot produce a case (names the field)."""


@dataclass
class Case:
    dtype: str
    dims: dict
    args: dict
    params: dict = field(default_factory=dict)
    seed: int = 0
    label: str = ""

    def __repr__(self) -> str:  # hypothesis prints this as the falsifying example
        with np.printoptions(threshold=24, edgeitems=4, precision=6, linewidth=120):
            parts = [f"{k}={_short(v)}" for k, v in self.args.items()]
        extra = f", params={self.params}" if self.params else ""
        label = f" [{self.label}]" if self.label else ""
        return (f"Case(dtype={self.dtype}, dims={self.dims}{extra}, seed={self.seed}{label}, "
                + ", ".join(parts) + ")")


def _repr_pretty_(self, p, cycle):  # hypothesis' pretty-printer: show values, not strategies
    p.text(repr(self))


Case._repr_pretty_ = _repr_pretty_


def _short(v):
    if isinstance(v, np.ndarray):
        return f"array(shape={v.shape}, dtype={v.dtype}, values={np.array2string(v)})"
    return repr(v)


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values to `dtype`, returned in storage dtype."""
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(np.asarray(values, np.float32)).to(torch.bfloat16).float().numpy()
    return np.asarray(values).astype(NP_STORAGE[dtype])


def arg_dtype(argspec: dict, case_dtype: str) -> str:
    return argspec.get("dtype", case_dtype)


def eval_int(v, dims: dict, where: str) -> int:
    try:
        out = expr.evaluate(v, dims) if isinstance(v, str) else v
        return int(out)
    except Exception as e:
        raise InputError(f"{where}: cannot evaluate {v!r} with dims {dims}: {e}") from None


def eval_num(v, dims: dict, where: str) -> float:
    try:
        return float(expr.evaluate(v, dims) if isinstance(v, str) else v)
    except Exception as e:
        raise InputError(f"{where}: cannot evaluate {v!r} with dims {dims}: {e}") from None


def shape_of(argspec: dict, dims: dict, where: str) -> tuple:
    return tuple(eval_int(s, dims, where) for s in argspec.get("shape", []))


def dim_strategy(spec):
    if isinstance(spec, int):
        return st.just(spec)
    if isinstance(spec, dict):
        return st.sampled_from(spec["choices"])
    lo, hi = spec
    return st.integers(lo, hi)


def _dense(shape, dtype, lo, hi, seed, scale=1.0, density=1.0, magnitude=1.0):
    """Uniform values in [lo, hi]. `density` and `magnitude` (both 1 by default) pull a
    fraction of the entries, and the spread of the rest, toward the simplest in-range value;
    hypothesis shrinks them toward 0, which turns a failing dense array into a minimal one
    (a few entries, just large enough to fail)."""
    rng = np.random.default_rng(seed)
    if dtype in FLOAT_DTYPES:
        center = min(max(0.0, lo), hi)
        vals = center + (rng.uniform(lo, hi, size=shape) - center) * magnitude
        if density < 1.0:
            vals = np.where(rng.uniform(size=shape) < density, vals, center)
        return round_to(vals * scale, dtype)
    return rng.integers(int(lo), int(hi) + 1, size=shape).astype(NP_STORAGE[dtype])


def _init(kind, shape, dtype, seed, scale):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if kind == "zeros":
        vals = np.zeros(shape)
    elif kind == "ones":
        vals = np.ones(shape)
    elif kind == "arange":
        vals = np.arange(n, dtype=np.float64).reshape(shape)
    elif kind == "randn":
        vals = rng.standard_normal(shape)
    elif kind == "distinct":
        vals = rng.permutation(n).reshape(shape).astype(np.float64)
    else:
        raise InputError(f"unknown init {kind!r}")
    return round_to(vals * scale, dtype) if dtype in FLOAT_DTYPES else vals.astype(
        NP_STORAGE[dtype])


def built(argspec: dict, arr: np.ndarray, where: str) -> np.ndarray:
    """Apply the argument's `build: module:function` to a drawn array: a pure function that
    maps it to an array of the same shape and dtype holding a valid instance of a structured
    format (packed quantization blocks whose scale fields must be finite and bounded), so the
    draw's entropy, and hypothesis' shrinking, stay on the raw array."""
    ref = argspec.get("build")
    if ref is None:
        return arr
    out = resolve(ref)(arr)
    if not isinstance(out, np.ndarray) or out.shape != arr.shape or out.dtype != arr.dtype:
        raise InputError(f"{where}.build: {ref} must return an array of the drawn shape "
                         f"{arr.shape} and dtype {arr.dtype}, got "
                         f"{getattr(out, 'shape', type(out).__name__)} "
                         f"{getattr(out, 'dtype', '')}")
    return out


def array_strategy(argspec: dict, shape: tuple, dtype: str, dims: dict, where: str):
    """A drawn array (then `build`, if declared): sparse hypothesis arrays (shrink to a
    minimal example such as one large element) or dense seeded uniform arrays (realistic, full
    entropy)."""
    if "build" in argspec:
        plain = {k: v for k, v in argspec.items() if k != "build"}
        return array_strategy(plain, shape, dtype, dims, where).map(
            lambda a: built(argspec, a, where))
    scale = eval_num(argspec.get("scale", 1.0), dims, where + ".scale")
    if "init" in argspec:
        return st.integers(0, 2**32 - 1).map(
            lambda s: _init(argspec["init"], shape, dtype, s, scale))
    lo, hi = argspec.get("values", [-1.0, 1.0])
    lo, hi = eval_num(lo, dims, where + ".values"), eval_num(hi, dims, where + ".values")
    if lo > hi:
        raise InputError(f"{where}.values: empty range [{lo}, {hi}] at dims {dims}")
    unit = st.floats(0.0, 1.0, allow_nan=False)
    dense = st.tuples(st.integers(0, 2**32 - 1), unit, unit).map(
        lambda t: _dense(shape, dtype, lo, hi, t[0], scale, density=1.0 - t[1],
                         magnitude=1.0 - t[2]) if dtype in FLOAT_DTYPES
        else _dense(shape, dtype, lo, hi, t[0], scale))
    if argspec.get("dense"):
        return dense
    if dtype in FLOAT_DTYPES:
        width = FLOAT_WIDTH[dtype]
        elements = with_special(
            st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=width), argspec)
        sparse = hnp.arrays(NP_STORAGE[dtype] if dtype != "bfloat16" else np.float32, shape,
                            elements=elements).map(lambda a: round_to(a * scale, dtype))
    else:
        sparse = hnp.arrays(NP_STORAGE[dtype], shape,
                            elements=with_special(st.integers(int(lo), int(hi)), argspec))
    return st.one_of(sparse, dense)


def with_special(elements, argspec: dict):
    """Mix the argument's `special` values (where the contract defines behaviour: zeros,
    extremes, ignore_index) into its element strategy, for float and integer dtypes alike."""
    if argspec.get("special"):
        return st.one_of(st.sampled_from(argspec["special"]), elements)
    return elements


# ------------------------------------------------------------------------------------ text
# A `text:` argument is a Python str: drawn characters with pieces spliced in. Its alphabets:
#   unicode   every code point that UTF-8 can encode (all planes, unassigned ones included;
#             surrogates excluded: they are not valid UTF-8), with EDGE_CHARS mixed in
#   assigned  the code points the running Python's Unicode database assigns (category not Cn,
#             no surrogates), with EDGE_CHARS mixed in: for checks whose oracle classifies
#             characters (letters, digits), which only agree on characters both sides know
#   ascii     code points 0..127
TEXT_ALPHABETS = ("unicode", "assigned", "ascii")
# Characters where text processing goes wrong, drawn often instead of by luck, in groups (so
# that each group is drawn about equally often: hypothesis favours early list entries): NUL,
# controls and line breaks; every kind of space; combining marks, zero-width joiner and
# variation selector; emoji (astral plane, a skin-tone modifier); letters and digits outside
# ASCII, the BOM and the last code point.
EDGE_GROUPS = ("\x00\t\n\r\x0b\x0c\x1c\x85\u2028\u2029",
               " \xa0\u1680\u2000\u200b\u3000",
               "\u0301\u0308\u0327\u20dd\u200d\ufe0f",
               "\U0001f600\U0001f44d\U0001f3fd\U0001f469",
               "\u00e9\u4e00\u0661\u00bd\ufeff\U0010ffff")
EDGE_CHARS = "".join(EDGE_GROUPS)
# Runs of whitespace are spliced in as pieces: a tokenizer's pre-split treats a run and its
# last character differently (GPT-2's `\s+(?!\S)`), which single characters never show.
WHITESPACE_RUN_CHARS = " \t\n\r\u3000\xa0"
MAX_SPLICES = 4
_MAX_CODE_POINT = 0x10FFFF


def _is_surrogate(cp: int) -> bool:
    return 0xD800 <= cp <= 0xDFFF


def _text_fields(argspec: dict, where: str) -> tuple[str, int, int, list[str]]:
    t = argspec["text"]
    alphabet = t.get("alphabet", "unicode")
    if alphabet not in TEXT_ALPHABETS:
        raise InputError(f"{where}.text.alphabet: {alphabet!r} is not one of "
                         f"{', '.join(TEXT_ALPHABETS)}")
    lo, hi = int(t.get("min_size", 0)), int(t.get("max_size", DEFAULT_TEXT_MAX))
    if not 0 <= lo <= hi:
        raise InputError(f"{where}.text: min_size {lo} and max_size {hi} must satisfy "
                         "0 <= min_size <= max_size")
    return alphabet, lo, hi, list(t.get("special") or [])


def _edge_groups(alphabet: str) -> list[str]:
    if alphabet == "assigned":  # U+10FFFF is a noncharacter: category Cn
        return ["".join(c for c in g if unicodedata.category(c) != "Cn") for g in EDGE_GROUPS]
    return list(EDGE_GROUPS)


def _char_strategy(alphabet: str):
    if alphabet == "ascii":
        return st.characters(codec="ascii")
    exclude = ("Cs", "Cn") if alphabet == "assigned" else ("Cs",)
    # `.map(str)` keeps each group a separate branch: hypothesis folds a bare sampled_from of
    # characters into the characters() strategy it is a subset of, and the bias is lost
    return st.one_of(st.characters(codec="utf-8", exclude_categories=exclude),
                     *(st.sampled_from(g).map(str) for g in _edge_groups(alphabet)))


def _splice(base: str, splices) -> str:
    """Insert (position, piece) pairs; positions index `base`, so pieces never split each
    other and a piece may sit glued to drawn text on either side."""
    out = base
    for pos, piece in sorted(splices, key=lambda s: s[0], reverse=True):
        pos = min(pos, len(base))
        out = out[:pos] + piece + out[pos:]
    return out


def text_strategy(argspec: dict, where: str):
    """A drawn str: `min_size`..`max_size` characters of the alphabet, then up to MAX_SPLICES
    pieces inserted at drawn positions — the `special` strings (special tokens, fragments of
    the language under test) and whitespace runs. Hypothesis shrinks toward fewer splices and
    shorter text, so a failure prints a minimal string."""
    alphabet, lo, hi, special = _text_fields(argspec, where)
    base = st.text(_char_strategy(alphabet), min_size=lo, max_size=hi)
    ws = st.text(st.sampled_from(WHITESPACE_RUN_CHARS), min_size=2, max_size=6)
    if alphabet == "ascii":
        ws = st.text(st.sampled_from(" \t\n\r"), min_size=2, max_size=6)
    piece = st.one_of(st.sampled_from(special), ws) if special else ws
    splices = st.lists(st.tuples(st.integers(0, hi), piece), max_size=MAX_SPLICES)
    return st.tuples(base, splices).map(lambda t: _splice(*t))


def _sample_char(alphabet: str, rng: np.random.Generator) -> str:
    if alphabet == "ascii":
        return chr(int(rng.integers(128)))
    while True:
        u = rng.random()
        if u < 0.25:
            groups = _edge_groups(alphabet)
            g = groups[int(rng.integers(len(groups)))]
            return g[int(rng.integers(len(g)))]
        # half from the Basic Multilingual Plane (most text), the rest from every plane
        cp = int(rng.integers(0x10000 if u < 0.75 else _MAX_CODE_POINT + 1))
        if _is_surrogate(cp):
            continue
        c = chr(cp)
        if alphabet == "assigned" and unicodedata.category(c) == "Cn":
            continue
        return c


def sample_text(argspec: dict, rng: np.random.Generator, where: str) -> str:
    """The seeded sampler's draw of a text argument (pinned examples, statistical checks):
    the same alphabets, sizes and splices as `text_strategy`."""
    alphabet, lo, hi, special = _text_fields(argspec, where)
    base = "".join(_sample_char(alphabet, rng) for _ in range(int(rng.integers(lo, hi + 1))))
    run_chars = " \t\n\r" if alphabet == "ascii" else WHITESPACE_RUN_CHARS
    splices = []
    for _ in range(int(rng.integers(MAX_SPLICES + 1))):
        if special and rng.random() < 0.75:
            piece = special[int(rng.integers(len(special)))]
        else:
            piece = "".join(run_chars[int(rng.integers(len(run_chars)))]
                            for _ in range(int(rng.integers(2, 7))))
        splices.append((int(rng.integers(len(base) + 1)), piece))
    return _splice(base, splices)


def param_strategy(spec):
    """Check params: [lo, hi] numbers → floats (or ints), any other list → choices."""
    if len(spec) == 2 and all(isinstance(v, (int, float)) for v in spec) and spec[0] <= spec[1]:
        if all(isinstance(v, int) for v in spec):
            return st.integers(spec[0], spec[1])
        return st.floats(float(spec[0]), float(spec[1]), allow_nan=False, allow_infinity=False)
    return st.sampled_from(spec)


def _arg_value(draw, argspec, dims, dtype, where):
    if "const" in argspec:
        return argspec["const"]
    if "choices" in argspec:
        return draw(st.sampled_from(argspec["choices"]))
    if "text" in argspec:
        return draw(text_strategy(argspec, where))
    adt = arg_dtype(argspec, dtype)
    shape = shape_of(argspec, dims, where + ".shape")
    if "shape" not in argspec:  # a drawn scalar
        lo, hi = argspec.get("values", [-1.0, 1.0])
        lo, hi = eval_num(lo, dims, where), eval_num(hi, dims, where)
        if adt in FLOAT_DTYPES:
            return float(draw(with_special(
                st.floats(lo, hi, allow_nan=False, allow_infinity=False), argspec)))
        return int(draw(with_special(st.integers(int(lo), int(hi)), argspec)))
    return draw(array_strategy(argspec, shape, adt, dims, where))


def _check_dims(spec: dict, dims: dict, where: str) -> bool:
    for a in spec.get("assume", []):
        try:
            if not expr.evaluate(a, dims):
                return False
        except expr.ExprError as e:
            raise InputError(f"{where}.assume: {e}") from None
    limit = spec.get("max_elements", DEFAULT_MAX_ELEMENTS)
    for name, a in spec["args"].items():
        if "shape" in a and int(np.prod(shape_of(a, dims, f"{where}.args.{name}"))) > limit:
            return False
    return True


def _pinned(args: dict, pins: dict | None) -> dict:
    """An equation variant's pinned arguments replace what was drawn for them. The draw is
    still made, so every other argument of a case is what it would be without the pin: the
    variant is judged on the contract's own examples."""
    if pins:
        args.update({k: v for k, v in pins.items() if k in args})
    return args


def case_strategy(spec: dict, dtype: str, params: dict | None = None, where: str = "input",
                  pins: dict | None = None):
    params = params or {}

    @st.composite
    def draw_case(draw):
        dims = {k: draw(dim_strategy(v)) for k, v in (spec.get("dims") or {}).items()}
        assume(_check_dims(spec, dims, where))
        args = _pinned({name: _arg_value(draw, a, dims, dtype, f"{where}.args.{name}")
                        for name, a in spec["args"].items()}, pins)
        ps = {k: draw(param_strategy(v)) for k, v in params.items()}
        seed = draw(st.integers(0, 2**32 - 1))
        return Case(dtype, dims, args, ps, seed)

    return draw_case()


def sample_case(spec: dict, dtype: str, rng: np.random.Generator, params: dict | None = None,
                dims: dict | None = None, where: str = "input", label: str = "",
                pins: dict | None = None) -> Case:
    """A case drawn with numpy's RNG: for pinned examples and statistical checks."""
    if dims is None:
        for _ in range(1000):
            dims = {}
            for k, v in (spec.get("dims") or {}).items():
                if isinstance(v, int):
                    dims[k] = v
                elif isinstance(v, dict):
                    dims[k] = int(rng.choice(v["choices"]))
                else:
                    dims[k] = int(rng.integers(v[0], v[1] + 1))
            if _check_dims(spec, dims, where):
                break
        else:
            raise InputError(f"{where}: no dims satisfy assume/max_elements after 1000 draws")
    else:
        full = {k: (v if isinstance(v, int) else None) for k, v in (spec.get("dims") or {}).items()}
        full.update(dims)
        missing = [k for k, v in full.items() if v is None]
        if missing:
            raise InputError(f"{where}.examples: example {dims} does not fix dims {missing}")
        dims = full
    args = {}
    for name, a in spec["args"].items():
        w = f"{where}.args.{name}"
        if "const" in a:
            args[name] = a["const"]
        elif "choices" in a:
            args[name] = a["choices"][int(rng.integers(len(a["choices"])))]
        elif "text" in a:
            args[name] = sample_text(a, rng, w)
        else:
            adt = arg_dtype(a, dtype)
            seed = int(rng.integers(2**32))
            if "shape" not in a:
                lo, hi = a.get("values", [-1.0, 1.0])
                lo, hi = eval_num(lo, dims, w), eval_num(hi, dims, w)
                args[name] = float(rng.uniform(lo, hi)) if adt in FLOAT_DTYPES else int(
                    rng.integers(int(lo), int(hi) + 1))
                continue
            shape = shape_of(a, dims, w + ".shape")
            scale = eval_num(a.get("scale", 1.0), dims, w + ".scale")
            if "init" in a:
                args[name] = built(a, _init(a["init"], shape, adt, seed, scale), w)
            else:
                lo, hi = a.get("values", [-1.0, 1.0])
                args[name] = built(a, _dense(shape, adt, eval_num(lo, dims, w),
                                             eval_num(hi, dims, w), seed, scale), w)
    ps = {}
    for k, v in (params or {}).items():
        if len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
            ps[k] = (int(rng.integers(v[0], v[1] + 1)) if all(isinstance(x, int) for x in v)
                     else float(rng.uniform(v[0], v[1])))
        else:
            ps[k] = v[int(rng.integers(len(v)))]
    return Case(dtype, dims, _pinned(args, pins), ps, int(rng.integers(2**32)), label)


def pinned_cases(spec: dict, dtype: str, params: dict | None = None, where="input",
                 pins: dict | None = None) -> list[Case]:
    """The input's `examples` (normal and weird shapes), with deterministic values."""
    out = []
    for i, ex in enumerate(spec.get("examples") or []):
        ex = dict(ex)
        seed = int(ex.pop("seed", 1000 + i))
        rng = np.random.default_rng(seed)
        out.append(sample_case(spec, dtype, rng, params, dims=ex, where=where,
                               label=f"example {i}: {ex}", pins=pins))
    return out
