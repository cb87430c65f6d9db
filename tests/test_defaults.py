"""The README's training commands as a newcomer runs them, and every verb on its built-in
defaults: `python -m falsify ...` in a fresh directory (so the caches and `runs/` start empty).

The command lines are read from README.md itself (`readme("falsify distill --teacher")` is the
README's one line that starts so), with only the placeholders filled in: `runs/<run>` becomes
the run the chain made, and `my.jsonl` a file of the shipped dataset's records. So a README
line that stops working fails here, and so does a default that does not fit the others: train's
corpus and distill's must give one tokenizer; the second `finetune` in a directory must not meet
the first one's checkpoints; merge's output directory must be what generate and export read;
quantize's default group must divide the width of the model it quantizes.

The chains: train → export (HF, GGUF), train → distill, train → finetune → merge → export and
generate; on the built-in base: distill, finetune, eval, parity, prune, quantize, each with no
optional argument and as the README shows it; the pipeline on its own defaults, then with
`quantize: {method: int4}` and nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_readme_commands import LINES

pytestmark = pytest.mark.heavy
SHIPPED = Path(__file__).resolve().parent.parent / "falsify" / "llm" / "sft" / \
    "stdlib-docstrings.jsonl"


def readme(prefix: str, run: Path | None = None) -> list[str]:
    """The argv (less `falsify`) of the README's one command line that is `prefix`, or else
    starts with it, its `runs/<run>` placeholder replaced by `run`."""
    want = shlex.split(prefix)
    found = [argv for _, argv in LINES if argv == want] or \
        [argv for _, argv in LINES if argv[:len(want)] == want]
    assert len(found) == 1, f"README.md: {len(found)} command lines start {prefix!r}"
    return [w.replace("runs/<run>", str(run)) if run is not None else w
            for w in found[0][1:]]


def falsify(cwd: Path, argv: list[str], timeout: int = 900) -> str:
    """Run `falsify ARGV` in `cwd` as a user does; its output, or a failure that shows it."""
    r = subprocess.run([sys.executable, "-m", "falsify", *argv], cwd=cwd, capture_output=True,
                       text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"`falsify {shlex.join(argv)}` exited {r.returncode}:\n" + \
        out[-3000:]
    return out


def runs(root: Path) -> set[str]:
    return {p.name for p in (root / "runs").iterdir()} if (root / "runs").is_dir() else set()


def made(root: Path, argv: list[str]) -> Path:
    """Run a command that starts a run; the one run directory it added, relative to root."""
    before = runs(root)
    falsify(root, argv)
    new = runs(root) - before
    assert len(new) == 1, f"`falsify {shlex.join(argv)}` added {sorted(new)} under runs/"
    return Path("runs") / new.pop()


def hf_loads(path: Path) -> None:
    """transformers loads the model and its tokenizer, and they agree on the vocabulary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == model.config.vocab_size and tok("def f():")["input_ids"]


def test_train_then_export_distill_finetune_merge_generate(tmp_path):
    run = made(tmp_path, readme("falsify train"))
    assert readme("falsify train") == ["train"]

    falsify(tmp_path, readme("falsify export runs/<run> --out hf", run))
    hf_loads(tmp_path / "hf")
    falsify(tmp_path, readme("falsify export runs/<run> --out m.gguf", run))
    from gguf import GGUFReader

    field = GGUFReader(tmp_path / "m.gguf").fields["tokenizer.ggml.model"]
    assert bytes(field.parts[field.data[0]]).decode() == "gpt2"

    student = made(tmp_path, readme("falsify distill --teacher", run))
    assert json.loads((tmp_path / student / "distill.json").read_text())

    (tmp_path / "my.jsonl").write_text(
        "".join(SHIPPED.read_text(encoding="utf-8").splitlines(keepends=True)[:300]))
    ft = made(tmp_path, readme("falsify finetune --method qlora --model runs/<run>", run))
    falsify(tmp_path, readme("falsify merge --adapter", ft))
    text = falsify(tmp_path, readme("falsify generate --adapter", ft))
    assert "merged" in text
    falsify(tmp_path, ["export", "merged", "--out", "merged-hf"])  # merge's output, exported
    hf_loads(tmp_path / "merged-hf")
    falsify(tmp_path, readme("falsify export runs/<run>/adapter", ft))
    assert (tmp_path / "hf-adapter" / "adapter" / "adapter_config.json").is_file()


def test_the_verbs_on_the_built_in_base(tmp_path):
    """With no model and no data, each of these takes the built-in base (trained once into the
    directory's cache, then reused) and the shipped data. `falsify finetune` on its defaults
    completes and learns: the training loss and the held-out loss fall."""
    ft = tmp_path / made(tmp_path, readme("falsify finetune"))
    s = json.loads((ft / "summary.json").read_text())
    assert s["final_step"] == 60 and s["stopped"] == "max_steps"
    losses, evals = s["losses"], s["evals"]
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.1
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 60
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.1  # vs the frozen base itself
    cfg = json.loads((ft / "config.json").read_text())
    assert cfg["lora"]["method"] == "qlora" and cfg["base"]["builtin"] is True
    assert abs(cfg["memory"]["projections_ratio"] - 4.127 / 32) < 0.002
    assert (ft / "adapter" / "adapter_model.safetensors").is_file()

    falsify(tmp_path, readme("falsify distill"))
    assert "built-in base: reusing" in falsify(tmp_path, readme("falsify eval"))
    falsify(tmp_path, ["parity"])
    falsify(tmp_path, readme("falsify parity --bisect"))
    falsify(tmp_path, ["prune", "--out", "p"])  # --out is the one argument it needs
    falsify(tmp_path, readme("falsify prune --method wanda"))
    falsify(tmp_path, readme("falsify finetune --model pruned"))
    falsify(tmp_path, ["quantize", "--out", "q0"])
    falsify(tmp_path, readme("falsify quantize --method int4"))
    assert json.loads((tmp_path / "q" / "quantize.json").read_text())


def test_the_pipeline_on_its_defaults_then_with_int4(tmp_path):
    falsify(tmp_path, readme("falsify pipeline"))
    report = json.loads((tmp_path / "runs" / "pipeline" / "report.json").read_text())
    assert not any(r["skipped"] for r in report)
    (tmp_path / "int4.yaml").write_text(yaml.safe_dump({"quantize": {"method": "int4"}}))
    falsify(tmp_path, ["pipeline", "--config", "int4.yaml"])
    again = {r["stage"]: r for r in
             json.loads((tmp_path / "runs" / "pipeline" / "report.json").read_text())}
    assert again["pretrain"]["skipped"] and not again["quantize"]["skipped"]
