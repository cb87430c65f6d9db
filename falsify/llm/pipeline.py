"""`falsify pipeline`: the whole post-training chain from one YAML file,

    pretrain -> distill -> finetune -> merge -> prune -> quantize -> eval

each stage the library function behind its `falsify` command, run in this process, reading
the previous stage's model and printing what the command prints. A stage's directory
OUT/<stage> is finished when OUT/<stage>/stage.json exists: it names the stage's key — sha256
of the stage's settings and of its input model's content hash — the equivalent command line
(`argv`) and the content hash of what the stage wrote. A rerun skips a stage whose key is
unchanged and whose output still hashes to what was recorded, and reruns it (after removing its
directory) otherwise; so editing one stage's settings reruns that stage and everything after
it, and a run killed mid-stage resumes at that stage. stage.json is written last and atomically.

The report holds, per stage: wall time, perplexity of the stage's model on the shipped code
problems' canonical solutions (the same held-out text `falsify eval` uses, so the column is
comparable down the chain), pass@1 (the eval stage), and the size on disk of what the stage
produced (checkpoint weights, adapter, quantized layout).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from falsify.llm import distill as D
from falsify.llm import eval_stage as ES
from falsify.llm import finetune_stage as FS
from falsify.llm import merge_stage as MS
from falsify.llm import prune_stage as PS
from falsify.llm import quantize_stage as QS
from falsify.llm import train_stage as TS
from falsify.llm.config import (
    DATA_FIELDS,
    QUICK_MAX_BYTES,
    ConfigError,
    TrainConfig,
    parse_overrides,
)
from falsify.llm.data import DataError
from falsify.llm.evaluate import EvalError
from falsify.llm.lora_model import LoraConfigError
from falsify.llm.prune import PruneError
from falsify.llm.quantize_model import QuantizeError
from falsify.llm.sandbox import SandboxError

STAGES = ("pretrain", "distill", "finetune", "merge", "prune", "quantize", "eval")
# the fields the distillation student inherits from pretraining: one corpus, one tokenizer
SHARED_DATA = (*DATA_FIELDS, "seq_len", "cache_dir")

# The built-in default: the tiny preset on the stdlib, minutes on 2 CPU cores.
TINY = {
    "pretrain": {"model": "tiny", "corpus": "stdlib", "max_bytes": QUICK_MAX_BYTES,
                 "max_steps": 500, "warmup_steps": 25, "batch_size": 8, "eval_interval": 500,
                 "eval_batches": 4, "save_interval": 500, "sample_tokens": 0},
    "distill": {"max_steps": 300, "warmup_steps": 15, "batch_size": 8, "eval_interval": 300,
                "eval_batches": 4, "save_interval": 300},
    "finetune": {"max_steps": 60, "method": "qlora"},
    "merge": {},
    "prune": {"method": "wanda", "sparsity": 0.5},
    "quantize": {"method": "int8"},
    "eval": {"samples": 2, "k": "1", "limit": 10, "max_new_tokens": 48},
}


# The settings of the stages the pipeline runs through their library functions: each key a flag
# of the stage's command (`sparsity` is `--sparsity`), with the flag's type and choices. The
# previous stage's model and the stage's directory are the pipeline's to set.
FLAG = "flag"  # a switch: true or false
BACKENDS = ("torch", "triton", "auto")
SETTINGS = {
    "merge": {"model": (str, None), "layout": (str, None), "backend": (str, BACKENDS)},
    "prune": {"method": (str, ("wanda", "magnitude")), "sparsity": (float, None),
              "pattern": (str, None), "calibration": (int, None), "backend": (str, BACKENDS)},
    "quantize": {"method": (str, ("int8", "int4", "nf4")), "group": (int, None),
                 "asymmetric": (FLAG, None), "double_quant": (FLAG, None),
                 "backend": (str, BACKENDS)},
    "eval": {"adapter": (str, None), "problems": (str, None), "text": (list, None),
             "limit": (int, None), "samples": (int, None), "k": (str, None),
             "temperature": (float, None), "top_k": (int, None), "max_new_tokens": (int, None),
             "seed": (int, None), "cpu_s": (int, None), "wall_s": (float, None),
             "memory_mb": (int, None), "backend": (str, BACKENDS)},
}
SET_BY_PIPELINE = {"model": "the previous stage's model", "out": "the stage's directory",
                   "format": "the report's format"}
KINDS = {str: "a string", int: "an integer", float: "a number", FLAG: "true or false",
         list: "a file name or a list of file names"}


class PipelineError(ValueError):
    """A bad pipeline file or a failed stage; the message names the stage or field."""


@dataclass
class StageResult:
    stage: str
    skipped: bool
    seconds: float
    model: str | None  # what the next stage reads
    size_bytes: int
    perplexity: float | None
    pass_at_1: float | None


def load_spec(path: str | Path | None) -> dict:
    """The pipeline file: a mapping stage -> settings (a mapping); unknown stages are errors,
    a stage left out runs with the built-in settings, a stage set to null is an error (the
    chain has no optional links: each stage reads the previous one's model)."""
    if path is None:
        return {k: dict(v) for k, v in TINY.items()}
    from falsify.llm.config_file import read_config_file

    raw = read_config_file(path)
    spec = {k: dict(v) for k, v in TINY.items()}
    for stage, settings in raw.items():
        if stage not in STAGES:
            raise PipelineError(f"{path}: unknown stage {stage!r} (stages: {', '.join(STAGES)})")
        if not isinstance(settings, dict):
            raise PipelineError(f"{path}: stage {stage!r} must be a mapping of settings, got "
                                f"{settings!r}")
        spec[stage] = {**spec[stage], **settings}
        stage_settings(stage, spec[stage], str(path))
    return spec


# each config stage's reader (finetune's picks FinetuneConfig or GrpoConfig by the method)
CONFIGS = {"pretrain": TrainConfig.from_dict, "distill": D.DistillConfig.from_dict,
           "finetune": FS.config_from_dict}


def _check_fields(stage: str, settings: dict, where: str) -> None:
    """A config-field stage's settings, read as its command reads `key=value` overrides: an
    unknown field or a bad value is a PipelineError naming `where`, the stage and the key."""
    source = f"{where}: stage {stage!r}"
    try:
        CONFIGS[stage](parse_overrides(_overrides(settings)), source=source, from_text=True)
    except ConfigError as e:
        msg = str(e)
        raise PipelineError(msg if msg.startswith(source) else f"{source}: {msg}") from None


def _convert(kind, v):
    """`v` as the flag's type, as argparse read it from `--flag str(v)`; ValueError if not."""
    if kind is FLAG:
        if not isinstance(v, bool):
            raise ValueError
        return v
    if kind is list:
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ValueError
        return v
    if isinstance(v, bool) or isinstance(v, (dict, list)):
        raise ValueError
    return kind(str(v))


def stage_settings(stage: str, settings: dict, where: str = "pipeline") -> dict:
    """A library-run stage's settings as its function's keyword arguments (a null setting
    keeps the flag's default); a PipelineError naming `where`, the stage and the key for an
    unknown setting, one the pipeline sets itself, a wrong type or a value not among the
    choices. The stages run by config fields (pretrain, distill, finetune) are read by their
    config class, as their command reads `key=value` overrides, and pass through unchanged."""
    schema = SETTINGS.get(stage)
    if schema is None:
        _check_fields(stage, settings, where)
        return dict(settings)
    out = {}
    for key, v in settings.items():
        at = f"{where}: stage {stage!r}: setting {key!r}"
        if key not in schema:
            if key in SET_BY_PIPELINE:
                raise PipelineError(f"{at} is set by the pipeline ({SET_BY_PIPELINE[key]})")
            raise PipelineError(f"{at}: unknown (settings: {', '.join(schema)})")
        kind, choices = schema[key]
        if v is None:
            continue
        try:
            out[key] = _convert(kind, v)
        except ValueError:
            raise PipelineError(f"{at}: {v!r} is not {KINDS[kind]}") from None
        if choices is not None and out[key] not in choices:
            raise PipelineError(f"{at}: {v!r}: choose from {', '.join(choices)}")
    return out


def _overrides(settings: dict) -> list[str]:
    """The settings as the `key=value` overrides a config command reads back to the same values:
    null for None, a list comma-separated (the command line's list syntax)."""
    return [f"{k}={_override_text(k, v)}" for k, v in settings.items()]


def _override_text(key: str, v) -> str:
    if v is None:
        return "null"
    if isinstance(v, list):
        if any("," in str(x) for x in v):
            raise ConfigError(f"config field {key!r}: an item holds a comma, which the command "
                                f"line's list syntax (a,b,c) cannot carry: {v!r}")
        return ",".join(str(x) for x in v)
    return str(v)


def _config_flags(settings: dict) -> list[str]:
    """The settings as the flags of a config command (`--max-steps 300`, `--no-shuffle`), which
    read back to the same values as `_overrides`: the command line a stage's log line shows."""
    out = []
    for k, v in settings.items():
        name = k.replace("_", "-")
        if isinstance(v, bool):
            out.append(f"--{name}" if v else f"--no-{name}")
        else:
            out += [f"--{name}", _override_text(k, v)]
    return out


def _flags(settings: dict) -> list[str]:
    out = []
    for k, v in settings.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif isinstance(v, list):  # a repeatable flag (eval's --text)
            out += [x for item in v for x in (flag, str(item))]
        elif v is not False and v is not None:
            out += [flag, str(v)]
    return out


# ------------------------------------------------------------------ what each stage runs
def _argv(stage: str, settings: dict, d: Path, prev: str | None, spec: dict) -> list[str]:
    if stage == "pretrain":
        return ["train", *_config_flags(settings), "--out", str(d)]
    if stage == "distill":
        shared = {k: spec["pretrain"][k] for k in SHARED_DATA if k in spec["pretrain"]}
        return ["distill", "--teacher", prev, *_config_flags({**shared, **settings}),
                "--out", str(d)]
    if stage == "finetune":
        return ["finetune", "--model", prev, "--out", str(d), *_config_flags(settings)]
    if stage == "merge":
        return ["merge", "--adapter", prev, "--out", str(d), *_flags(settings)]
    if stage in ("prune", "quantize"):
        return [stage, "--model", prev, "--out", str(d), *_flags(settings)]
    return ["eval", "--model", prev, "--format", "json", *_flags(settings)]


def _output(stage: str, d: Path) -> tuple[str | None, list[Path]]:
    """(the model the next stage reads, the files whose size the report shows)."""
    if stage in ("pretrain", "distill"):
        from falsify.llm import checkpoint as ckpt_mod

        ck = ckpt_mod.latest_checkpoint(d)
        return str(d), [ck / "model.safetensors"]
    if stage == "finetune":
        return str(d / "adapter"), sorted((d / "adapter").glob("*.safetensors"))
    if stage in ("merge", "prune"):
        return str(d / "ours"), [d / "ours" / "model.safetensors"]
    if stage == "quantize":
        return str(d / "ours"), sorted((d / "quantized").rglob("*.safetensors"))
    return None, []


def content_hash(path: Path) -> str:
    """sha256 over every file under `path` (relative names and bytes), sorted."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        with f.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _perplexity(stage: str, model: str | None, backend: str) -> float | None:
    from falsify.llm import evaluate as EV

    if model is None:
        return None
    texts = [p.prompt + p.canonical_solution for p in EV.load_problems(None)]
    if stage == "finetune":
        from falsify.llm.finetune_base import load_adapted

        m, base, _ = load_adapted(model, None, backend, None)
        tok = base.tokenizer
    else:
        from falsify.llm.finetune_base import load_base

        b = load_base(model, backend)
        m, tok = b.model, b.tokenizer
    return EV.perplexity(m, tok, texts)["perplexity"]


# ------------------------------------------------------------- the stages run by the library
def _pretrain(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    a = TS.LoopArgs(overrides=[*_overrides(settings), f"out_dir={work}"])
    return TS.run_loop(a, TrainConfig, TS.train_runner(a))


def _distill(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    """The student inherits pretraining's data fields (SHARED_DATA); the teacher is `prev`."""
    shared = {k: spec["pretrain"][k] for k in SHARED_DATA if k in spec["pretrain"]}
    a = TS.LoopArgs(overrides=[*_overrides({**shared, **settings}), f"out_dir={work}",
                               f"teacher={prev}"])
    return TS.run_loop(a, D.DistillConfig, TS.distill_runner(a), verb="distill")


def _finetune(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")  # as the command
    a = FS.FinetuneArgs(overrides=[f"model={prev}", f"out_dir={work}", *_overrides(settings)])
    return FS.run_finetune(a, Console())


def _usage_error(verb: str, e: Exception) -> int:
    print(f"error: falsify {verb}: {e}", file=sys.stderr)  # as the command reports it
    return 2


def _merge(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    console = Console()
    try:
        kw = stage_settings("merge", settings)
        layouts = MS.parse_layouts(kw.pop("layout", "ours,hf"))
        r = MS.merge_adapter(prev, work, layouts, console=console, **kw)
    except (MS.MergeStageError, ConfigError, DataError, LoraConfigError,
            FileNotFoundError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    return MS.show_adapter_merge(console, r)


def _prune(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    console = Console()
    try:
        r = PS.prune_model(prev, work, console=console, **stage_settings("prune", settings))
    except (PruneError, ConfigError, DataError) as e:
        return _usage_error("prune", e)
    return PS.show_pruned(console, r)


def _quantize(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    console = Console()
    try:
        r = QS.quantize(prev, work, console=console, **stage_settings("quantize", settings))
    except (QuantizeError, ConfigError, DataError) as e:
        return _usage_error("quantize", e)
    return QS.show_quantized(console, r)


def _eval(settings: dict, work: Path, prev: str | None, spec: dict) -> int:
    """`falsify eval --format json`: the console on stderr, the report in OUT/eval/output."""
    console = Console(stderr=True)
    s = ES.EvalSettings(model=prev, **stage_settings("eval", settings))
    try:
        report = ES.evaluate(s, ES.check_settings(s), console)
    except ES.HarnessFailed as e:
        console.print(f"[bold red]harness self-check failed:[/] {e}")
        return 1
    except (EvalError, ConfigError, DataError, UnicodeDecodeError) as e:
        return _usage_error("eval", e)
    except SandboxError as e:
        console.print(f"[bold red]error:[/] {e}")
        return 1
    work.mkdir()
    (work / "eval.json").write_text(json.dumps(report, indent=1))
    return 0


# each stage's run: its exit code as the stage's `falsify` command line (stage.json's argv)
# would return it
RUN = {"pretrain": _pretrain, "distill": _distill, "finetune": _finetune, "merge": _merge,
       "prune": _prune, "quantize": _quantize, "eval": _eval}


# ------------------------------------------------------------------------------ the run
# ------------------------------------------------------------------------------ the run
def run(spec: dict, out: Path, backend: str = "auto",
        say: Callable[[str], None] = print) -> list[StageResult]:
    out.mkdir(parents=True, exist_ok=True)
    results: list[StageResult] = []
    prev, prev_hash = None, ""
    for stage in STAGES:
        settings = spec[stage]
        d = out / stage
        key = hashlib.sha256(json.dumps([stage, settings, prev_hash, backend],
                                        sort_keys=True, default=str).encode()).hexdigest()
        record, work = d / "stage.json", d / "output"
        done = json.loads(record.read_text()) if record.is_file() else None
        if done is not None and done["key"] == key and work.exists() and \
                done["output_hash"] == content_hash(work):
            say(f"{stage}: unchanged (key {key[:12]}), skipped")
            results.append(StageResult(stage, True, done["seconds"], done["model"],
                                       done["size_bytes"], done["perplexity"],
                                       done["pass_at_1"]))
            prev, prev_hash = done["model"], done["output_hash"]
            continue
        if d.exists():  # changed inputs, a killed run or an edited output: redo the stage
            shutil.rmtree(d)
        d.mkdir(parents=True)
        argv = _argv(stage, settings, work, prev, spec)
        say(f"{stage}: falsify {' '.join(argv)}")
        t0 = time.perf_counter()
        rc = RUN[stage](settings, work, prev, spec)
        seconds = time.perf_counter() - t0
        if rc != 0:
            raise PipelineError(f"stage {stage}: `falsify {' '.join(argv)}` exited {rc}; "
                                f"fix it and rerun (finished stages are kept)")
        pass1 = None
        if stage == "eval":
            report = json.loads((work / "eval.json").read_text())
            pass1 = float(report["pass_at_k"]["1"])
            # the column's own held-out text (eval's may be cut by its --limit)
            model, sizes = prev, []
            ppl = _perplexity(stage, model, backend)
        else:
            model, sizes = _output(stage, work)
            ppl = _perplexity(stage, model, backend)
        size = sum(p.stat().st_size for p in sizes)
        out_hash = content_hash(work)
        rec = {"stage": stage, "key": key, "argv": argv, "output_hash": out_hash,
               "seconds": seconds, "model": model, "size_bytes": size, "perplexity": ppl,
               "pass_at_1": pass1}
        tmp = record.with_name(".stage.json.tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        tmp.replace(record)
        results.append(StageResult(stage, False, seconds, model, size, ppl, pass1))
        prev, prev_hash = model, out_hash
    return results
