"""Evaluation of a causal LM on code: held-out perplexity and functional correctness (pass@k).

The problem set (`evalset/code-problems.jsonl`, 40 problems written for this project, so no
model here has seen them: they are not in the stdlib corpus or the shipped SFT set) gives each
problem a prompt (signature and docstring), an entry point, a canonical body and a `check`
function of asserts. A completion passes when prompt + completion + check runs to exit 0 in the
sandbox (falsify/llm/sandbox.py).

pass@k is the unbiased estimator of Chen et al. (2021), "Evaluating Large Language Models
Trained on Code": with n samples of which c pass, pass@k = 1 − C(n−c, k) / C(n, k), averaged
over problems, computed as the product 1 − Π_{i=n−c+1}^{n} (1 − k/i), which never forms the
binomials (they overflow a float64 from n ≈ 1030).

Perplexity is exp of the token-weighted mean negative log-likelihood over the held-out texts
(by default the problems' prompts with their canonical bodies), each text preceded by
<|endoftext|> as in training, in windows of the model's context.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from falsify.llm import data as data_mod
from falsify.llm.model import Transformer, generate
from falsify.llm.sandbox import Limits, run_python

KEYS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
MAX_PROBLEMS_BYTES = 8 << 20


class EvalError(ValueError):
    """Bad evaluation input (a problem file, a setting): one line naming the file and line."""


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str


def shipped_problems() -> Path:
    return Path(str(resources.files("falsify.llm") / "evalset" / "code-problems.jsonl"))


def load_problems(path: str | Path | None = None) -> list[Problem]:
    path = Path(path) if path is not None else shipped_problems()
    if not path.is_file():
        raise EvalError(f"{path}: no such file")
    if path.stat().st_size > MAX_PROBLEMS_BYTES:
        raise EvalError(f"{path}: larger than {MAX_PROBLEMS_BYTES >> 20} MiB")
    out, seen = [], set()
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            lines = f.read().splitlines()
        except UnicodeDecodeError as e:
            raise EvalError(f"{path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise EvalError(f"{path}:{i}: not a JSON object ({str(e)[:80]})") from None
        if not isinstance(rec, dict) or set(rec) != set(KEYS):
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise EvalError(f"{path}:{i}: a problem has exactly the keys {', '.join(KEYS)} "
                            f"(got {got})")
        bad = [k for k in KEYS if not isinstance(rec[k], str) or not rec[k]]
        if bad:
            raise EvalError(f"{path}:{i}: {bad[0]} must be a non-empty string")
        if rec["task_id"] in seen:
            raise EvalError(f"{path}:{i}: task_id {rec['task_id']!r} repeats")
        seen.add(rec["task_id"])
        out.append(Problem(**rec))
    if not out:
        raise EvalError(f"{path}: no problems")
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem (module docstring); contract pass-at-k-kernel-v1."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        # a float count (5.0) or a bool is a caller's bug, not a sample count
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"pass_at_k: {name} must be an integer, got {v!r}")
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def program(p: Problem, body: str) -> str:
    return f"{p.prompt}{body}\n\n{p.test}\n\ncheck({p.entry_point})\n"


def truncate(completion: str) -> str:
    """The function body a completion gives: it ends at the first line that is not indented
    (the next top-level statement) once the body has begun."""
    lines = completion.split("\n")
    keep = []
    for i, line in enumerate(lines):
        if i > 0 and line and not line[0].isspace():
            break
        keep.append(line)
    return "\n".join(keep)


def check_harness(problems: list[Problem], limits: Limits) -> dict:
    """The harness can tell right from wrong on this machine: every canonical body passes and
    every `return None` body fails. A sandbox that failed everything (a missing library, a
    too-tight limit) would otherwise report a model's pass@k as 0."""
    right = sum(run_python(program(p, p.canonical_solution), limits).passed for p in problems)
    wrong = sum(run_python(program(p, "    return None\n"), limits).passed for p in problems)
    return {"canonical_pass": right, "wrong_pass": wrong, "problems": len(problems)}


@torch.no_grad()
def perplexity(model: Transformer, tok, texts: list[str]) -> dict:
    model.eval()
    dev = next(model.parameters()).device
    eos = tok.token_to_id(data_mod.EOS)
    total, count = 0.0, 0
    win = model.cfg.max_seq_len
    for text in texts:
        ids = [eos] + data_mod.encode(tok, text)
        for start in range(0, len(ids) - 1, win):
            chunk = torch.tensor([ids[start:start + win + 1]], device=dev)
            s, n = model.loss_sum(chunk[:, :-1], chunk[:, 1:])
            total += float(s)
            count += n
    nll = total / max(1, count)
    return {"nll": nll, "perplexity": math.exp(nll), "tokens": count}


@torch.no_grad()
def sample_completions(model: Transformer, tok, p: Problem, n: int, max_new: int,
                       temperature: float, top_k: int | None, seed: int
                       ) -> tuple[list[str], bool]:
    """n completions of the prompt. A prompt that leaves fewer than `max_new` tokens of the
    context conditions on its last ctx − max_new tokens (the program still gets the whole
    prompt); the flag says whether this one did."""
    eos = tok.token_to_id(data_mod.EOS)
    ids = [eos] + data_mod.encode(tok, p.prompt)
    ctx = model.cfg.max_seq_len
    max_new = min(max_new, ctx // 2)
    truncated = len(ids) + max_new > ctx
    if truncated:
        ids = ids[len(ids) + max_new - ctx:]
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.tensor([ids] * n, device=dev)
    out = generate(model, x, max_new, temperature, top_k, gen, stop_id=eos)
    texts = []
    for row in out[:, len(ids):].tolist():
        cut = row.index(eos) if eos in row else len(row)
        texts.append(truncate(data_mod.decode(tok, row[:cut])))
    return texts, truncated


def pass_at_ks(counts: list[tuple[int, int]], ks: list[int]) -> dict[int, float]:
    return {k: sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks}


def evaluate_code(model: Transformer, tok, problems: list[Problem], n: int, ks: list[int],
                  max_new: int, temperature: float, top_k: int | None, seed: int,
                  limits: Limits, progress=None) -> dict:
    """pass@k for each k, with each problem's count of passing samples."""
    rows = []
    for i, p in enumerate(problems):
        comps, cut = sample_completions(model, tok, p, n, max_new, temperature, top_k, seed + i)
        results = [run_python(program(p, c), limits) for c in comps]
        rows.append({"task_id": p.task_id, "n": n, "c": sum(r.passed for r in results),
                     "statuses": [r.status for r in results], "first": comps[0],
                     "prompt_truncated": cut})
        if progress is not None:
            progress(i + 1, len(problems))
    scores = pass_at_ks([(r["n"], r["c"]) for r in rows], ks)
    return {"pass_at_k": {str(k): v for k, v in scores.items()}, "problems": rows,
            "prompts_truncated": sum(r["prompt_truncated"] for r in rows)}
