"""Bad input never crashes `pv`: every verb answers malformed YAML, wrong types, unknown keys,
empty files, non-UTF-8 bytes, alias bombs, oversized files, deep nesting and large
directories with a one-line error and exit code 1 (a bad contract) or 2 (usage / I/O), in
bounded time. A hypothesis test mutates valid contracts and checks the same of `pv validate`.

Verbs run in-process (falsify.cli.pv.main) for speed; an exception escaping main fails the test.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falsify.cli.pv import main
from falsify.harness import yamlio

FIX = Path(__file__).parent / "fixtures"
BASE = FIX / "valid" / "softmax-lite-v1.yaml"
VERBS = ["validate", "status", "graph", "equations"]


def pv(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_all(capsys, path: Path) -> dict[str, tuple[int, str, str]]:
    """Every reading verb on `path`, plus diff against the valid baseline both ways."""
    res = {v: pv(capsys, v, path) for v in VERBS}
    res["diff-new"] = pv(capsys, "diff", BASE, path)
    res["diff-old"] = pv(capsys, "diff", path, BASE)
    return res


def assert_clean_failure(res: dict, needle: str | None = None, code: int = 1):
    """Each verb exits `code` and says why in one line that names the file."""
    for verb, (rc, out, err) in res.items():
        assert rc == code, f"pv {verb}: exit {rc}\n{out}\n{err}"
        assert "Traceback" not in out + err
        lines = [ln for ln in (out + err).splitlines() if "V001" in ln or "error:" in ln]
        assert lines, f"pv {verb} gave no error line:\n{out}\n{err}"
        if needle:
            assert any(needle in ln for ln in lines), f"pv {verb}: {needle!r} not in\n{lines}"


# ---------------------------------------------------------------------------- file level


CASES = {
    "syntax": (b"metadata:\n  version: 1.0.0\n  description: [unclosed\n", "YAML syntax error"),
    "empty": (b"", "empty file"),
    "whitespace": (b"   \n\n# a comment\n", "empty"),
    "scalar": (b"just a string\n", "a contract is a mapping"),
    "list": (b"- a\n- b\n", "a contract is a mapping"),
    "not_utf8": (b"metadata:\n  version: 1.0.0\n  description: caf\xe9\n", "not UTF-8"),
    "nul": (b"metadata:\n  version: 1.0.0\x00\n", "unacceptable character"),
    "python_tag": (b"metadata: !!python/object/apply:os.system [echo hi]\n",
                   "unsupported YAML tag"),
    "python_scalar": (b"metadata: !!python/name:os.system ''\n", "cannot read value"),
    "custom_tag_map": (b"metadata: !thing {a: 1}\n", "unsupported YAML tag"),
    "merge_key": (b"a: &x {b: 1}\nmetadata:\n  <<: *x\n", "merge keys"),
    "undefined_alias": (b"metadata: *nope\n", "undefined alias"),
    "two_documents": (b"metadata: {}\n---\nmetadata: {}\n", "single document"),
    "deep": (b"metadata: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested deeper"),
    "bad_float_tag": (b"metadata: !!float nope\n", "cannot read value"),
    "recursive_alias": (b"self: &S [*S]\n", "recursive alias"),
    "recursive_alias_in_map": (b"metadata: &M {version: 1.0.0, again: *M}\n", "recursive alias"),
    "mutual_recursion": (b"a: &A [b, &B [*A]]\nmetadata: *B\n", "recursive alias"),
    # 200 anchors each wrapping the previous: 200 levels deep only once aliases are followed
    "deep_through_aliases": (b"a0: &a0 [x]\n" + b"".join(
        f"a{i}: &a{i} [*a{i - 1}]\n".encode() for i in range(1, 200)) + b"metadata: *a199\n",
        "nested deeper"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unreadable_file_gives_one_line_error(tmp_path, capsys, case):
    data, needle = CASES[case]
    p = tmp_path / "bad-v1.yaml"
    p.write_bytes(data)
    t = time.monotonic()
    assert_clean_failure(run_all(capsys, p), needle)
    assert time.monotonic() - t < 60


def test_alias_bomb_is_bounded(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
              f"*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 12)]
    lines.append("metadata: *a11")  # 10^12 nodes if expanded
    p = tmp_path / "bomb-v1.yaml"
    p.write_text("\n".join(lines) + "\n")
    t = time.monotonic()
    assert_clean_failure(run_all(capsys, p), "alias bomb")
    assert time.monotonic() - t < 60


def test_recursive_alias_does_not_break_its_neighbours(tmp_path, capsys):
    """Neighbours are read to resolve depends_on: one recursive file is one finding, and every
    clean contract beside it still validates (copied with the data files they declare)."""
    library = Path(__file__).parent.parent / "falsify" / "contracts"
    clean = sorted(library.glob("*.yaml"))
    for c in clean:
        (tmp_path / c.name).write_bytes(c.read_bytes())
    shutil.copytree(library / "fixtures", tmp_path / "fixtures")
    (tmp_path / "zz-self-v1.yaml").write_text("self: &S [*S]\n")
    for verb in ("validate", "status", "graph"):
        rc, out, err = pv(capsys, verb, tmp_path)
        assert rc == 1 and "Traceback" not in out + err, f"pv {verb}: {rc}\n{out}\n{err}"
        bad = [ln for ln in (out + err).splitlines() if " error " in ln or "error:" in ln]
        assert bad and all("zz-self-v1.yaml:1:" in ln and "recursive alias" in ln
                           for ln in bad), f"pv {verb}:\n{bad}"
    rc, out, _ = pv(capsys, "validate", tmp_path)
    # the unreadable file is one finding and no contract; all the others are read and clean
    assert f"1 error(s), 0 warning(s) in {len(clean)} contract(s)" in out


def test_ten_megabyte_file_is_refused_before_parsing(tmp_path, capsys):
    p = tmp_path / "huge-v1.yaml"
    with p.open("w") as f:
        f.write("metadata:\n  description: |\n")
        line = "    " + "x" * 95 + "\n"
        for _ in range(10 * 1024 * 1024 // len(line)):
            f.write(line)
    t = time.monotonic()
    assert_clean_failure(run_all(capsys, p), "limited to")
    assert time.monotonic() - t < 30


def test_large_but_allowed_file_is_bounded(tmp_path, capsys):
    # just under the size limit, one finding per item: capped, and still quick
    p = tmp_path / "big-v1.yaml"
    items = "".join(f"  - {{id: X-{i}, typo: {i}}}\n" for i in range(40_000))
    p.write_text("metadata: {version: 1.0.0, description: d}\nequations: {e: {formula: x}}\n"
                 "inputs: {}\nproof_obligations:\n" + items)
    assert p.stat().st_size < yamlio.MAX_BYTES
    t = time.monotonic()
    rc, out, _ = pv(capsys, "validate", p)
    assert rc == 1 and "schema violations; only the first are listed" in out
    assert "more V007 finding(s) in this file, not listed" in out
    assert len(out.splitlines()) < 1000
    assert time.monotonic() - t < 120


def test_device_and_directory_paths(tmp_path, capsys):
    if Path("/dev/zero").exists():  # endless: must not be read to the end
        rc, out, err = pv(capsys, "validate", "/dev/zero")
        assert rc == 1 and "not a regular file" in out
        assert pv(capsys, "status", "/dev/zero")[0] == 2
    d = tmp_path / "dir.yaml"  # a directory that looks like a contract
    d.mkdir()
    rc, _, err = pv(capsys, "status", d)
    assert rc == 2 and "no contracts found" in err


def test_missing_path_is_an_io_error(tmp_path, capsys):
    for verb in ("status", "graph", "equations"):
        rc, out, err = pv(capsys, verb, tmp_path / "nope.yaml")
        assert rc == 2 and "no such file" in err and "Traceback" not in out + err
    assert pv(capsys, "diff", BASE, tmp_path / "nope.yaml")[0] == 2


def test_unknown_format_and_flags_are_usage_errors(capsys):
    assert pv(capsys, "graph", "--format", "svg")[0] == 2
    assert pv(capsys, "equations", "--format", "mermaid")[0] == 2
    assert pv(capsys, "status", "--bogus")[0] == 2


# ---------------------------------------------------------------------------- content level

WRONG = {
    "metadata_list": ("metadata:", "metadata:\n  - 1\nxmetadata:"),
    "equations_list": ("equations:\n  softmax:",
                       "equations:\n  - softmax\nxequations:\n  softmax:"),
    "obligations_scalar": ("proof_obligations:\n", "proof_obligations: 7\nxproof_obligations:\n"),
    "check_backends_int": ("      input: rows\n      predicate: \"(y",
                           "      input: rows\n      backends: 3\n      predicate: \"(y"),
    "check_input_list": ("      input: large\n      predicate",
                         "      input: [large]\n      predicate"),
    "dims_garbage": ("dims: {m: [1, 8], n: [1, 300]}", "dims: {m: [8, 1, 3], n: zero}"),
    "tolerance_list": ('        float32: {atol: "(n + 4) * eps"}\n        float16: {atol: "eps + n',
                       '        float32: [1, 2]\n        float16: {atol: "eps + n'),
    "mutant_replaces_no_dot": ("replaces: softmax.torch\n    with: falsify.mutants.softmax:sum",
                               "replaces: softmax\n    with: falsify.mutants.softmax:sum"),
    "gate_checks_int": ("  checks: [FALSIFY-SM-001,", "  checks: 5\n  xchecks: [FALSIFY-SM-001,"),
    "version_float": ("  version: 1.0.0", "  version: 1.0"),
    "depends_on_string": ("  depends_on: []", "  depends_on: softmax-lite-v1"),
    "unknown_keys": ("  kernel: softmax", "  kernel: softmax\n  colour: blue\n  0: zero"),
    "examples_strings": ("examples: [{m: 4, n: 128}", "examples: [abc, {m: x, n: 128}"),
    "kani_weird": ("\nqa_gate:", "\nkani_harnesses: [1, {id: [x]}, {obligation: {a: b}}]\n"
                                  "qa_gate:"),
}


@pytest.mark.parametrize("case", sorted(WRONG))
def test_wrong_types_are_findings_not_crashes(tmp_path, capsys, case):
    old, new = WRONG[case]
    text = BASE.read_text(encoding="utf-8")
    assert old in text
    p = tmp_path / "softmax-lite-v1.yaml"
    p.write_text(text.replace(old, new, 1), encoding="utf-8")
    res = run_all(capsys, p)
    rc, out, _ = res["validate"]
    assert rc == 1 and " error V0" in out, out
    for verb, (rc, out, err) in res.items():
        assert rc in (0, 1), f"pv {verb}: exit {rc}\n{out}\n{err}"
        assert "Traceback" not in out + err


def test_directory_of_500_contracts(tmp_path, capsys):
    """A chain of 500 small contracts: every verb, in bounded time."""
    for i in range(500):
        deps = f"[c{i - 1:03d}-v1]" if i else "[]"
        (tmp_path / f"c{i:03d}-v1.yaml").write_text(
            f"metadata: {{version: 1.0.{i}, description: 'contract {i}', references: [r],"
            f" depends_on: {deps}}}\n"
            f"equations:\n  e{i}:\n    formula: 'y_{i} = exp(x) · σ_{i}(x)'\n"
            f"    bindings: {{reference: 'falsify.reference.softmax:softmax'}}\n"
            f"inputs:\n  rows: {{dtypes: [float32], dims: {{n: [1, 4]}}, args: {{x: {{shape: "
            f"[n]}}}}}}\n"
            f"proof_obligations:\n  - {{id: C{i}-INV-001, type: invariant, property: p,"
            f" applies_to: e{i}}}\n"
            f"falsification_tests:\n  - {{id: FALSIFY-C{i}-001, rule: r, prediction: p,"
            f" obligation: C{i}-INV-001,\n     check: {{kind: property, input: rows,"
            f" predicate: 'y >= 0'}}}}\n", encoding="utf-8")
    t = time.monotonic()
    rc, out, _ = pv(capsys, "validate", tmp_path)
    assert rc == 0 and "0 error(s), 0 warning(s) in 500 contract(s)" in out
    rc, out, _ = pv(capsys, "status", "--format", "json", tmp_path)
    assert rc == 0 and len(json.loads(out)["contracts"]) == 500
    rc, out, _ = pv(capsys, "graph", "--format", "json", tmp_path)
    order = json.loads(out)["order"]
    assert rc == 0 and order[0] == "c000-v1" and order[-1] == "c499-v1"
    assert pv(capsys, "equations", "--format", "latex", tmp_path)[0] == 0
    assert time.monotonic() - t < 240  # measured ~15 s on an idle 2-core machine


# ---------------------------------------------------------------------------- mutation


def _paths(node, at=()):
    """Every path into a parsed YAML document."""
    yield at
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, at + (i,))


def _get(node, path):
    for p in path:
        node = node[p]
    return node


KEYS = ["id", "obligation", "check", "kind", "input", "tolerance", "bindings", "equations",
        "inputs", "dims", "args", "atol", "float32", "applies_to", "replaces", "with",
        "depends_on", "version", "formula", "predicate", "backends", "dtypes", "examples",
        "qa_gate", "checks", "", "0", "über"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["SM-INV-001", "FALSIFY-SM-001", "softmax", "softmax.torch",
                                     "falsify.reference.softmax:softmax", "(n + 4) * eps",
                                     "-1", "9 ** 9 ** 9", "rows", "float32", "bfloat16",
                                     "softmax-lite-v1", "1.0.0", "x" * 300]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3), max_leaves=6)
OPS = st.sampled_from(["delete", "rename", "retype", "swap_ids", "set", "text"])


def _mutate(doc, text: str, ops, draw_value, rnd: random.Random) -> str:
    """Apply the drawn operations; returns YAML text (or raw text for 'text' edits)."""
    for op in ops:
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = rnd.choice(paths)
        parent, key = _get(doc, path[:-1]), path[-1]
        if op == "delete":
            del parent[key]
        elif op == "rename" and isinstance(parent, dict):
            parent[rnd.choice(KEYS)] = parent.pop(key)
        elif op in ("retype", "set"):
            parent[key] = draw_value()
        elif op == "swap_ids":
            ids = [p for p in paths if p[-1] in ("id", "obligation")]
            if len(ids) >= 2:
                a, b = rnd.sample(ids, 2)
                pa, pb = _get(doc, a[:-1]), _get(doc, b[:-1])
                pa[a[-1]], pb[b[-1]] = pb[b[-1]], pa[a[-1]]
        elif op == "text":
            lines = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False).splitlines()
            i = rnd.randrange(len(lines))
            edit = rnd.choice(["drop", "dup", "indent", "junk"])
            if edit == "drop":
                del lines[i]
            elif edit == "dup":
                lines.insert(i, lines[i])
            elif edit == "indent":
                lines[i] = " " + lines[i]
            else:
                lines[i] += rnd.choice([": x", " [", " {", " &a", " *b", " |", " '", "\t"])
            return "\n".join(lines) + "\n"
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1),
       data=st.data(), base=st.sampled_from(["valid", "compat"]))
def test_mutated_contracts_never_crash_validate(capsys, ops, seed, data, base):
    src = BASE if base == "valid" else FIX / "compat" / "cublas-gemm-v1.yaml"
    doc = yaml.safe_load(src.read_text(encoding="utf-8"))
    text = _mutate(doc, "", ops, lambda: data.draw(VALUES), random.Random(seed))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / src.name
        p.write_text(text, encoding="utf-8")
        for argv in (["validate", p], ["status", p], ["equations", p], ["graph", p],
                     ["diff", src, p]):
            rc, out, err = pv(capsys, *argv)
            assert rc in (0, 1), f"pv {argv[0]} exited {rc}\n{out}\n{err}\n--- input:\n{text}"
            assert out.strip() or err.strip(), f"pv {argv[0]} said nothing"
            if argv[0] == "validate":
                assert "error(s)" in out  # the summary line always comes
                if rc == 1:
                    assert " error " in out


# Anchors and aliases spliced into a valid contract: a plain anchor, an alias to it (fine or
# ill-typed), a self-reference, a mutual reference, an alias bomb, deep alias chains.
ALIAS_SNIPPETS = st.sampled_from([
    "&a x", "&a [1, 2]", "&a {k: v}", "*a", "[*a, *a]", "&s [*s]", "&s {k: *s}",
    "&m [&n [*m]]", "*undefined", "&b0 [x, x, x, x, x, x, x, x]", "&a &b x", "!!str *a",
])


def _alias_bomb(levels: int, fan: int) -> list[str]:
    out = ["bomb0: &bomb0 [" + ", ".join(["x"] * fan) + "]"]
    out += [f"bomb{i}: &bomb{i} [" + ", ".join([f"*bomb{i - 1}"] * fan) + "]"
            for i in range(1, levels)]
    return out


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), snippets=st.lists(ALIAS_SNIPPETS, min_size=1, max_size=4),
       bomb=st.one_of(st.none(), st.tuples(st.integers(2, 12), st.integers(2, 12))),
       chain=st.integers(0, 150))
def test_aliases_and_recursion_never_crash_validate(capsys, seed, snippets, bomb, chain):
    rnd = random.Random(seed)
    lines = BASE.read_text(encoding="utf-8").splitlines()
    for snip in snippets:  # replace the value of a random `key: value` line
        cands = [i for i, ln in enumerate(lines) if ": " in ln and not ln.lstrip().startswith("#")]
        i = rnd.choice(cands)
        lines[i] = lines[i].split(": ", 1)[0] + ": " + snip
    extra = _alias_bomb(*bomb) if bomb else []
    if chain:
        extra += ["c0: &c0 [x]"] + [f"c{i}: &c{i} [*c{i - 1}]" for i in range(1, chain)]
        lines.append(f"chained: *c{chain - 1}")
    text = "\n".join(extra + lines) + "\n"
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / BASE.name
        p.write_text(text, encoding="utf-8")
        t = time.monotonic()
        for argv in (["validate", p], ["status", p], ["graph", p]):
            rc, out, err = pv(capsys, *argv)
            assert rc in (0, 1), f"pv {argv[0]} exited {rc}\n{out}\n{err}\n--- input:\n{text}"
            assert "Traceback" not in out + err
            if rc == 1 and argv[0] == "validate":
                assert f"{p}:" in out  # the finding names the file (and a line)
        assert time.monotonic() - t < 30
