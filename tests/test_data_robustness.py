"""Bad data files never crash: fine-tuning JSONL (`falsify finetune --data`) and pretraining
`data_files` are read a line at a time with bounded memory; bytes that are not UTF-8, JSON
nested 100,000 deep and a 50 MB line are each one DataError naming file:line and the limit
(exit 2 from the CLI). A hypothesis test throws random lines at both readers."""

from __future__ import annotations

import json
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falsify.llm import data as D
from falsify.llm import sft_data as SD
from tests.test_finetune import make_tokenizer, write_base

OK = b'{"prompt": "def f(x):", "response": "\\n    return x"}\n'
DEEP = b'{"prompt": "a", "response": "b", "meta": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"
CASES = {  # name -> (file bytes or a writer, message start after "file:", line)
    "not_utf8": (OK + b'{"prompt": "caf\xe9", "response": "b"}\n', "not UTF-8 (byte 0xe9", 2),
    "deep": (OK + DEEP, "JSON nested 100001 levels deep (the limit is 64)", 2),
    "bom_then_bad_json": (b"\xef\xbb\xbf" + OK + b"{nope\n", "invalid JSON", 2),
    "huge_line": (None, "record longer than 1,048,576 bytes", 2),
}


def _write(path: Path, case: str) -> Path:
    data = CASES[case][0]
    if data is None:  # 50 MB on one line, written in pieces
        with path.open("wb") as f:
            f.write(OK + b'{"prompt": "a", "response": "')
            for _ in range(50):
                f.write(b"x" * 2**20)
            f.write(b'"}\n')
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_sft_file_is_a_data_error_naming_file_line_and_limit(tmp_path, case):
    p = _write(tmp_path / "bad.jsonl", case)
    _, needle, line = CASES[case]
    tracemalloc.start()
    try:
        with pytest.raises(D.DataError) as e:
            SD.read_jsonl(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith(f"{p}:{line}: {needle}"), str(e.value)
    assert "\n" not in str(e.value)
    # line-at-a-time: a 50 MB line costs at most the limit, a deep line its own bytes and the
    # scan's arrays (200 kB of brackets -> a few MB), never the file or a parse tree
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB"


def test_pretraining_jsonl_has_the_same_limits(tmp_path):
    (tmp_path / "nu.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    (tmp_path / "deep.jsonl").write_bytes(b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    with (tmp_path / "big.jsonl").open("wb") as f:
        f.write(b'{"text": "' + b"y" * (D.MAX_JSONL_LINE_BYTES + 10) + b'"}\n')
    for name, needle in (("nu", "nu.jsonl:2: not UTF-8"), ("deep", "deep.jsonl:1: JSON nested"),
                         ("big", "big.jsonl:1: line longer than 4,194,304 bytes")):
        with pytest.raises(D.DataError, match=needle.replace(".", r"\.")):
            D._user_documents((str(tmp_path / f"{name}.jsonl"),), "text")


def test_line_exactly_at_the_limit_is_read(tmp_path):
    body = b'{"text": "' + b"z" * (2**20 - 13) + b'"}'
    assert len(body) == 2**20 - 1  # + "\n" = the limit exactly
    p = tmp_path / "edge.jsonl"
    p.write_bytes(body + b"\n")
    assert [r.fields["text"] for r in SD.read_jsonl(p)] == ["z" * (2**20 - 13)]
    p.write_bytes(body + b"zz\n")  # one byte over
    with pytest.raises(D.DataError, match="longer than 1,048,576"):
        SD.read_jsonl(p)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    tok = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer(tok)
    return write_base(tmp_path_factory.mktemp("base") / "base", tok)


@pytest.mark.parametrize("case", ["not_utf8", "deep", "huge_line"])
def test_finetune_cli_exit_2_one_line(tmp_path, capsys, base, case):
    from falsify.cli import main

    p = _write(tmp_path / "bad.jsonl", case)
    rc = main(["finetune", "--model", str(base), "--data", str(p), "--out", str(tmp_path / "o"),
               "max_steps=1", "progress=false", "backend=torch"])
    out, err = capsys.readouterr()
    errors = [ln for ln in (out + err).splitlines() if ln.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and "Traceback" not in out + err, out + err
    assert f"{p}:{CASES[case][2]}: {CASES[case][1]}" in errors[0]


# ------------------------------------------------------------------------------- fuzzing
JSONISH = st.sampled_from(['{"prompt": ', '{"text": ', '"x"', '"', "[", "]", "{", "}", ",", ":",
                           '"response": ', '"chosen": ', '"rejected": ', '"reward": ', "1e999",
                           "NaN", "-0", "null", "true", '"messages": ', '{"role": "user", '
                           '"content": "hi"}', "\\u0000", "\\ud800", "\n", " ", "é"])
LINES = st.one_of(
    st.lists(JSONISH, max_size=20).map("".join).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=60),
    st.integers(1, 3000).map(lambda d: b'{"text": "a", "meta": ' + b"[" * d + b"]" * d + b"}"),
    st.recursive(st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text()),
                 lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.sampled_from(["prompt", "response", "text", "reward",
                                                    "chosen", "rejected", "messages", "role",
                                                    "content", "id", "x"]), inner, max_size=4),
                 max_leaves=10).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINES, min_size=1, max_size=6), newline_at_end=st.booleans())
def test_fuzzed_data_files_are_records_or_a_data_error(lines, newline_at_end):
    raw = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "fuzz.jsonl"
        p.write_bytes(raw)
        for sft, read in ((True, SD.read_jsonl),
                          (False, lambda f: D._user_documents((str(f),), "text"))):
            try:
                got = read(p)
            except D.DataError as e:
                msg = str(e)
                assert "\n" not in msg and (msg.startswith(f"{p}:") or str(p) in msg), msg
            else:  # an SFT file must hold a record; a pretraining file may be empty
                assert isinstance(got, list) and (got or not sft)
