"""GRPO fine-tuning (`falsify finetune --method grpo`): group-relative policy optimisation of a
LoRA / QLoRA policy on code problems scored by a reward ([shao2024] §4.1).

One batch (every `grpo_iterations` optimizer steps):
  1. P = prompts_per_step problems (a seeded permutation per epoch);
  2. G = group_size completions of each, sampled from the current policy with the rollout
     temperature and top-p, from a generator seeded by (seed, batch, prompt): a run is a
     function of its seed, and a resumed run draws what the uninterrupted one drew;
  3. rewards (falsify/llm/rewards.py), group advantages A = (r − mean_g) / (std_g + eps);
  4. the old policy's per-token log-probs, ONCE, before any update on the batch (so the first
     update's ratio π/π_old is exactly 1), and the reference's: the frozen base, adapters off;
then `grpo_iterations` optimizer steps, each minimising the clipped-ratio objective with
β·KL(k3) against the reference (the grpo-loss kernel), through the shared trainer (clip,
AdamW, schedule, Andon), checkpoints, metrics.jsonl and resume.

The config is `GrpoConfig`: falsify/llm/finetune_config.py's `FinetuneConfig` and the fields
GRPO adds (`GRPO_FIELDS`: the policy adapter, the rollouts, the reward).

The swappable pieces (`GrpoParts`: sampler, reference and old log-probs, reward scoring, the
kernel functions) are what falsify/contracts/grpo-finetune-v1.yaml binds and its mutants replace.
"""

from __future__ import annotations

import json
import logging
import typing
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from falsify.kernels.torch import grpo_loss as grpo_kernels
from falsify.llm import data as data_mod
from falsify.llm import finetune as FT
from falsify.llm import lora_model as LM
from falsify.llm import rewards as RW
from falsify.llm.config import AT_LEAST_1, NON_NEGATIVE, POSITIVE, FinetuneConfigError
from falsify.llm.evaluate import EvalError, load_problems
from falsify.llm.finetune_config import FinetuneConfig
from falsify.llm.preflight import check_warmup
from falsify.llm.run_base import QuietProgress
from falsify.llm.sft_data import SFTExample

log = logging.getLogger("falsify.finetune.grpo")

ADV_EPS = 1e-4  # std + eps in the advantage: a group of equal rewards gets A = 0, not 0/0


def shipped_toy_problems():
    return Path(str(resources.files("falsify.llm") / "evalset" /
                    "toy-code-problems.jsonl"))


# ------------------------------------------------------------------------------ config
@dataclass
class GrpoConfig(FinetuneConfig):
    """`method: grpo`: a fine-tuning config (the base, the adapter's shape, steps, optimizer,
    checkpoints) and what GRPO adds: the adapter it trains, the rollouts and the reward.
    `data` are code problems in the evaluation format (falsify/llm/evaluate.py)."""

    configures: ClassVar[tuple[str, ...]] = ("grpo",)

    method: str = "grpo"
    policy: str = "qlora"  # lora | qlora: the adapter GRPO trains
    group_size: int = 8  # G completions sampled per prompt
    prompts_per_step: int = 4  # P prompts per batch (a batch is P·G sequences)
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    max_new_tokens: int = 24
    stop_at_newline: bool = False  # a completion also ends at its first newline (one-line bodies)
    clip_eps: float = 0.2  # the ratio is clipped to [1 − ε, 1 + ε]
    kl_beta: float = 0.04  # weight of the k3 KL to the reference (the frozen base)
    grpo_iterations: int = 1  # optimizer steps per sampled batch (π_old fixed across them)
    reward: str = "builtin:unit_tests"  # or a user's module:function(prompt, completion, problem)
    reward_error: str = "error"  # a raising reward: error (stop after the step) | score:<number>

    rules: ClassVar[dict] = {
        **FinetuneConfig.rules,
        "policy": (lambda v: v in ("lora", "qlora"), "must be lora or qlora"),
        "group_size": (lambda v: v >= 2, "must be >= 2 (an advantage compares a group's "
                       "completions)"),
        **{k: AT_LEAST_1 for k in ("prompts_per_step", "max_new_tokens", "grpo_iterations")},
        "rollout_temperature": POSITIVE,
        "rollout_top_p": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
        "clip_eps": (lambda v: 0 < v < 1, "must be in (0, 1)"),
        "kl_beta": NON_NEGATIVE,
        "reward": (lambda v: ":" in v, "must be builtin:unit_tests or module:function"),
        "reward_error": (lambda v: _reward_error_ok(v), "must be error or score:<number>, "
                         "e.g. score:0"),
    }

    @property
    def adapter(self) -> str:
        return self.policy


def _reward_error_ok(v: str) -> bool:
    try:
        RW.parse_reward_error(v)
    except ValueError:
        return False
    return True


# the fields GRPO adds: only method=grpo reads them
GRPO_FIELDS = tuple(f.name for f in fields(GrpoConfig)
                    if f.name not in {g.name for g in fields(FinetuneConfig)})


# ------------------------------------------------------------------------------ sampling
def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter of logits [n, V]: keep the smallest set of most likely tokens whose
    probability reaches top_p (the most likely token always), the rest −inf. Ties in the sort
    are broken by token id (a stable sort), so the kept set is a function of the logits."""
    if top_p >= 1.0:
        return logits
    srt, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
    p = torch.softmax(srt, dim=-1)
    drop = (p.cumsum(-1) - p) >= top_p  # the mass before this token already reaches top_p
    srt = srt.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, idx, srt)


@torch.no_grad()
def sample_group(model, prompt: list[int], n: int, max_new: int, temperature: float,
                 top_p: float, generator: torch.Generator, stop_id: int,
                 stop_ids: torch.Tensor | None = None) -> list[list[int]]:
    """n completions (token lists, each ending at its first stop token, which it keeps:
    stop_id, or one of `stop_ids`) of one prompt, drawn with `generator` only. A finished row
    is padded with stop_id. No KV cache: the tiny models recompute the window."""
    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    x = torch.tensor([prompt] * n, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    lengths = torch.zeros(n, dtype=torch.long, device=dev)
    for _ in range(max_new):
        logits = model(x[:, -model.cfg.max_seq_len:], last_only=True)[:, -1, :].float() / \
            temperature
        probs = torch.softmax(top_p_filter(logits, top_p), dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, stop_id), nxt)
        x = torch.cat([x, nxt[:, None]], dim=1)
        ends = nxt == stop_id
        if stop_ids is not None:
            ends |= torch.isin(nxt, stop_ids)
        lengths = torch.where(done, lengths, lengths + 1)
        done |= ends
        if bool(done.all()):
            break
    model.train(was)
    return [row[:k] for row, k in zip(x[:, len(prompt):].tolist(), lengths.tolist())]


def rollout_seed(seed: int, batch: int, prompt: int) -> int:
    return int(np.random.SeedSequence([seed, batch, prompt]).generate_state(1)[0])


# ------------------------------------------------------------------------------ log-probs
def token_logps(model, x: torch.Tensor) -> torch.Tensor:
    """log π(x_t | x_<t) for t ≥ 1: [B, S−1], fp32."""
    logits = model(x[:, :-1])
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def reference_logps(model, x: torch.Tensor) -> torch.Tensor:
    """The reference policy: the frozen base (every adapter off), in eval mode."""
    was = model.training
    model.eval()
    with LM.adapters_disabled(model):
        out = token_logps(model, x)
    model.train(was)
    return out


def old_logps(trainer, batch: Rollout) -> torch.Tensor:
    """π_old of an update on `batch`: the policy's log-probs taken once when the batch was
    sampled, before any update on it (so the first update's ratio is exactly 1)."""
    return batch.old_logp


@torch.no_grad()
def policy_logps(model, x: torch.Tensor) -> torch.Tensor:
    """The current policy's log-probs without a graph, in the mode the loss forward uses
    (train mode; lora_dropout is 0 for GRPO, so both passes are the same function)."""
    was = model.training
    model.train()
    out = token_logps(model, x)
    model.train(was)
    return out


def _kernel(name: str):
    """The grpo-loss kernel function `name`, looked up in its module at each call (so a
    replaced module attribute is the one that runs)."""
    def call(*args, **kw):
        return getattr(grpo_kernels, name)(*args, **kw)

    call.__name__ = name
    return call


@dataclass
class GrpoParts:
    """The swappable pieces (contract bindings; mutants replace one at a time)."""

    sample_group: typing.Callable = sample_group
    reference_logps: typing.Callable = reference_logps
    old_logps: typing.Callable = old_logps
    score_rewards: typing.Callable = RW.score_rewards
    group_advantages: typing.Callable = field(default_factory=lambda: _kernel("group_advantages"))
    grpo_loss: typing.Callable = field(default_factory=lambda: _kernel("grpo_loss"))


# ------------------------------------------------------------------------------ batches
@dataclass
class Rollout:
    """One batch: P·G sequences (prompt + completion, right-padded with EOS), the completion
    mask on targets [B, S−1], rewards, advantages, old and reference log-probs."""

    x: torch.Tensor
    mask: torch.Tensor
    rewards: torch.Tensor
    advantages: torch.Tensor
    old_logp: torch.Tensor
    ref_logp: torch.Tensor
    completions: list[str]
    tokens: list[list[int]]
    task_ids: list[str]
    errors: int = 0
    first_error: str | None = None
    batch: int = 0


class ProblemSampler:
    """Which P problems batch b uses: a seeded permutation per epoch, batches in order; the
    state is the batch counter alone."""

    def __init__(self, n: int, per_step: int, epochs: int, seed: int):
        self.n, self.per_step, self.epochs, self.seed = n, per_step, epochs, seed
        self.steps_per_epoch = n // per_step
        self.batch = 0

    @property
    def epoch(self) -> int:
        return self.batch // self.steps_per_epoch

    @property
    def step_in_epoch(self) -> int:
        return self.batch % self.steps_per_epoch

    def indices(self, batch: int) -> list[int]:
        e, k = divmod(batch, self.steps_per_epoch)
        order = np.random.default_rng([self.seed, e, 31]).permutation(self.n)
        return [int(i) for i in order[k * self.per_step:(k + 1) * self.per_step]]

    def next_batch(self) -> tuple[int, list[int]]:
        b = self.batch
        self.batch += 1
        return b, self.indices(b)

    def state_dict(self) -> dict:
        return {"batch": self.batch}

    def load_state_dict(self, state: dict) -> None:
        self.batch = int(state["batch"])


# ------------------------------------------------------------------------------ trainer
class GrpoTrainer(FT.FinetuneTrainer):
    """The shared step (clip, AdamW, schedule, Andon) with the GRPO loss as its micro-batch
    hook: one micro-batch per step (the whole rollout), normalised by the kernel itself."""

    def __init__(self, model, cfg, device, autocast_dtype, parts: GrpoParts,
                 objectives: FT.Objectives | None = None):
        super().__init__(model, cfg, device, autocast_dtype, "grpo", objectives)
        self.grpo = parts

    def count(self, micro) -> int:
        return 1

    def micro_loss(self, batch: Rollout) -> tuple[torch.Tensor, dict]:
        c = self.cfg
        with self._autocast():
            logp = token_logps(self.model, batch.x)
        old = self.grpo.old_logps(self, batch)
        loss = self.grpo.grpo_loss(logp, old, batch.ref_logp, batch.advantages, batch.mask,
                                    c.clip_eps, c.kl_beta)
        with torch.no_grad():
            m = batch.mask.bool()
            d = (logp.detach() - old)[m]
            ratio = torch.exp(d)
            r = (batch.ref_logp - logp.detach())[m]
            kl = (torch.exp(r) - r - 1).mean()
            clipped = ((ratio - 1).abs() > c.clip_eps).float().mean()
        return loss, {"ratio_dev": float(d.abs().max()), "kl": float(kl),
                      "clip_frac": float(clipped)}


# ------------------------------------------------------------------------------ the run
def check_config(cfg: GrpoConfig) -> None:
    """What GRPO needs of the shared fields (each error names its field)."""
    need = [(cfg.grad_accum == 1, "grad_accum", "GRPO takes one rollout batch per step "
             "(prompts_per_step x group_size sequences); set grad_accum=1"),
            (cfg.lora_dropout == 0, "lora_dropout", "GRPO needs the same policy function when "
             "it samples, takes the old log-probs and trains (ratio 1 at the first update); "
             "set lora_dropout=0"),
            (cfg.max_steps is None or cfg.max_steps % cfg.grpo_iterations == 0, "max_steps",
             f"must be a multiple of grpo_iterations={cfg.grpo_iterations} (a batch's updates "
             "are not split)"),
            (cfg.save_every % cfg.grpo_iterations == 0, "save_every",
             f"must be a multiple of grpo_iterations={cfg.grpo_iterations} (a checkpoint "
             "falls between batches)")]
    for ok, name, why in need:
        if not ok:
            raise FinetuneConfigError(f"config field {name}={getattr(cfg, name)!r}: {why}")


def newline_ids(tok, device) -> torch.Tensor:
    """Every token whose text holds a newline (stop_at_newline: each ends a completion)."""
    return torch.tensor([i for i in range(tok.get_vocab_size())
                         if "\n" in data_mod.decode(tok, [i])], device=device)


def read_problems(files: list[str]) -> list:
    problems = []
    for f in files:
        try:
            problems += load_problems(f)
        except EvalError as e:
            raise FinetuneConfigError(f"config field data: {e}") from None
    return problems


def encode_prompts(problems: list, tok, eos: int, max_new_tokens: int,
                   ctx: int) -> list[list[int]]:
    """Each problem's prompt as ids after EOS; a prompt that leaves no room for max_new_tokens
    in the base's context is an error naming the problem."""
    prompts = []
    for p in problems:
        ids = [eos] + data_mod.encode(tok, p.prompt)
        if len(ids) + max_new_tokens > ctx:
            raise FinetuneConfigError(
                f"problem {p.task_id}: prompt of {len(ids)} tokens + max_new_tokens="
                f"{max_new_tokens} exceeds the base's context of {ctx} tokens")
        prompts.append(ids)
    return prompts


def reference_examples(prompts: list[list[int]], problems: list, tok) -> list[SFTExample]:
    """Prompt + canonical body, the body trained (the reference the end-of-run samples show)."""
    out = []
    for ids, p in zip(prompts, problems):
        body = data_mod.encode(tok, p.canonical_solution)
        out.append(SFTExample(ids + body, [False] * len(ids) + [True] * len(body), None,
                              p.task_id))
    return out


class GrpoRun(FT.FinetuneRun):
    """A fine-tuning run whose data are code problems and whose step is a GRPO update."""

    def __init__(self, cfg: GrpoConfig, obj: FT.Objectives, parts: GrpoParts | None = None):
        super().__init__(cfg, obj)
        check_config(cfg)
        self.parts = parts or GrpoParts()
        self.reward = RW.load_reward(cfg.reward)
        self.on_error = RW.parse_reward_error(cfg.reward_error)
        self.rollout: Rollout | None = None
        self.iteration = 0  # of the current rollout's grpo_iterations updates
        self.history: list[dict] = []  # per batch: rewards, completions (probes, the summary)

    def load(self, base, problems, console) -> None:
        cfg = self.cfg
        if base is None:
            base = FT.load_base(cfg.model, cfg.backend) if cfg.model else \
                FT.builtin_base(cfg, console)
        if base.tokenizer is None:
            raise FinetuneConfigError(f"base {base.source} has no tokenizer: GRPO samples text")
        self.base, tok = base, base.tokenizer
        self.eos = tok.token_to_id(data_mod.EOS)
        self.stop_ids = newline_ids(tok, self.device) if cfg.stop_at_newline else None
        files = cfg.data or [str(shipped_toy_problems())]
        self.problems = problems if problems is not None else read_problems(files)
        self.files = files
        self.prompts = encode_prompts(self.problems, tok, self.eos, cfg.max_new_tokens,
                                      base.model.cfg.max_seq_len)
        if len(self.problems) < cfg.prompts_per_step:
            raise FinetuneConfigError(f"config field prompts_per_step={cfg.prompts_per_step}: "
                                      f"only {len(self.problems)} problem(s) in "
                                      f"{', '.join(files)}")
        # the examples the end-of-run samples print: prompt + canonical body as the reference
        self.train_ex = reference_examples(self.prompts, self.problems, tok)
        self.val_ex = []
        self.sampler = ProblemSampler(len(self.problems), cfg.prompts_per_step, cfg.epochs,
                                      cfg.seed)
        # max_steps null: `epochs` passes over the problems; set, the problems cycle as needed
        max_steps = cfg.max_steps if cfg.max_steps is not None else \
            cfg.epochs * self.sampler.steps_per_epoch * cfg.grpo_iterations
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else max_steps // 20
        check_warmup(max_steps, warmup)
        self.rcfg = replace(cfg, max_steps=max_steps, warmup_steps=warmup)
        self.dataset = _ProblemSet(files)

    def data_info(self) -> dict:
        return {"files": self.files, "kind": "grpo", "problems": len(self.problems),
                "batches_per_epoch": self.sampler.steps_per_epoch,
                "train": len(self.problems), "val": 0, "truncated": 0, "dropped": 0,
                "reward": self.cfg.reward, "reward_error": self.cfg.reward_error}

    def make_trainer(self) -> GrpoTrainer:
        return GrpoTrainer(self.model, self.rcfg, self.device, self.autocast, self.parts,
                           self.obj)

    # one batch -----------------------------------------------------------------------
    def make_rollout(self) -> Rollout:
        cfg, tok, model = self.cfg, self.base.tokenizer, self.model
        b, idx = self.sampler.next_batch()
        G = cfg.group_size
        seqs, masks, comps, toks, probs, tids = [], [], [], [], [], []
        for j, i in enumerate(idx):
            g = torch.Generator(device=self.device).manual_seed(rollout_seed(cfg.seed, b, j))
            outs = self.parts.sample_group(model, self.prompts[i], G, cfg.max_new_tokens,
                                           cfg.rollout_temperature, cfg.rollout_top_p, g,
                                           self.eos, self.stop_ids)
            for o in outs:
                seqs.append(self.prompts[i] + o)
                masks.append((len(self.prompts[i]), len(o)))
                toks.append(o)
                comps.append(data_mod.decode(tok, [t for t in o if t != self.eos]))
                probs.append(self.problems[i])
                tids.append(self.problems[i].task_id)
        S = max(len(s) for s in seqs)
        x = torch.full((len(seqs), S), self.eos, dtype=torch.long)
        m = torch.zeros((len(seqs), S - 1), dtype=torch.float32)
        for r, (s, (lp, lc)) in enumerate(zip(seqs, masks)):
            x[r, :len(s)] = torch.tensor(s)
            m[r, lp - 1:lp - 1 + lc] = 1.0  # target t+1 is read at position t
        x, m = x.to(self.device), m.to(self.device)
        scored = self.parts.score_rewards(self.reward, probs, comps, self.on_error)
        rewards = torch.tensor(scored.rewards, dtype=torch.float32, device=self.device)
        adv = (self.parts.group_advantages(rewards, G, ADV_EPS) if scored.errors == 0 or
               self.on_error is not None else torch.zeros_like(rewards))
        with self.trainer._autocast():
            old = policy_logps(model, x)
            ref = self.parts.reference_logps(model, x)
        return Rollout(x, m, rewards, adv, old, ref, comps, toks, tids, scored.errors,
                       scored.first_error, b)

    # the loop's hooks (falsify/llm/run_base.py) ----------------------------------------
    def make_progress(self) -> QuietProgress:
        return QuietProgress()  # record() logs each step's line, with its reward

    def next_micro(self) -> list:
        """The step's one micro-batch: the current rollout, sampled anew at the first of each
        batch's grpo_iterations updates."""
        self.iteration = self.trainer.step % self.cfg.grpo_iterations
        if self.iteration == 0:
            self.rollout = self.make_rollout()
            self.remember(self.rollout)
        return [self.rollout]

    def remember(self, ro: Rollout) -> None:
        """The batch into the history; reward failures are said, and stop the run before its
        update unless reward_error scores them."""
        cfg = self.cfg
        self.history.append({"batch": ro.batch, "rewards": ro.rewards.tolist(),
                             "tokens": ro.tokens, "task_ids": ro.task_ids,
                             "completions": ro.completions,
                             "errors": ro.errors, "first_error": ro.first_error})
        if not ro.errors:
            return
        what = ("stopping after this step" if self.on_error is None else
                f"scored {self.on_error} (reward_error={cfg.reward_error})")
        log.warning("batch %d: the reward function failed on %d of %d completions (first: %s); "
                    "%s", ro.batch, ro.errors, len(ro.completions), ro.first_error, what)
        if self.on_error is None:
            self.mf.write(json.dumps({"step": self.trainer.step + 1, "batch": ro.batch,
                                      "reward_errors": ro.errors,
                                      "first_reward_error": ro.first_error,
                                      "update": False}) + "\n")
            raise RW.RewardFailed(
                f"the reward function {cfg.reward} failed on {ro.errors} of "
                f"{len(ro.completions)} completions of batch {ro.batch} (first: "
                f"{ro.first_error}); no update was applied. Fix it, or set "
                "reward_error=score:<number> to score failures")

    def micro_tokens(self, st, micro: list) -> int:
        return int(micro[0].mask.sum())  # completion tokens

    def record(self, st, step_s: float, fetch_s: float, tps: float) -> None:
        ro, it = self.rollout, self.iteration
        rmean = float(ro.rewards.mean())
        if it == 0:
            self.result.rewards.append(rmean)
        r = self.result
        r.steps.append(st.step)
        r.losses.append(st.loss)
        r.grad_norms.append(st.grad_norm)
        r.lrs.append(st.lr)
        rw = ro.rewards
        # step_s counts the rollout too; rollout_s is the sampling and scoring alone
        rec = {"step": st.step, "loss": st.loss, "lr": st.lr, "grad_norm": st.grad_norm,
               "batch": ro.batch, "iteration": it, "reward_mean": rmean,
               "reward_std": float(rw.std()) if len(rw) > 1 else 0.0,
               "reward_errors": ro.errors, "first_reward_error": ro.first_error,
               "completion_tokens": int(ro.mask.sum()), "kl": st.extra["kl"],
               "clip_frac": st.extra["clip_frac"], "ratio_dev": st.extra["ratio_dev"],
               "step_s": step_s + fetch_s, "rollout_s": fetch_s, "tok_s": tps,
               "epoch": self.sampler.epoch}
        self.mf.write(json.dumps(rec) + "\n")
        if self.writes:
            log.info("step %d/%d  reward %.3f  loss %.4f  kl %.4f", st.step,
                     self.max_steps, rmean, st.loss, st.extra["kl"])

    def after_step(self, st, stop_after):
        # a checkpoint only between batches, so a resume re-samples nothing
        if (st.step % self.cfg.grpo_iterations) != 0:
            return False
        return super().after_step(st, stop_after)

class _ProblemSet:
    """What FinetuneRun reads of a dataset: its kind (for the summary)."""

    kind = "grpo"
    reward_weighted = False

    def __init__(self, files):
        self.files = files


def reward_summary(rewards: list[float]) -> dict:
    """Mean reward of the first and last k batches (k = a fifth of the run, 1..10)."""
    if not rewards:
        return {}
    k = max(1, min(10, len(rewards) // 5))
    return {"k": k, "first": sum(rewards[:k]) / k, "last": sum(rewards[-k:]) / k}
