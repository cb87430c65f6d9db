"""The plumbing every training run shares (pretraining, fine-tuning, GRPO, distillation, and
their data-parallel ranks): the step loop, eval and checkpoint cadence, stop_after test stops,
Andon records, metrics.jsonl, progress, the resumed run's bookkeeping and the final summary;
and the error line the run commands print (falsify/llm/train_stage.py, finetune_stage.py).

`RunBase.loop` is the one step loop; a run type says only what differs through the hooks
below (where its micro-batches come from, what a step record holds, when it evaluates and
saves, what it exports at the end). What a run is built from (config, data, model, trainer)
is each run type's own: falsify/llm/run.py, finetune.py, grpo.py, distill.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch
import yaml

from falsify.harness.files import atomic_write
from falsify.llm import checkpoint as ckpt_mod
from falsify.llm import run_lock
from falsify.llm.trainer import AndonStop, StepStats, Trainer

log = logging.getLogger("falsify.train")

METRICS_RECORDS = "metrics_records"  # the checkpoint step's metrics.jsonl records, in state.json


# ---------------------------------------------------------------------------- the files
def truncate_metrics(path: Path, step: int, state: dict | None = None,
                     ckpt: Path | None = None) -> None:
    """After resuming at `step`, drop records a killed run wrote for later steps, and a torn last
    line (said so): checkpoint.truncate_metrics. When the checkpoint `ckpt` is this run's own,
    the records of `step` itself are rewritten from its copy (`state`'s METRICS_RECORDS); a
    run resumed into another directory starts its log after the checkpoint."""
    own = ckpt is not None and ckpt_mod.run_dir_of(ckpt).resolve() == path.parent.resolve()
    ckpt_mod.truncate_metrics(path, step, (state or {}).get(METRICS_RECORDS) if own else None)


class MetricsLog:
    """metrics.jsonl, appended line by line; it remembers the records of the latest step so
    that a checkpoint of that step carries them and a resume can rewrite them (a kill may have
    torn the last one after the checkpoint was saved)."""

    def __init__(self, path: Path, writes: bool):
        self.fh = path.open("a", buffering=1) if writes else open(os.devnull, "w")
        self.step: int | None = None
        self.records: list[dict] = []

    def write(self, text: str) -> None:
        self.fh.write(text)
        for line in text.splitlines():
            rec = json.loads(line)
            if rec.get("step") != self.step:
                self.step, self.records = rec.get("step"), []
            self.records.append(rec)

    def records_of(self, step: int) -> list[dict]:
        return list(self.records) if self.step == step else []

    def close(self) -> None:
        self.fh.close()


def metrics_extra(run, step: int) -> dict:
    """The state.json entry carrying step `step`'s metrics records (none outside a loop)."""
    mf = getattr(run, "mf", None)
    return {METRICS_RECORDS: mf.records_of(step)} if mf is not None else {}


def step_or_andon(trainer: Trainer, micro: list, out: Path) -> StepStats:
    """One optimizer step; an Andon stop is recorded in out/andon.json (with the last good
    checkpoint) before it propagates."""
    try:
        return trainer.train_step(micro)
    except AndonStop as e:
        atomic_write(out / "andon.json", json.dumps(
            {"step": e.step, "reason": str(e),
             "last_good_checkpoint": str(ckpt_mod.latest_checkpoint(out))}))
        raise


# ------------------------------------------------------------------------------ progress
class Progress:
    """Rich progress bar with loss, lr, grad norm, tokens/s and ETA, or a log line every
    `log_interval` steps when disabled."""

    def __init__(self, enabled: bool, total: int, start: int, log_interval: int,
                 logger: logging.Logger = log):
        self.bar, self.log_interval, self.log = None, log_interval, logger
        if not enabled:
            return
        # rich is imported only for a live bar: a run without one (a rank, a test) never pays
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as Bar

        self.bar = Bar(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                       TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                       TextColumn("ETA"), TimeRemainingColumn())
        self.task = self.bar.add_task("train", total=total, completed=start, stats="")
        self.bar.start()

    def update(self, st: StepStats, tps: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=st.step,
                            stats=f"loss {st.loss:.3f} lr {st.lr:.2e} gnorm {st.grad_norm:.2f} "
                                  f"{tps:,.0f} tok/s")
        elif st.step % self.log_interval == 0:
            self.log.info("step %d loss %.4f lr %.3e gnorm %.3f %.0f tok/s", st.step, st.loss,
                          st.lr, st.grad_norm, tps)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class QuietProgress:
    """No bar and no progress line: for a run that logs its own line per step (GRPO)."""

    def update(self, st: StepStats, tps: float) -> None:
        pass

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------- the commands
def report_error(console, e: Exception) -> int:
    """A run command's line for an error it expects (a bad config, data or checkpoint; for an
    OSError, such as an out_dir not creatable or a disk full, the path and why: what is saved
    stays), and the commands' exit code for it, 2."""
    # rich only for a command's console: a run without one (a rank, a test) never pays
    from rich.markup import escape

    if isinstance(e, OSError):
        text = f"{escape(str(e.filename or ''))}: {escape(e.strerror or str(e))}"
    else:
        text = escape(str(e))
    console.print(f"[bold red]error:[/] {text}", soft_wrap=True)
    return 2


# ------------------------------------------------------------------- the process strategy
class OneProcess:
    """The run's process strategy when this process is the whole run (the default); the
    data-parallel one, every method's counterpart, is falsify/llm/distributed.py:DataParallel."""

    rank, size, writes = 0, 1, True

    def attach(self, device: torch.device) -> torch.device:
        """The device this process trains on, given the run's."""
        return device

    def agree(self, decide):
        """A value every process uses alike (a new run directory's name): decided here."""
        return decide()

    def global_batch(self, cfg):
        """The config the data are drawn with: the run's own."""
        return cfg

    @contextlib.contextmanager
    def main_first(self):
        """Around work whose files every process reads (the data cache): nothing to wait for."""
        yield

    def shard_blocks(self, micro: list) -> list:
        """This process's rows of the step's (x, y) micro-batches: all of them."""
        return micro

    def local_rows(self, idx, per: int):
        """This process's example indices of a micro-batch: all of them."""
        return idx

    def trainer(self, run) -> Trainer:
        return run.make_trainer()

    def save(self, run, metrics: dict | None) -> Path:
        tr = run.trainer
        return ckpt_mod.save_checkpoint(
            run.out, tr.step, run.checkpoint_module(), tr.optimizer, tr.param_names,
            data_state=run.sampler.state_dict(), config=run.checkpoint_config(),
            metrics=metrics, extra={**run.checkpoint_extra(), **metrics_extra(run, tr.step)},
            keep_last=run.cfg.keep_last)

    def settle(self, trainer: Trainer) -> None:
        """After the run's last forward (the sample): nothing is left gathered."""

    def leave(self, completed: bool, trainer: Trainer | None) -> None:
        """The run is over: no process group to leave."""


# ------------------------------------------------------------------------------ the stages
def drive(parallel: OneProcess, make_run, load, resume, stop_after: int | None,
          keep_model: bool):
    """A run through its stages: made (`make_run()`), its directory opened (a resumed run's
    or a new one), its data loaded (`load(run)`), built, and looped; its run lock released and
    the process group left however it ends (a completed run's ranks meet at a barrier)."""
    completed, run = False, None
    try:
        run = make_run()
        run.open(resume)
        load(run)
        run.build()
        result = run.loop(stop_after, keep_model)
        completed = True
        return result
    finally:
        run_lock.release(getattr(run, "lock", None))
        parallel.leave(completed, getattr(run, "trainer", None))


# ------------------------------------------------------------------------------- the run
class RunBase:
    """A run's stages after it is built: `loop` (steps, evaluations, checkpoints, stops) and
    the finish. A run type sets `cfg`, `out`, `trainer`, `model`, `sampler`, `result`,
    `metrics_path`, `t_start` before `loop`, and fills in the hooks."""

    progress_log: logging.Logger = log  # where a run without a bar logs its progress lines

    def __init__(self, parallel: OneProcess | None = None) -> None:
        self.t_start = time.perf_counter()
        # OneProcess, or distributed.DataParallel: this process as one rank of several
        self.parallel = parallel or OneProcess()
        self.ckpt_path: Path | None = None
        self.best_val: float | None = None
        self.lock: run_lock.RunLock | None = None
        self.mf: MetricsLog | None = None

    @property
    def writes(self) -> bool:
        """This process writes the run's files (a data-parallel rank other than 0 does not)."""
        return self.parallel.writes

    @property
    def world_size(self) -> int:
        """Processes training this model (falsify/llm/distributed.py: W)."""
        return self.parallel.size

    def lock_run(self, run_dir: Path) -> None:
        """One writer per run directory, taken before anything in it is read or pruned; a
        data-parallel rank other than 0 writes nothing and takes none."""
        if self.writes:
            self.lock = run_lock.acquire(run_dir)

    # ---- hooks ---------------------------------------------------------------------
    @property
    def max_steps(self) -> int:
        return self.cfg.max_steps

    def next_micro(self) -> list:
        """The step's micro-batches (a data-parallel rank reads its shard of them)."""
        raise NotImplementedError

    def micro_tokens(self, st: StepStats, micro: list) -> int:
        """What the step adds to the run's token count (tokens/s)."""
        return st.tokens

    def record(self, st: StepStats, step_s: float, fetch_s: float, tps: float) -> None:
        """The step into the result and metrics.jsonl. step_s: the optimizer step's seconds;
        fetch_s: the seconds next_micro took before it."""
        raise NotImplementedError

    def eval_due(self, step: int, last: bool) -> bool:
        raise NotImplementedError

    def evaluate(self, step: int) -> dict:
        raise NotImplementedError

    def save_due(self, step: int) -> bool:
        raise NotImplementedError

    def early_stop(self) -> str | None:
        """Why the run stops early after this step's evaluation (None: it goes on)."""
        return None

    def before_loop(self) -> None:
        """Work after metrics.jsonl is open and before the first step (fine-tuning: the
        step-0 evaluation of the frozen base)."""

    def make_progress(self) -> Progress | QuietProgress:
        return Progress(self.cfg.progress and self.writes, self.max_steps, self.trainer.step,
                        self.cfg.log_interval, self.progress_log)

    def finish(self) -> None:
        """A completed (or early-stopped) run: final numbers, exports, summary.json."""
        raise NotImplementedError

    # ---- the trainer ---------------------------------------------------------------
    # a data-parallel checkpoint: True, every rank writes its shard of the state (FSDP may
    # split the weights); False, rank 0 writes the one-process layout (the ranks are replicas)
    shards_state = False

    def make_trainer(self) -> Trainer:
        """The step as one process runs it."""
        raise NotImplementedError

    def make_parallel_trainer(self, world, dparts) -> Trainer:
        """The step as one rank of `world` runs it (falsify/llm/distributed.py)."""
        raise NotImplementedError(f"{type(self).__name__} runs in one process")

    # ---- checkpoints ---------------------------------------------------------------
    def checkpoint_module(self):
        """What a checkpoint stores the weights of (fine-tuning: the adapters' view)."""
        return self.model

    def checkpoint_config(self) -> dict:
        raise NotImplementedError

    def checkpoint_extra(self) -> dict:
        """state.json entries of this run type (the metrics records are added to them)."""
        return {"best_val_loss": self.best_val}

    def save(self, metrics: dict | None = None) -> Path:
        """Checkpoint the step, as the process strategy writes it (a data-parallel run:
        falsify/llm/distributed.py:DataParallel.save)."""
        return self.parallel.save(self, metrics)

    def resumed(self, state: dict) -> None:
        """Bookkeeping of a run restored from self.ckpt_path (its trainer at state's step):
        metrics.jsonl loses what the killed run wrote after the checkpoint."""
        self.result.resumed_from = str(self.ckpt_path)
        if self.writes:
            truncate_metrics(self.metrics_path, self.trainer.step, state, self.ckpt_path)

    # ---- files ---------------------------------------------------------------------
    def write_config(self, effective: dict) -> None:
        """config.json (the effective config: what ran) and config.yaml (what was asked)."""
        if self.writes:
            atomic_write(self.out / "config.json",
                              json.dumps(effective, indent=1, default=str))
            atomic_write(self.out / "config.yaml",
                              yaml.safe_dump(asdict(self.cfg), sort_keys=False))

    def write_run_summary(self) -> None:
        atomic_write(self.out / "summary.json", json.dumps(
            {k: v for k, v in asdict(self.result).items() if k != "model"}, default=str))

    # ---- the loop ------------------------------------------------------------------
    def step(self, micro: list) -> StepStats:
        """One optimizer step; an Andon stop carries the run's result so far."""
        try:
            return step_or_andon(self.trainer, micro, self.out)
        except AndonStop as e:
            e.result = self.result
            raise

    def loop(self, stop_after: int | None, keep_model: bool):
        """Steps to max_steps (or stop_after, or an early stop), then the finish. `stop_after`:
        stop (checkpointed) after this step as if killed; the schedule still runs to the end."""
        tr = self.trainer
        self.mf = MetricsLog(self.metrics_path, self.writes)
        progress = None
        try:
            self.before_loop()
            progress = self.make_progress()
            t_loop, tokens = time.perf_counter(), 0
            while tr.step < self.max_steps:
                t0 = time.perf_counter()
                micro = self.next_micro()
                t1 = time.perf_counter()
                st = self.step(micro)
                tokens += self.micro_tokens(st, micro)
                now = time.perf_counter()
                tps = tokens / (now - t_loop)
                self.record(st, now - t1, t1 - t0, tps)
                progress.update(st, tps)
                if self.after_step(st, stop_after):
                    break
        finally:
            if progress is not None:
                progress.close()
            self.mf.close()
        return self.close_result(tokens, t_loop, keep_model)

    def after_step(self, st: StepStats, stop_after: int | None) -> bool:
        """Evaluation, early stopping and checkpoints after step `st`; True: stop the run."""
        result = self.result
        last = st.step == self.max_steps
        metrics = self.evaluate(st.step) if self.eval_due(st.step, last) else None
        early = self.early_stop()
        stopping = early is not None or (stop_after is not None and st.step >= stop_after)
        if self.save_due(st.step) or last or stopping:
            result.checkpoint = str(self.save(metrics))
        if early is not None:
            result.stopped = early
        elif stopping:
            result.stopped = f"stop_after={stop_after}"
        return stopping

    def close_result(self, tokens: int, t_loop: float, keep_model: bool):
        """The run's totals; finish() (final eval numbers, exports) unless a stop_after stop."""
        result = self.result
        result.final_step = self.trainer.step
        result.tokens = tokens
        result.tokens_per_s = tokens / max(1e-9, time.perf_counter() - t_loop)
        if not result.stopped.startswith("stop_after"):
            self.finish()
        result.elapsed_s = time.perf_counter() - self.t_start
        if keep_model:
            result.model = self.model
        return result
