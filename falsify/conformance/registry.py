"""The binding sets: which third-party function stands in for which contract equation.

A library's adapter module (`falsify/conformance/lib_<name>.py`) holds thin adapters from the
library's own functions to a contract's signature — argument order and names, layouts, results
unpacked, a forward/backward pair through autograd where the contract differentiates — and one
`LIBRARY`, the declaration this module reads. An adapter never converts dtypes or copies its
inputs: the arithmetic a contract judges is the library's.

A binding runs the contract's torch-backend checks with its equations bound to the adapters
(`falsify run --bind`, the same mechanism), and declares its own API *policy* where the library
differs from our kernels' on purpose: the extra dtypes it accepts, its size-0 behaviour, the
checks it does not claim (with the reason). Its math is judged by the contract unchanged; its
policy against what it declares (falsify.harness.plan.judges splits the two).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass, field

# the adapter modules, one per library, in the order the matrix lists them
MODULES = ("torch", "transformers", "liger", "peft", "bitsandbytes", "torchao", "quanto", "hqq",
           "gguf", "mergekit", "trl")


class RegistryError(Exception):
    pass


def into(out, y):
    """The contracts' optional `out=` (a preallocated result) for a library function that has
    none: the result copied in, its arithmetic untouched."""
    if out is None:
        return y
    out.copy_(y)
    return out


@dataclass(frozen=True)
class Finding:
    """Why a check fails for a binding, judged once by a person and kept with the binding:
    `deviation` (the library departs from the math), `variant` (a different, documented
    convention: `variant` names it), `ours` (our contract was wrong: a finding of this kind
    must be fixed in the contract, not kept). `evidence` says what shows it; `repro` names the
    standalone reproduction script of a deviation (a file under evidence/conformance/ that
    uses only the library, numpy and mpmath: what a maintainer is sent)."""

    kind: str
    evidence: str
    variant: str | None = None
    repro: str | None = None

    def __post_init__(self):
        if self.kind not in ("deviation", "variant", "ours"):
            raise RegistryError(f"finding kind {self.kind!r}: expected deviation, variant or ours")
        if self.kind == "variant" and not self.variant:
            raise RegistryError("a `variant` finding names the convention it follows")
        if not self.evidence.strip():
            raise RegistryError("a finding without evidence is not a classification")


@dataclass(frozen=True)
class Binding:
    """One library function bound to one contract.

    - `name`: how the matrix shows it (the library's own name: `F.rms_norm`);
    - `contract`: the contract id; `binds`: equation -> `module:function` (torch backend);
    - `dtypes`: the dtypes the library accepts beyond those the contract declares (its
      dtypes check then expects a result for them, not a refusal);
    - `zero_size`: dim -> `empty`, `error` (a ValueError naming the dim) or `raises` (any
      exception: the library refuses, without the contract's message), where it differs;
    - `errors`: exception type names it refuses bad input with, besides TypeError and
      ValueError (torch's kernels: NotImplementedError for an unsupported dtype);
    - `not_claimed`: check id -> why the library makes no such promise (shown as n/a);
    - `variant`: the named variant of a bound equation it follows (the contract's
      `equations.<eq>.variants`): its checks then run at the variant's pins, against its
      reference if it has one, and its math cells read `variant NAME` where they pass;
    - `needs_gpu`: the reason, when the function cannot run without a GPU (never a pass);
    - `findings`: check id (or `CHECK/dtype`) -> Finding, for each failure judged.
    """

    name: str
    contract: str
    binds: dict
    dtypes: tuple = ()
    zero_size: dict = field(default_factory=dict)
    errors: tuple = ()
    not_claimed: dict = field(default_factory=dict)
    variant: str | None = None
    needs_gpu: str | None = None
    findings: dict = field(default_factory=dict)

    @property
    def policy(self) -> dict:
        """The policy a run's manifest carries for this binding's checks."""
        return {"dtypes": sorted(self.dtypes), "zero_size": dict(self.zero_size),
                "errors": sorted(self.errors)}


@dataclass(frozen=True)
class Library:
    name: str  # the matrix's name, the `falsify conformance` argument
    distribution: str  # the package index name, whose version the ledger records
    bindings: tuple
    extra: str = "conformance"  # the optional dependency set that installs it

    def version(self) -> str | None:
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def binding(self, name: str) -> Binding:
        for b in self.bindings:
            if b.name == name:
                return b
        raise RegistryError(f"{self.name}: no binding {name!r}")


def library(name: str) -> Library:
    if name not in MODULES:
        raise RegistryError(f"no binding set for {name!r} (binding sets: {', '.join(MODULES)})")
    mod = importlib.import_module(f"falsify.conformance.lib_{name}")
    lib = getattr(mod, "LIBRARY", None)
    if not isinstance(lib, Library):
        raise RegistryError(f"falsify.conformance.lib_{name} declares no LIBRARY")
    return lib


def libraries(names=None) -> list[Library]:
    return [library(n) for n in (names or MODULES)]
