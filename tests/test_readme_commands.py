"""Every `falsify` and `pv` command line the README shows is accepted as written: the real
parser takes its verb and flags, and for the verbs that build a config (train, distill,
finetune) the flags' values pass the config's own rules. A renamed flag, a dropped option or a
value the config refuses fails here, in seconds, whatever the docs say; the smoke tests
(tests/test_cli_smoke.py) run each command end to end at its smallest settings.

A line is read as a shell would read it, less its comment; `a|b|c` in a verb position lists
alternatives (each is checked), `[--flag]` an optional flag (checked with it), `<run>` a
placeholder (a path, which the parser does not open). A line naming a `--config FILE` builds no
config, since the file is the reader's own.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from falsify.cli import build_parser as falsify_parser
from falsify.cli import config_flags as CF
from falsify.cli.pv import build_parser as pv_parser
from falsify.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
PARSERS = {"falsify": falsify_parser, "pv": pv_parser}


def readme_command_lines(text: str) -> list[tuple[int, list[str]]]:
    """(README line, argv) for every falsify/pv command in the README's bash blocks, each
    `a|b` alternative and `[--opt]` expanded."""
    out = []
    for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
        first = text.count("\n", 0, block.start(1)) + 1
        for i, line in enumerate(block.group(1).splitlines()):
            words = shlex.split(line, comments=True)
            if not words or words[0] not in PARSERS:
                continue
            words = [w.strip("[]") for w in words]
            alternatives = [w.split("|") if "|" in w and not w.startswith("-") else [w]
                            for w in words]
            argvs = [[]]
            for options in alternatives:
                argvs = [a + [o] for a in argvs for o in options]
            out += [(first + i, argv) for argv in argvs]
    return out


LINES = readme_command_lines((ROOT / "README.md").read_text(encoding="utf-8"))


def test_the_readme_shows_commands_of_every_kind():
    verbs = {tuple(argv[:2]) for _, argv in LINES}
    assert {("falsify", "train"), ("falsify", "finetune"), ("falsify", "distill"),
            ("falsify", "run"), ("pv", "coverage"), ("falsify", "export")} <= verbs
    assert len(LINES) >= 40


@pytest.mark.parametrize("line, argv", LINES, ids=[f"README:{n}" for n, _ in LINES])
def test_a_readme_command_line_is_accepted_as_written(line, argv, capsys):
    try:
        args = PARSERS[argv[0]]().parse_args(argv[1:])
    except (SystemExit, UsageError) as e:  # argparse exits; our parsers raise UsageError
        why = str(e) if isinstance(e, UsageError) else capsys.readouterr().err.strip()
        pytest.fail(f"README.md:{line}: `{shlex.join(argv)}` is refused by the parser: {why}")
    config = _config_of(argv[1], args)
    if config is not None:
        assert config.__class__.__name__.endswith("Config")


def _config_of(verb: str, args):
    """The config the verb would build from these flags (before any file or model is read),
    or None for a verb that builds none here."""
    if verb not in ("train", "distill", "finetune") or getattr(args, "config", None):
        return None
    from falsify.llm.config import TrainConfig
    from falsify.llm.distill import DistillConfig

    if verb == "finetune":
        from falsify.llm import finetune_stage as FS

        return FS.load_config(None, CF.config_overrides(args))
    cls = TrainConfig if verb == "train" else DistillConfig
    return cls.load(None, CF.config_overrides(args))


def test_a_wrong_flag_in_the_readme_would_fail(capsys):
    """The check can fail: a flag the parser does not know, and a value the config refuses."""
    with pytest.raises(pytest.fail.Exception, match="refused by the parser"):
        test_a_readme_command_line_is_accepted_as_written(1, ["falsify", "train", "--max-stp",
                                                              "2"], capsys)
    from falsify.llm.config import ConfigError

    with pytest.raises(ConfigError, match="max_steps"):
        test_a_readme_command_line_is_accepted_as_written(1, ["falsify", "train", "--max-steps",
                                                              "-3"], capsys)
