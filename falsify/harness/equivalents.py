"""Declared equivalent mutants: mutants `falsify mutate` makes that cannot change what the code
computes, each with the reason, so that they are reported as equivalent instead of failing
the run as survivors.

The file (the project's `equivalent_mutants`, default `equivalent-mutants.yaml` at its root) is
a YAML list:

    - mutant: mypkg.kernel:softmax:arith:5          # the id `falsify mutate` printed
      function_sha256: 3f1c...                       # of the function the mutant was made from
      reason: "softmax is invariant to the shift: exp(x + m) / Σ exp(x + m) = exp(x) / Σ exp(x)"

A declaration holds for the function exactly as it was when someone judged the mutant: the
sha256 of its source text. When the function changes, the mutant is run again, and if it
survives the report says that its declaration was for another version, so the reason gets read
again before it is renewed. A survivor's report prints the entry to paste.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from falsify.errors import UsageError

KEYS = ("mutant", "function_sha256", "reason")
_SHA = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Declaration:
    mutant: str
    function_sha256: str
    reason: str
    line: int


def load(path: Path, required: bool) -> dict[str, Declaration]:
    """mutant id -> its declaration. A missing file is no declarations, unless the project
    named it (`required`). Anything malformed is a usage error naming the file, line and
    field."""
    from falsify.harness import yamlio

    if not path.is_file():
        if required:
            raise UsageError(f"{path}: no such file (the project's equivalent_mutants)")
        return {}
    try:
        loc = yamlio.load(yamlio.read_text(path), str(path), empty_ok=True)
    except yamlio.YamlError as e:
        raise UsageError(f"{path}:{e.line or 1}: {e.message}") from None
    if loc.data is None:
        return {}
    if not isinstance(loc.data, list):
        raise UsageError(f"{path}:1: a list of declarations ({', '.join(KEYS)}), got "
                         f"{type(loc.data).__name__}")
    out: dict[str, Declaration] = {}
    for i, e in enumerate(loc.data):
        line = loc.line_of((i,))
        if not isinstance(e, dict):
            raise UsageError(f"{path}:{line}: entry {i}: a mapping of {', '.join(KEYS)}")
        extra = sorted(set(e) - set(KEYS))
        missing = [k for k in KEYS if k not in e]
        if extra or missing:
            why = (f"unknown field {extra[0]!r}" if extra else f"no {missing[0]!r}")
            raise UsageError(f"{path}:{line}: entry {i}: {why} (fields: {', '.join(KEYS)})")
        for k in KEYS:
            if not isinstance(e[k], str) or not e[k].strip():
                raise UsageError(f"{path}:{loc.line_of((i, k))}: entry {i}: {k} must be a "
                                 "non-empty string")
        if not _SHA.fullmatch(e["function_sha256"]):
            raise UsageError(f"{path}:{loc.line_of((i, 'function_sha256'))}: entry {i}: "
                             "function_sha256 must be 64 lowercase hex digits")
        if e["mutant"] in out:
            raise UsageError(f"{path}:{line}: entry {i}: {e['mutant']} is declared twice "
                             f"(first at line {out[e['mutant']].line})")
        out[e["mutant"]] = Declaration(e["mutant"], e["function_sha256"], e["reason"].strip(),
                                       line)
    return out


def entry(mutant_id: str, function_sha256: str) -> str:
    """The YAML to paste for a survivor judged equivalent (the reason left to write)."""
    return (f"- mutant: {mutant_id}\n  function_sha256: {function_sha256}\n"
            "  reason: \"<why no input can tell the mutant from the code>\"")
