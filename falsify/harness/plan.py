"""Which (backend, variant) pairs a check runs on. One function, used by the generator, the
validator, coverage and audit, so that "what should have run" has a single definition."""

from __future__ import annotations

from dataclasses import dataclass

from falsify.harness.model import BACKENDS, Check, Contract

# Fields each check kind needs; the validator reports a missing one as V018.
REQUIRED_FIELDS = {
    "parity": ("input",),
    "property": ("input", "predicate"),
    "metamorphic": ("input", "transform", "relation"),
    "gradient": ("input", "wrt", "backward"),
    "roundtrip": ("input", "inverse", "relation"),
    "statistical": ("input", "samples", "statistic", "predicate"),
    "training": ("run", "predicate"),
    "symbolic": ("engine", "target"),
    "static": ("kernel", "gpu_targets"),
    "determinism": ("input",),
    "batch_invariance": ("input", "batch"),
    "dtypes": ("input",),
    "gradgrad": ("input", "wrt", "backward"),
    "jvp": ("input", "wrt", "backward"),
    "layouts": ("input", "parity", "zero_size"),
    "device": ("input", "parity"),
    "compile": ("input",),
}
INPUT_KINDS = {"parity", "property", "metamorphic", "gradient", "roundtrip", "statistical",
               "determinism", "batch_invariance", "dtypes", "gradgrad", "jvp", "layouts",
               "device", "compile"}

# Kinds that judge an implementation's API and resource promises rather than the equation's
# values: which dtypes it accepts, how it takes views, ranks and empty dims, what it refuses,
# whether it repeats itself bit for bit, compiles, and agrees across devices. Two correct
# implementations of one equation may differ on every one of these by design; they may not
# differ on the values and derivatives the other kinds judge.
POLICY_KINDS = {"dtypes", "layouts", "jvp", "compile", "static", "device", "determinism",
                "batch_invariance"}


def judges(contract: Contract, check: Check) -> str:
    """`math` or `policy`: what a check's verdict is about. The obligation's `judges:` when the
    contract gives it (a training probe of saved memory or of refusals is policy), else from
    the check's kind (POLICY_KINDS)."""
    ob = contract.obligation(check.obligation) if check.obligation else None
    if ob is not None and ob.judges:
        return ob.judges
    return "policy" if check.kind in POLICY_KINDS else "math"


@dataclass(frozen=True)
class Run:
    backend: str
    variant: str  # a dtype name, a GPU target like "sm_90", or "proof"


def equation_of(contract: Contract, check: Check) -> str | None:
    """The equation a check exercises: explicit `equation`, else its obligation's applies_to."""
    spec = check.spec or {}
    if spec.get("equation"):
        return spec["equation"]
    ob = contract.obligation(check.obligation) if check.obligation else None
    if ob and ob.applies_to:
        return ob.applies_to[0]
    if len(contract.equations) == 1:
        return next(iter(contract.equations))
    return None


def output_index(eq, entry) -> int:
    """One entry of a check's `outputs` as an index into the equation's outputs: an index as
    is, a name looked up in the equation's `outputs`. ValueError (the message the validator
    reports as V018) for a name the equation does not declare, or an index past its names."""
    names = list(eq.outputs) if eq is not None else []
    where = f"equation {eq.name!r}" if eq is not None else "the equation"
    declared = (f"declared: {', '.join(names)}" if names
                else f"it declares none: list them in equations.{eq.name}.outputs"
                if eq is not None else "it declares none")
    if isinstance(entry, str):
        if entry not in names:
            raise ValueError(f"{entry!r} is not an output of {where} ({declared})")
        return names.index(entry)
    if names and entry >= len(names):
        raise ValueError(f"index {entry} is past the {len(names)} outputs of {where} "
                         f"({declared})")
    return int(entry)


def upstream_name(eq, index: int) -> str:
    """The keyword under which a gradient check passes output `index`'s upstream gradient to
    the reference backward: `dy` for the first output (every backward takes it), `d<name>`
    for a later one (`dlse`), so a later output must be named in the equation's `outputs`."""
    if index == 0:
        return "dy"
    names = list(eq.outputs) if eq is not None else []
    if index >= len(names):
        where = f"equations.{eq.name}.outputs" if eq is not None else "the equation's outputs"
        raise ValueError(f"output {index} has no name: a gradient check passes its upstream "
                         f"gradient as d<name>, so list the outputs' names in {where}")
    return "d" + names[index]


def backends_of(contract: Contract, check: Check) -> list[str]:
    spec = check.spec or {}
    kind = spec.get("kind")
    if kind == "symbolic":
        return [spec.get("engine", "z3")]
    if kind == "static":
        return ["triton"]
    if spec.get("backends"):
        return list(spec["backends"])
    if kind == "training":
        return ["torch"]
    eq = contract.equations.get(equation_of(contract, check) or "")
    bound = [b for b in BACKENDS if eq and b in eq.bindings]
    # the float64 reference is the oracle, not a subject
    if kind in ("parity", "dtypes", "gradgrad", "jvp", "device"):
        return [b for b in bound if b != "reference"]
    if kind == "compile":  # torch.compile traces torch code; Triton kernels are compiled already
        return [b for b in bound if b == "torch"]
    return bound


def variants_of(contract: Contract, check: Check) -> list[str]:
    spec = check.spec or {}
    kind = spec.get("kind")
    if kind == "symbolic":
        return ["proof"]
    if kind == "static":
        return [f"sm_{t}" for t in spec.get("gpu_targets", [])]
    if kind == "dtypes":  # one run per backend probes every dtype the others do not declare
        return ["undeclared"]
    if spec.get("dtypes"):
        return list(spec["dtypes"])
    inp = contract.inputs.get(spec.get("input", ""))
    if inp and isinstance(inp.get("dtypes"), list):
        return list(inp["dtypes"])
    return ["float32"]


def runs(contract: Contract, check: Check) -> list[Run]:
    """Every (backend, variant) this check must pass on for its obligation to be covered.
    A dtype the equation declares GPU-only is excluded here and reported by coverage."""
    if not check.spec:
        return []
    eq = contract.equations.get(equation_of(contract, check) or "")
    gpu_only = eq.gpu_only if eq else {}
    return [Run(b, v) for b in backends_of(contract, check) for v in variants_of(contract, check)
            if not (b == "triton" and v in gpu_only)]
