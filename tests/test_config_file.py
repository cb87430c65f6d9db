"""`--config FILE` of `falsify train` / `falsify finetune`: every bad file is a one-line error
naming file:line and exit code 2, never a traceback; duplicate keys are errors; an uncreatable
out_dir is named. A hypothesis test throws YAML-ish bytes, aliases, deep nesting and wrong
types at the reader and the config parser: each input is a valid config or a ConfigError.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falsify.cli import main as falsify_main
from falsify.harness import yamlio
from falsify.llm import config as T
from falsify.llm import finetune as FT
from falsify.llm import run as RUN
from falsify.llm.config_file import ConfigFileError, read_config_file

BAD = {  # name -> (file bytes, what the message must say, line it must name)
    "directory": (None, "a directory", None),
    "missing": (None, "no such file", None),
    "syntax": (b"lr: 1e-3\nmax_steps: [1\n", "YAML syntax error", 3),
    "not_utf8": (b"lr: 1e-3\ncorpus: caf\xe9\n", "not UTF-8", 2),
    "python_tag": (b"lr: !!python/object/apply:os.system [echo hi]\n", "unsupported YAML tag", 1),
    "python_name": (b"max_steps: !!python/name:os.system ''\n", "cannot read value", 1),
    "duplicate_key": (b"lr: 1e-3\nmax_steps: 5\nlr: 2e-3\n", "'lr' is given twice", 3),
    "top_level_list": (b"- lr\n- 1e-3\n", "top level must be a mapping", 1),
    "recursive_alias": (b"data_files: &S [*S]\n", "recursive alias", 1),
    "alias_bomb": (b"a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"a{i}: &a{i} [" .encode() + b", ".join([f"*a{i - 1}".encode()] * 10) + b"]\n"
        for i in range(1, 9)) + b"data_files: *a8\n", "alias bomb", 1),
    "deep": (b"data_files: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested deeper", 1),
    "too_big": (b"# " + b"x" * (yamlio.MAX_BYTES + 10) + b"\n", "limited to 2 MiB", None),
}


def _path(tmp_path: Path, case: str) -> Path:
    data = BAD[case][0]
    if case == "directory":
        return tmp_path
    p = tmp_path / f"{case}.yaml"
    if data is not None:
        p.write_bytes(data)
    return p


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_file_is_one_line_naming_file_and_line(tmp_path, case):
    p = _path(tmp_path, case)
    _, needle, line = BAD[case]
    with pytest.raises(ConfigFileError) as e:
        read_config_file(p)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert msg.startswith(f"{p}:{line}: " if line else f"{p}: "), msg
    assert isinstance(e.value, T.ConfigError)  # what the CLIs turn into exit 2


@pytest.mark.parametrize("case", ["missing", "duplicate_key", "python_tag", "not_utf8"])
@pytest.mark.parametrize("cli", ["train", "finetune"])
def test_cli_exit_2_and_one_line(tmp_path, capsys, case, cli):
    p = _path(tmp_path, case)
    assert falsify_main([cli, "--config", str(p)]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in (out + err).splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and str(p) in lines[0] and BAD[case][1] in lines[0], out + err
    assert "Traceback" not in out + err


def test_empty_file_sets_no_field(tmp_path):
    for text in ("", "\n# only a comment\n"):
        (tmp_path / "e.yaml").write_text(text)
        assert read_config_file(tmp_path / "e.yaml") == {}


def test_values_keep_their_yaml_types(tmp_path):
    p = tmp_path / "ok.yaml"
    p.write_text("lr: 3e-4\nmax_steps: 7\ndata_files: [a.txt, b.txt]\nprogress: false\n")
    cfg = T.load_config(p)
    assert (cfg.lr, cfg.max_steps, cfg.data_files, cfg.progress) == (3e-4, 7, ["a.txt", "b.txt"],
                                                                     False)


@pytest.mark.parametrize("bad_dir", ["file/sub", "/proc/falsify-no-such-dir"])
def test_uncreatable_out_dir_is_named(tmp_path, capsys, bad_dir):
    (tmp_path / "file").write_text("a regular file, not a directory")
    out_dir = tmp_path / bad_dir if not bad_dir.startswith("/") else Path(bad_dir)
    if bad_dir.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc on this system (the file/sub case covers the same handler)")
    args = [f"{k}={v}" for k, v in RUN.TINY_TEST.items()] + [f"out_dir={out_dir}", "max_steps=1",
                                                          "warmup_steps=0"]
    assert falsify_main(["train", *args]) == 2
    out, err = capsys.readouterr()
    lines = [ln for ln in (out + err).splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and str(out_dir) in lines[0] and "Traceback" not in out + err


# ------------------------------------------------------------------------------- fuzzing
FIELDS = ["lr", "max_steps", "seed", "model", "data_files", "progress", "grad_clip", "out_dir",
          "batch_size", "lora_r", "targets", "method", "beta2", "hidden_size", "nope", "", "1"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.sampled_from(["3e-4", "1e400", ".inf", ".nan", "0x10", "1_000", "yes",
                                     "2026-01-01", "~", "tiny", "lora", "q,v", "x" * 300]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3),
                      max_leaves=8)
YAMLISH = st.sampled_from([": ", "- ", "[", "]", "{", "}", ",", "&a ", "*a", "&s [*s]", "!!str ",
                           "!!python/name:os.system ", "\n", "  ", "#", "'", '"', "|", ">",
                           "<<: ", "---\n", "\t", "\x00", "\xe9", "lr", "1e-3", "max_steps",
                           "data_files", "? ", "%YAML 1.1\n", "!!binary "])


def _doc(draw) -> bytes:
    kind = draw(st.sampled_from(["dump", "yamlish", "bytes", "aliases", "deep"]))
    if kind == "dump":  # a well-formed mapping of (mostly) wrongly typed values
        d = draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=5))
        return yaml.safe_dump(d, allow_unicode=True).encode()
    if kind == "yamlish":
        return "".join(draw(st.lists(YAMLISH, max_size=30))).encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "aliases":
        levels, fan = draw(st.integers(1, 9)), draw(st.integers(1, 10))
        lines = ["a0: &a0 [" + ", ".join(["x"] * fan) + "]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]"
                  for i in range(1, levels)]
        field = draw(st.sampled_from(FIELDS))
        tail = draw(st.sampled_from([f"{field}: *a{levels - 1}", f"{field}: &r [*r]",
                                     f"{field}: &r {{k: *r}}", f"{field}: *zz"]))
        return ("\n".join(lines + [tail]) + "\n").encode()
    depth = draw(st.integers(1, 3000))
    opener, closer = draw(st.sampled_from([("[", "]"), ("{a: ", "}")]))
    return (f"{draw(st.sampled_from(FIELDS))}: " + opener * depth + "1" + closer * depth
            + "\n").encode()


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_config_files_are_a_config_or_a_config_error(data):
    raw = _doc(data.draw)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "fuzz.yaml"
        p.write_bytes(raw)
        try:
            fields = read_config_file(p)
        except ConfigFileError as e:
            assert str(e).startswith(f"{p}") and "\n" not in str(e)
            return
        assert isinstance(fields, dict)
        for parse in (T.config_from_dict, FT.config_from_dict):
            try:
                cfg = parse(fields, source=str(p))
            except T.ConfigError as e:
                assert str(e).strip(), "an error must say what is wrong"
            else:  # accepted: every given field holds the value that was written
                assert all(getattr(cfg, k) == v or isinstance(v, str) for k, v in fields.items())


VALUE_ERRORS = {  # a value that parses but does not fit its field -> what the error says
    "max_steps: -3": "config field max_steps=-3: must be >= 1",
    "max_steps: 0": "config field max_steps=0: must be >= 1",
    "max_steps: 1e500": "config field 'max_steps' must be an int",
    "model: nosuch": "model preset 'nosuch' unknown",
}


@pytest.mark.parametrize("body", sorted(VALUE_ERRORS))
def test_value_errors_name_file_and_line(tmp_path, body):
    p = tmp_path / "run.yaml"
    p.write_text(f"# a run\nlr: 0.001\n\n{body}\nseed: 1\n")
    with pytest.raises(T.ConfigError) as e:
        T.TrainConfig.load(p)
    assert str(e.value).startswith(f"{p}:4: "), str(e.value)
    assert VALUE_ERRORS[body] in str(e.value)


@pytest.mark.parametrize("cli", ["train", "finetune"])
def test_value_error_on_the_command_line_names_file_and_line(tmp_path, capsys, cli):
    p = tmp_path / "run.yaml"
    p.write_text("seed: 1\nmax_steps: -3\n")
    assert falsify_main([cli, "--config", str(p)]) == 2
    out, err = capsys.readouterr()
    assert f"{p}:2: config field max_steps=-3" in (out + err).replace("\n", ""), out + err
