"""The library half of `falsify finetune` (falsify/cli/finetune.py parses, and launches a
data-parallel job; `falsify pipeline`'s finetune stage calls `run_finetune` directly): the config
(fresh, resumed, or the built-in demo), the run, and the report, with the command's exit codes
(0 done, 2 config/data/preflight error, 3 Andon stop).

`finetune` is the run itself, for callers with a config in hand (tests, benches): it picks the
run type for the config's method, falsify/llm/finetune.py:FinetuneRun or
falsify/llm/grpo.py:GrpoRun, which extends it; so it lives here, above both modules. So do
`load_config` and `config_from_dict`, which read a config of any method by its class:
falsify/llm/finetune_config.py:FinetuneConfig, or falsify/llm/grpo.py:GrpoConfig for grpo (a
GRPO field given with another method is an error naming it: nothing would read it).
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from falsify.harness.project import find_project
from falsify.llm import charts, distributed
from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import finetune as FT
from falsify.llm import run as R
from falsify.llm import sft_data as SD
from falsify.llm.config import (
    ConfigError,
    FinetuneConfigError,
    coerce_value,
    parse_overrides,
    read_yaml_config,
)
from falsify.llm.config_file import FieldLines
from falsify.llm.data import DataError
from falsify.llm.grpo import (
    GRPO_FIELDS,
    GrpoConfig,
    GrpoRun,
    reward_summary,
    shipped_toy_problems,
)
from falsify.llm.lora_model import LoraConfigError
from falsify.llm.preflight import PreflightError
from falsify.llm.rewards import RewardConfigError, RewardFailed, check_reward_origin
from falsify.llm.run import torch_threads
from falsify.llm.run_base import OneProcess, drive, report_error
from falsify.llm.trainer import AndonStop

# The shipped dataset has ~2,400 training examples (~300 steps an epoch at batch 8); the
# built-in demo trains a fixed number of steps so it finishes in a couple of minutes on CPU.
DEMO = {"max_steps": 60, "val_split": 0.02}
# GRPO on the toy problems (each prompt ends at `return`): the completion is one token, the
# expression; 8 prompts x 8 samples a step, a sharpened sampler (the tiny base is flat)
DEMO_GRPO = {"max_steps": 40, "group_size": 8, "prompts_per_step": 8, "max_new_tokens": 1,
             "rollout_temperature": 0.8, "rollout_top_p": 0.95, "lr": 3e-2, "lr_min": 3e-3,
             "kl_beta": 0.01, "warmup_steps": 0, "sample_count": 0}


@dataclass
class FinetuneArgs:
    """What a fine-tuning run is asked for: `--config FILE`, `--resume [DIR]` ("auto": the
    newest intact checkpoint in out_dir, or with none set, of the newest fine-tuning run under
    runs/; resolved in place to the checkpoint used), `key=value`
    overrides (the command's flags first, as `key=value`) and `--allow-any-import`."""
    config: str | None = None
    resume: str | None = None
    overrides: list[str] = field(default_factory=list)
    allow_any_import: bool = False


# ---------------------------------------------------------------------------- config
def config_class(method) -> type[FT.FinetuneConfig]:
    """The config class of a method: GrpoConfig for grpo, FinetuneConfig for the others (and
    for a method that is none: its rule then says which methods there are)."""
    return GrpoConfig if method == "grpo" else FT.FinetuneConfig


def config_from_dict(d: dict, source: str = "config", base: FT.FinetuneConfig | None = None,
                     from_text: bool = False) -> FT.FinetuneConfig:
    """A config of any method: `d`'s fields over `base`'s (or the defaults), read by the class
    of the method they set. A GRPO field given another value than its default with another
    method is an error naming it (nothing would read it)."""
    method = d.get("method", base.method if base is not None else FT.FinetuneConfig.method)
    cls = config_class(method)
    return cls.from_dict(_read_by(cls, d, method, source, from_text), source,
                         _as_class(cls, base, method), from_text)


def load_config(path: str | Path | None = None, overrides: list[str] = (),
                base: FT.FinetuneConfig | None = None) -> FT.FinetuneConfig:
    """A config of any method: the YAML file, then `key=value` overrides, over `base`; the
    method is the last of them that sets it, and its class reads them all."""
    given = read_yaml_config(path) if path is not None else FieldLines()
    over = parse_overrides(list(overrides))
    method = over.get("method", given.get("method", base.method if base is not None else
                                           FT.FinetuneConfig.method))
    cls = config_class(method)
    if "method" in over:
        given = _method_overridden(given, str(path))
    cfg = _as_class(cls, base, method) or cls()
    if path is not None:  # as LoopConfig.load: the file, then the overrides, each checked
        cfg = cls.from_dict(_read_by(cls, given, method, str(path), False), str(path), cfg)
    if overrides:
        cfg = cls.from_dict(_read_by(cls, over, method, "command line", True), "command line",
                            cfg, from_text=True)
    cfg.validate()
    return cfg


def _method_overridden(given: dict, source: str) -> dict:
    """A file's fields when the command line sets the method: the file's method, which must
    still be one, is replaced (the file is read by the class of the command line's)."""
    if "method" not in given:
        return given
    lines = getattr(given, "lines", {})
    ok, why = FT.FinetuneConfig.rules["method"]
    if not (isinstance(given["method"], str) and ok(given["method"])):
        where = f"{source}:{lines['method']}: " if "method" in lines else ""
        raise FinetuneConfigError(f"{where}config field method={given['method']!r}: {why}")
    return FieldLines({k: v for k, v in given.items() if k != "method"}, lines=lines)


def _read_by(cls, d: dict, method, source: str, from_text: bool) -> dict:
    """`d` as `cls` reads it: for a class without GRPO's fields, those `d` gives at their
    defaults are left out (a checkpoint of a run from before GrpoConfig records them all), and
    one set to another value is an error naming it and, from a file, its line."""
    if cls is GrpoConfig or not set(d) & set(GRPO_FIELDS):
        return d
    lines = getattr(d, "lines", {})
    hints = typing.get_type_hints(GrpoConfig)
    for k in GRPO_FIELDS:
        if k not in d:
            continue
        try:
            value = coerce_value(k, hints[k], d[k], from_text)
        except ConfigError:
            value = d[k]
        if value != getattr(GrpoConfig, k):
            where = f"{source}:{lines[k]}: " if k in lines else ""
            raise FinetuneConfigError(f"{where}config field {k}={value!r}: only method=grpo "
                                      f"reads it (method={method!r})")
    return FieldLines({k: v for k, v in d.items() if k not in GRPO_FIELDS}, lines=lines)


def _as_class(cls, base: FT.FinetuneConfig | None, method) -> FT.FinetuneConfig | None:
    """`base` (None: the defaults) as a `cls` set to `method`: a config whose method changes
    class keeps the values both classes have (and `_read_by` refuses GRPO values it drops);
    None where the class's defaults are that already."""
    if base is None:
        return None if method == cls.method else cls(method=method)
    return cls(**{**_read_by(cls, asdict(base), method, "config", False), "method": method})


def resolve_config(args, console: Console) -> FT.FinetuneConfig:
    """The run's config: the checkpoint's on resume (`args.resume` resolved in place to the
    checkpoint used), else the file and overrides, with the built-in demo's settings where
    neither data nor a base model is given."""
    overrides = list(args.overrides)
    if args.resume:
        base = load_config(args.config, []) if args.config else FT.FinetuneConfig()
        out_dir = parse_overrides(overrides).get("out_dir", base.out_dir)
        target = (R.resume_run_dir("auto", out_dir, kind=R.FINETUNING)
                  if args.resume == "auto" else args.resume)
        # resolved once: "auto" takes the newest intact checkpoint, finetune() resumes that one
        args.resume = str(ckpt_mod.find_checkpoint(target, fallback=args.resume == "auto",
                                                   for_resume=True))
        saved = ckpt_mod.read_state(args.resume)["config"]
        cfg = config_from_dict(saved["finetune_requested"], source="checkpoint config")
        return load_config(args.config, overrides, base=cfg)
    cfg = load_config(args.config, overrides)
    given = set(parse_overrides(overrides))
    if args.config:
        given |= set(read_yaml_config(args.config))
    if not cfg.data and cfg.model is None:
        grpo = cfg.method == "grpo"
        demo = {k: v for k, v in (DEMO_GRPO if grpo else DEMO).items() if k not in given}
        if demo:
            cfg = config_from_dict(demo, source="built-in demo", base=cfg)
            console.print(f"built-in demo (shipped {'toy problems' if grpo else 'dataset'}, "
                          "built-in base): "
                          + " ".join(f"{k}={v}" for k, v in demo.items())
                          + " (set them to change)")
    return cfg


def summary(console: Console, cfg: FT.FinetuneConfig, r: FT.FinetuneResult) -> None:
    d = r.data_info
    console.print(f"trained {r.final_step}/{r.max_steps} steps ({r.stopped}) in "
                  f"{r.elapsed_s:.1f} s, {r.tokens_per_s:,.0f} tok/s; "
                  f"{d['train']} train / {d['val']} val examples "
                  f"({d['truncated']} truncated, {d['dropped']} dropped)")
    if r.rewards:
        _reward_summary(console, cfg, r)
    elif r.losses:
        k = max(1, min(10, len(r.losses) // 5))
        first = sum(r.losses[:k]) / k
        last = sum(r.losses[-k:]) / k
        console.print(f"[bold]train loss {first:.4f} -> {last:.4f}[/] (mean of the first / last "
                      f"{k} steps)")
    if r.evals:
        _eval_table(console, r)
    elif not r.rewards:  # GRPO holds out nothing: its report is the reward
        console.print(f"no evaluation ran: {_why_no_eval(cfg, r)}")
    mem = r.memory
    console.print(f"base projections: {mem['projections_stored'] / 2**20:.2f} MiB stored vs "
                  f"{mem['projections_fp32'] / 2**20:.2f} MiB fp32 "
                  f"(x{mem['projections_ratio']:.3f}); adapters "
                  f"{mem['adapters'] / 2**20:.2f} MiB")
    if r.adapter_dir and cfg.keep_masks:
        console.print(f"adapter (masked: not PEFT, merge it with `falsify merge --adapter`): "
                      f"{r.adapter_dir}")
    elif r.adapter_dir:
        console.print(f"adapter (PEFT format): {r.adapter_dir}")
    if r.checkpoint:
        console.print(f"checkpoint: {r.checkpoint}")
    for s in r.samples:
        body = Text()
        body.append("prompt:\n", style="bold")
        body.append(s["prompt"] + "\n")
        body.append("reference:\n", style="bold")
        body.append(s["reference"] + "\n")
        body.append("base:\n", style="bold red")
        body.append(_clip(s["base"]) + "\n")
        body.append("base + adapter:\n", style="bold green")
        body.append(_clip(s["adapted"]))
        t = ("greedy" if cfg.sample_temperature == 0 else
             f"T={cfg.sample_temperature}, top-k {cfg.sample_top_k}, same seed for both")
        console.print(Panel(body, title=f"sample of a held-out prompt ({t})", expand=False))


def _eval_table(console: Console, r: FT.FinetuneResult) -> None:
    """One row per evaluation this process ran; a resumed run's baseline (step 0) was
    evaluated by the process that started it, so the title names step 0 only when it is here."""
    base = " (step 0 = the frozen base)" if r.evals[0]["step"] == 0 else ""
    t = Table("step", "val_loss", *(["val_ppl"] if r.kind == "sft" else ["val_accuracy"]),
              title=f"held-out examples{base}")
    for e in r.evals:
        t.add_row(str(e["step"]), f"{e['val_loss']:.4f}",
                  f"{e.get('val_ppl', e.get('val_accuracy', 0)):.3f}")
    console.print(t)


def _why_no_eval(cfg: FT.FinetuneConfig, r: FT.FinetuneResult) -> str:
    if not r.data_info.get("val"):
        return (f"no held-out examples (val_split={cfg.val_split:g}, "
                f"{r.data_info.get('train', 0)} train examples)")
    # a step at max_steps is always evaluated: this process stopped short of it (or resumed
    # a run that had reached it)
    return (f"none was due in the {len(r.steps)} step(s) this process ran, up to step "
            f"{r.final_step} of max_steps={r.max_steps} (eval_interval="
            f"{'null: each epoch end' if cfg.eval_interval is None else cfg.eval_interval})")


def _reward_summary(console: Console, cfg: GrpoConfig, r: FT.FinetuneResult) -> None:
    """GRPO: the mean reward of the first and last batches, and the curve as a PNG."""
    s = reward_summary(r.rewards)
    console.print(f"[bold]mean reward {s['first']:.4f} -> {s['last']:.4f}[/] (mean of the "
                  f"first / last {s['k']} of {len(r.rewards)} batches; reward {cfg.reward})")
    if s["last"] <= s["first"]:
        console.print("[bold yellow]the mean reward did not rise over this run[/]")
    png = Path(r.out_dir) / "reward.png"
    # the axis spans the data, rounded out to tenths (a curve near 0 is not flattened by 0..1)
    lo = min(0.0, math.floor(min(r.rewards) * 10) / 10)
    hi = max(lo + 0.1, math.ceil(max(r.rewards) * 10) / 10)
    charts.line_chart(png, {"mean reward": r.rewards}, ylim=(lo, hi), xlabel="batch",
                      ylabel=f"mean reward ({cfg.reward})", title="GRPO: mean reward per batch")
    console.print(f"reward curve: {png} (y from {lo:g} to {hi:g}, one point per batch)")


def _clip(text: str, lines: int = 12) -> str:
    """At most `lines` lines, and a visible marker for an empty continuation."""
    if not text.strip():
        return "(empty: end of text right away)" if not text else f"(whitespace: {text!r})"
    parts = text.rstrip("\n").split("\n")
    return "\n".join(parts[:lines]) + (f"\n… ({len(parts) - lines} more lines)"
                                       if len(parts) > lines else "")


def check_reward(cfg: FT.FinetuneConfig, args) -> None:
    """GRPO's `module:function` reward comes from the project or an installed package (or
    --allow-any-import); the other methods score with no reward."""
    if not isinstance(cfg, GrpoConfig):
        return
    proj = find_project()
    check_reward_origin(cfg.reward, proj.root if proj else None, args.allow_any_import)


def finetune(cfg: FT.FinetuneConfig, *, resume: str | Path | None = None,
             base: FT.Base | None = None, dataset: SD.Dataset | None = None,
             objectives: FT.Objectives | None = None, stop_after: int | None = None,
             keep_model: bool = False, console=None, problems: list | None = None,
             grpo_parts=None) -> FT.FinetuneResult:
    """Run (or resume) a fine-tuning run. `base`/`dataset`: already loaded (tests, contract
    checks); otherwise from cfg.model / cfg.data. `stop_after`: stop (checkpointed) after this
    step as if killed, the schedule still runs to max_steps. The run is the method's:
    finetune.FinetuneRun, or grpo.GrpoRun (which extends it: hence this function lives above
    both modules)."""
    ranked = distributed.launched_world_size() > 1  # one rank of a torchrun job
    parallel = distributed.DataParallel() if ranked else OneProcess()

    def make_run() -> FT.FinetuneRun:
        if cfg.method != "grpo":
            return FT.FinetuneRun(cfg, objectives or FT.Objectives(), parallel)
        if ranked:
            raise FinetuneConfigError("config field method='grpo' runs in one process "
                                      "(no --nproc)")
        return GrpoRun(cfg, objectives or FT.Objectives(), grpo_parts)

    data = problems if cfg.method == "grpo" else dataset
    with torch_threads(cfg.threads):
        return drive(parallel, make_run, lambda run: run.load(base, data, console), resume,
                     stop_after, keep_model)


def _run_dir_said(cfg: FT.FinetuneConfig, resume: str | None) -> str:
    """The run directory as the run's first line names it (FT.run_dir decides it)."""
    if cfg.out_dir is None and resume is None:
        return f"runs/{cfg.method}-<time> (new)"
    return str(FT.run_dir(cfg, resume))


def run_finetune(args, console: Console) -> int:
    """`falsify finetune` in this process: the config, the run, the report; the exit code."""
    cfg = None
    try:
        cfg = resolve_config(args, console)
        check_reward(cfg, args)
        shipped = FT.SHIPPED
        if cfg.method == "grpo":
            shipped = shipped_toy_problems()
        console.print(f"[bold]falsify finetune[/]: method={cfg.method} base="
                      f"{cfg.model or 'built-in'} data={','.join(cfg.data) or shipped} "
                      f"r={cfg.lora_r} alpha={cfg.lora_alpha} targets={','.join(cfg.targets)} "
                      f"out_dir={_run_dir_said(cfg, args.resume)}")
        result = finetune(cfg, resume=args.resume, console=console)
    except (ConfigError, PreflightError, DataError, LoraConfigError,
            ckpt_mod.CheckpointError, RewardConfigError, RewardFailed, OSError) as e:
        return report_error(console, e)
    except AndonStop as e:
        where = e.result.out_dir if e.result is not None else cfg.out_dir
        console.print(f"[bold red]{e}[/]\nlast good checkpoint kept: "
                      f"{ckpt_mod.latest_checkpoint(where) if where else None}")
        return 3
    if result.resumed_from:
        console.print(f"resumed from {result.resumed_from}")
    summary(console, cfg, result)
    return 0

