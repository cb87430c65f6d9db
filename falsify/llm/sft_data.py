"""Fine-tuning data: JSONL records -> token ids with a per-token loss mask -> padded batches.

Formats, detected per file from the first record and then required on every line (a file that
mixes formats is an error naming the first line that differs):

    {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}
    {"prompt": ..., "response": ...}         (also "instruction" in place of "prompt")
    {"text": ...}                            (loss on every token)
    any of the three with "reward" or "score": a number -> reward-weighted SFT
    {"prompt": ..., "chosen": ..., "rejected": ...}   -> DPO preference pairs

Unknown keys are an error naming the file, line and key: a misspelt "rewrad" must not silently
turn reward-weighted SFT into plain SFT. Only the metadata keys in `META_KEYS` are ignored.

Limits (each a DataError naming file:line): a record is one line of at most MAX_RECORD_BYTES
(1 MiB) of UTF-8, nested at most data.MAX_JSON_DEPTH (64) levels; files are read a line at a
time, so memory stays bounded whatever the file holds.

Token layout of one example (the pretraining stream puts <|endoftext|> between documents, so the
same token opens and closes a sample):

    ids  = [EOS] + prompt + response + [EOS]
    mask[i] = True where ids[i] is a trained target (response tokens and the closing EOS; every
              token after the first with train_on_prompt)

The model reads ids[:-1] and is trained to predict ids[1:], so the loss mask of input position t
is mask[t + 1]: the LAST prompt position is the one that predicts the first response token.
Prompt and response are tokenized separately and concatenated, so the boundary is exact (a BPE
merge across it would blur which token belongs to which part). The price: a boundary inside a
whitespace run tokenizes differently from the joined text, so start the response with the
whitespace ("…\"\"\"" | "\n    return x") rather than end the prompt with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from falsify.llm.data import EOS, DataError, encode, iter_jsonl

IGNORE_INDEX = -100
# One record (one JSONL line) at most: an example is cut to seq_len tokens anyway, and a record
# is tokenized whole first, so a 50 MB line would cost gigabytes before being truncated.
MAX_RECORD_BYTES = 2**20
META_KEYS = frozenset({"id", "source", "meta", "metadata"})
REWARD_KEYS = ("reward", "score")
CHAT_ROLES = ("system", "user", "assistant")
# Our tokenizers have no chat special tokens, so a chat is rendered as plain text with one
# header line per turn. Only the content of assistant turns (and the closing EOS) is trained.
CHAT_HEADER = "<|{role}|>\n"
CHAT_TURN_END = "\n"

SHIPPED_DATASET = Path(__file__).resolve().parent / "sft" / "stdlib-docstrings.jsonl"

FORMATS = ("chat", "prompt_response", "text", "preference")


@dataclass
class SFTExample:
    ids: list[int]
    mask: list[bool]  # mask[i]: ids[i] is a trained target (mask[0] is always False)
    reward: float | None = None
    source: str = ""  # "file:line" for error messages and the sample printout


@dataclass
class PreferenceExample:
    chosen: SFTExample  # prompt + chosen; mask on the chosen response
    rejected: SFTExample  # prompt + rejected; mask on the rejected response
    source: str = ""


@dataclass
class RawRecord:
    kind: str  # one of FORMATS
    fields: dict
    reward: float | None
    source: str


@dataclass
class Dataset:
    """Tokenized examples of one or more files, all of one kind (SFT or preference)."""

    kind: str  # "sft" or "preference"
    examples: list
    files: list[str]
    formats: dict[str, str]  # file -> detected format
    reward_weighted: bool
    stats: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------- parsing
def _kind_of(rec: dict, where: str) -> str:
    keys = set(rec) - META_KEYS - set(REWARD_KEYS)
    if "messages" in keys:
        kind, allowed = "chat", {"messages"}
    elif "chosen" in keys or "rejected" in keys:
        kind, allowed = "preference", {"prompt", "chosen", "rejected"}
    elif "response" in keys:
        kind, allowed = "prompt_response", {"prompt", "instruction", "response"}
    elif "text" in keys:
        kind, allowed = "text", {"text"}
    else:
        raise DataError(f"{where}: cannot tell the format: expected a 'messages', "
                        "'prompt'/'instruction' + 'response', 'text', or 'prompt' + 'chosen' + "
                        f"'rejected' record, got keys {sorted(rec)}")
    unknown = sorted(keys - allowed)
    if unknown:
        raise DataError(f"{where}: unknown key {unknown[0]!r} in a {kind} record (allowed: "
                        f"{', '.join(sorted(allowed | set(REWARD_KEYS) | META_KEYS))})")
    return kind


def _need_str(rec: dict, key: str, where: str, allow_empty: bool = False) -> str:
    v = rec.get(key)
    if not isinstance(v, str):
        raise DataError(f"{where}: field {key!r} must be a string, got "
                        f"{type(v).__name__ if key in rec else 'nothing'}")
    if not allow_empty and not v:
        raise DataError(f"{where}: field {key!r} is empty")
    return v


def parse_record(rec, where: str) -> RawRecord:
    """Validate one decoded JSON line; every error names `where` ("file:line") and the field."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    kind = _kind_of(rec, where)
    present = [k for k in REWARD_KEYS if k in rec]
    if len(present) > 1:
        raise DataError(f"{where}: both 'reward' and 'score' given; use one")
    reward = None
    if present:
        if kind == "preference":
            raise DataError(f"{where}: field {present[0]!r} is not used by preference pairs "
                            "(DPO learns from the pair itself)")
        v = rec[present[0]]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise DataError(f"{where}: field {present[0]!r} must be a finite number, got {v!r}")
        reward = float(v)
    f: dict = {}
    if kind == "chat":
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: 'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or set(m) - {"role", "content"}:
                raise DataError(f"{where}: messages[{i}] must be an object with only 'role' and "
                                "'content'")
            if m.get("role") not in CHAT_ROLES:
                raise DataError(f"{where}: messages[{i}].role={m.get('role')!r}: must be one of "
                                f"{', '.join(CHAT_ROLES)}")
            _need_str(m, "content", f"{where}: messages[{i}]", allow_empty=True)
        if not any(m["role"] == "assistant" and m["content"] for m in msgs):
            raise DataError(f"{where}: no non-empty assistant message: nothing to train on")
        f["messages"] = msgs
    elif kind == "prompt_response":
        if ("prompt" in rec) == ("instruction" in rec):
            raise DataError(f"{where}: give exactly one of 'prompt' or 'instruction'")
        f["prompt"] = _need_str(rec, "prompt" if "prompt" in rec else "instruction", where)
        f["response"] = _need_str(rec, "response", where)
    elif kind == "text":
        f["text"] = _need_str(rec, "text", where)
    else:
        for k in ("prompt", "chosen", "rejected"):
            f[k] = _need_str(rec, k, where)
        if f["chosen"] == f["rejected"]:
            raise DataError(f"{where}: 'chosen' and 'rejected' are identical: the pair carries "
                            "no preference")
    return RawRecord(kind, f, reward, where)


def read_jsonl(path: str | Path) -> list[RawRecord]:
    """All records of one file; one format per file, and reward on all lines or none."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "is not a regular file" if path.exists() \
            else "does not exist"
        raise DataError(f"data file {str(path)!r} {what}")
    out: list[RawRecord] = []
    for n, rec in iter_jsonl(path, MAX_RECORD_BYTES, what="record"):
        where = f"{path}:{n}"
        r = parse_record(rec, where)
        if out and r.kind != out[0].kind:
            raise DataError(f"{where}: a {r.kind} record in a file whose first record "
                            f"({out[0].source}) is {out[0].kind}; one format per file")
        if out and (r.reward is None) != (out[0].reward is None):
            if r.reward is None:
                raise DataError(f"{where}: no 'reward'/'score' although the file's first "
                                f"record ({out[0].source}) has one; a reward-weighted "
                                "file needs a reward on every line")
            raise DataError(f"{where}: a 'reward'/'score' although the file's first record "
                            f"({out[0].source}) has none; give a reward on every line "
                            "or on none")
        out.append(r)
    if not out:
        raise DataError(f"data file {str(path)!r} holds no records")
    return out


# ---------------------------------------------------------------------------- tokenizing
def _segments(r: RawRecord) -> list[tuple[str, bool]]:
    """(text, trained?) pieces of an SFT record, in order."""
    f = r.fields
    if r.kind == "prompt_response":
        return [(f["prompt"], False), (f["response"], True)]
    if r.kind == "text":
        return [(f["text"], True)]
    segs = []
    for m in f["messages"]:
        segs.append((CHAT_HEADER.format(role=m["role"]), False))
        if m["content"]:
            segs.append((m["content"], m["role"] == "assistant"))
        segs.append((CHAT_TURN_END, False))
    return segs


def _example(tok, eos: int, segs: list[tuple[str, bool]], train_on_prompt: bool,
             reward: float | None, source: str) -> SFTExample:
    ids, mask = [eos], [False]
    for text, trained in segs:
        t = encode(tok, text)
        ids += t
        mask += [trained or train_on_prompt] * len(t)
    ids.append(eos)
    mask.append(True)  # the closing EOS teaches the model where a response ends
    return SFTExample(ids, mask, reward, source)


def tokenize(records: list[RawRecord], tok, train_on_prompt: bool = False) -> list:
    eos = tok.token_to_id(EOS)
    if eos is None:
        raise DataError(f"the tokenizer has no {EOS!r} token (needed to separate samples)")
    out = []
    for r in records:
        if r.kind == "preference":
            f = r.fields
            p = [(f["prompt"], False)]
            out.append(PreferenceExample(
                _example(tok, eos, p + [(f["chosen"], True)], train_on_prompt, None, r.source),
                _example(tok, eos, p + [(f["rejected"], True)], train_on_prompt, None,
                         r.source), r.source))
        else:
            out.append(_example(tok, eos, _segments(r), train_on_prompt, r.reward, r.source))
    return out


def fit_length(examples: list, seq_len: int, overlong: str) -> tuple[list, dict]:
    """Examples must fit seq_len model positions (seq_len + 1 tokens). `overlong`: truncate
    (keep the first seq_len + 1 tokens; an example left with no trained target is dropped),
    drop, or error. Returns the kept examples and counts, which the run reports."""
    if overlong not in ("truncate", "drop", "error"):
        raise DataError(f"overlong={overlong!r}: must be truncate, drop or error")
    kept, truncated, dropped = [], 0, 0
    cap = seq_len + 1
    for e in examples:
        parts = [e.chosen, e.rejected] if isinstance(e, PreferenceExample) else [e]
        if all(len(p.ids) <= cap for p in parts):
            kept.append(e)
            continue
        if overlong == "error":
            longest = max(len(p.ids) for p in parts)
            raise DataError(f"{e.source}: {longest} tokens > seq_len + 1 = {cap} "
                            "(set overlong=truncate or drop, or a larger seq_len)")
        if overlong == "drop":
            dropped += 1
            continue
        for p in parts:
            p.ids, p.mask = p.ids[:cap], p.mask[:cap]
        if all(any(p.mask[1:]) for p in parts):
            kept.append(e)
            truncated += 1
        else:
            dropped += 1
    return kept, {"truncated": truncated, "dropped": dropped}


def load_dataset(files: list[str | Path], tok, seq_len: int, train_on_prompt: bool = False,
                 overlong: str = "truncate") -> Dataset:
    if not files:
        raise DataError("no data files given")
    records, formats = [], {}
    for f in files:
        recs = read_jsonl(f)
        formats[str(f)] = ("reward_" if recs[0].reward is not None else "") + recs[0].kind
        if records and (recs[0].kind == "preference") != (records[0].kind == "preference"):
            raise DataError(f"{f}: preference pairs (DPO) and SFT records cannot be mixed in one "
                            f"run ({records[0].source} is {records[0].kind})")
        if records and (recs[0].reward is None) != (records[0].reward is None):
            raise DataError(f"{f}: reward-weighted and plain SFT files cannot be mixed in one "
                            f"run ({records[0].source} vs {recs[0].source})")
        records += recs
    kind = "preference" if records[0].kind == "preference" else "sft"
    examples = tokenize(records, tok, train_on_prompt)
    examples, fit = fit_length(examples, seq_len, overlong)
    if not examples:
        raise DataError(f"no example of {', '.join(map(str, files))} fits seq_len={seq_len}")
    return Dataset(kind, examples, [str(f) for f in files], formats,
                   records[0].reward is not None,
                   {"records": len(records), "examples": len(examples), **fit})


# ------------------------------------------------------------------------------- rewards
def reward_weights(rewards: torch.Tensor) -> torch.Tensor:
    """Reward-weighted SFT (llama.cpp Phase 2): clip to [−1, 1], then min-max scale over the
    epoch's rewards to [0, 1]; weight 0 = the sample is ignored, 1 = plain SFT. Min-max is
    undefined when every clipped reward is equal, and no value is a safe guess there (all 0
    would train nothing, all 1 would ignore the field): that is an error."""
    r = rewards.double().clamp(-1.0, 1.0)
    lo, hi = r.min(), r.max()
    if not bool(hi > lo):
        raise DataError(f"reward-weighted SFT: every reward is {float(lo):g} after clipping to "
                        "[-1, 1], so min-max scaling is undefined; drop the reward field for "
                        "plain SFT")
    return ((r - lo) / (hi - lo)).to(rewards.dtype)


# ------------------------------------------------------------------------------ batching
@dataclass
class Batch:
    """One micro-batch. Position t reads x[:, t] and predicts labels[:, t]."""

    x: torch.Tensor  # [b, s] int64 inputs (pad: EOS)
    labels: torch.Tensor  # [b, s] int64 next-token ids; IGNORE_INDEX at padding only
    mask: torch.Tensor  # [b, s] bool: labels[:, t] is a trained target
    weights: torch.Tensor  # [b] float32 reward weights (1 without rewards)
    index: torch.Tensor  # [b] int64 example indices (DPO reference cache, debugging)

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())

    def targets(self) -> torch.Tensor:
        """labels with IGNORE_INDEX wherever no loss is taken (for plain masked CE)."""
        return self.labels.masked_fill(~self.mask, IGNORE_INDEX)

    def to(self, device) -> Batch:
        return Batch(*(t.to(device) for t in (self.x, self.labels, self.mask, self.weights,
                                               self.index)))


def collate(examples: list[SFTExample], pad_id: int, weights=None, index=None) -> Batch:
    """Right-pad to the longest example. Causal attention never lets a position see the padding
    to its right, so padding changes no real position's logits; its labels are IGNORE_INDEX."""
    s = max(len(e.ids) for e in examples) - 1
    b = len(examples)
    x = torch.full((b, s), pad_id, dtype=torch.long)
    labels = torch.full((b, s), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((b, s), dtype=torch.bool)
    for i, e in enumerate(examples):
        n = len(e.ids) - 1
        ids = torch.tensor(e.ids, dtype=torch.long)
        x[i, :n] = ids[:-1]
        labels[i, :n] = ids[1:]
        mask[i, :n] = torch.tensor(e.mask[1:], dtype=torch.bool)
    w = torch.ones(b) if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    idx = torch.arange(b) if index is None else torch.as_tensor(index, dtype=torch.long)
    return Batch(x, labels, mask, w, idx)


class ExampleSampler:
    """Seeded, resumable batches of whole examples, the fine-tuning analogue of
    data.BatchSampler: epoch e visits the examples in the order of
    default_rng([seed, e]).permutation (or in file order with shuffle off); an epoch is exactly
    floor(n / (batch_size · grad_accum)) optimizer steps, the remainder is dropped. The position
    (epoch, step in epoch) is the whole state."""

    def __init__(self, n: int, batch_size: int, grad_accum: int, epochs: int, seed: int,
                 shuffle: bool, data_key: str = ""):
        self.n, self.batch_size, self.grad_accum = n, batch_size, grad_accum
        self.epochs, self.seed, self.shuffle, self.data_key = epochs, seed, shuffle, data_key
        self.steps_per_epoch = n // (batch_size * grad_accum)
        self.epoch, self.step_in_epoch = 0, 0

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next_step(self) -> list[np.ndarray]:
        """grad_accum arrays of batch_size example indices."""
        if self.steps_per_epoch == 0 or self.epoch >= self.epochs:
            raise StopIteration(f"data exhausted after {self.epochs} epoch(s) of "
                                f"{self.steps_per_epoch} steps")
        per = self.batch_size * self.grad_accum
        idx = self.order(self.epoch)[self.step_in_epoch * per:(self.step_in_epoch + 1) * per]
        self.step_in_epoch += 1
        if self.step_in_epoch == self.steps_per_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
        return [idx[m * self.batch_size:(m + 1) * self.batch_size]
                for m in range(self.grad_accum)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "n": self.n,
                "seed": self.seed, "batch_size": self.batch_size, "grad_accum": self.grad_accum,
                "shuffle": self.shuffle, "data_key": self.data_key}

    def load_state_dict(self, state: dict) -> None:
        for k in ("n", "seed", "batch_size", "grad_accum", "shuffle", "data_key"):
            if state[k] != getattr(self, k):
                raise DataError(f"cannot restore the data position: {k} was {state[k]!r} when "
                                f"the checkpoint was written, is {getattr(self, k)!r} now")
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])


def split_examples(examples: list, val_split: float, seed: int) -> tuple[list, list]:
    """A seeded val_split fraction held out (at least one example when val_split > 0)."""
    if not 0.0 <= val_split < 1.0:
        raise DataError(f"val_split={val_split}: must be in [0, 1)")
    if val_split == 0:
        return list(examples), []
    n = len(examples)
    n_val = max(1, int(round(n * val_split)))
    if n_val >= n:
        raise DataError(f"val_split={val_split} of {n} examples leaves nothing to train on")
    perm = np.random.default_rng([seed, 991]).permutation(n)
    val_idx = set(perm[:n_val].tolist())
    return ([e for i, e in enumerate(examples) if i not in val_idx],
            [e for i, e in enumerate(examples) if i in val_idx])
