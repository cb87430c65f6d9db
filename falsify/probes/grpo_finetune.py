"""Run functions for falsify/contracts/grpo-finetune-v1.yaml (`training`-kind checks).

Each builds the GRPO loop of falsify/llm/grpo.py on a tiny Transformer (2 layers, hidden 64,
vocab 512, context 64) with a byte-level BPE trained on the shipped toy problems' text, and a
cheap deterministic reward written here (no sandbox: seconds per check). The loop's swappable
pieces (sampler, reference and old log-probs, reward scoring) are looked up through the
harness at call time (`_bound`), so `falsify mutants` runs the loop with a mutant in place.
What each check compares against is computed outside the loop: a snapshot of the base, the
reference log-probs of fixed tokens before training, a second run, the reward rule re-applied
by the probe to the completions the loop recorded.
"""
from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

CONTRACT = "grpo-finetune-v1"
# the fine-tuning probes' tiny model, with a context long enough for a prompt and its completion
TINY = dict(max_seq_len=64)


def _bound(equation: str, backend: str):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract(CONTRACT), equation, backend)


def _parts(backend: str):
    from falsify.llm.grpo import GrpoParts

    return GrpoParts(sample_group=_bound("sample_group", backend),
                     reference_logps=_bound("reference_logps", backend),
                     old_logps=_bound("old_logps", backend),
                     score_rewards=_bound("score_rewards", backend))


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from falsify.llm import data as data_mod
    from falsify.llm.evaluate import load_problems
    from falsify.llm.grpo import shipped_toy_problems

    ps = load_problems(shipped_toy_problems())
    return data_mod.train_tokenizer([p.prompt + p.canonical_solution for p in ps] * 4, 512)


def _problems(n: int = 8):
    from falsify.llm.evaluate import load_problems
    from falsify.llm.grpo import shipped_toy_problems

    return load_problems(shipped_toy_problems())[:n]


def _base(seed: int, scale: float = 0.08):
    """The tiny Transformer with weights N(0, scale), norm gains in [0.5, 1.5] (far from the
    near-zero init, so the policy's choices differ from token to token)."""
    from falsify.llm.finetune_base import Base
    from falsify.probes.qlora_finetune import tiny_base

    return Base(tiny_base(seed, scale, **TINY), _tokenizer(), None, "probe tiny base", "memory")


# ---------------------------------------------------------------------------- rewards
def space_reward(prompt, completion, problem) -> float:
    """Fraction of the completion's characters that are spaces: learnable from token choice
    alone (the tokenizer, trained on code, has tokens of pure indentation), and cheap."""
    return completion.count(" ") / max(1, len(completion))


def fails(completion: str) -> bool:
    """Which completions `flaky_reward` raises on (the probe re-applies this rule)."""
    return len(completion) % 3 == 0


def flaky_reward(prompt, completion, problem) -> float:
    if fails(completion):
        raise ValueError(f"cannot score a completion of {len(completion)} characters")
    return space_reward(prompt, completion, problem)


def _config(out: str, seed: int, **kw):
    from falsify.llm.grpo import GrpoConfig

    d = dict(method="grpo", policy="qlora", lora_r=4, lora_alpha=8.0, group_size=4,
             prompts_per_step=2, max_new_tokens=6, max_steps=3, warmup_steps=0, lr=2e-2,
             lr_min=2e-3, kl_beta=0.04, reward="falsify.probes.grpo_finetune:space_reward",
             progress=False, sample_count=0, backend="torch", device="cpu", out_dir=out,
             threads=1, seed=seed)
    d.update(kw)
    return GrpoConfig.from_dict(d, source="contract check")


def _run(backend: str, seed: int = 0, before=None, **kw):
    """(run, result, error) of a GRPO run in a temporary directory; `before(run)` is called
    after the run is built and before its first step."""
    from falsify.llm import finetune as FT
    from falsify.llm import run as R
    from falsify.llm.grpo import GrpoRun
    from falsify.llm.rewards import RewardFailed

    # one thread: tiny matrices, and a loaded machine makes more threads much slower
    with R.torch_threads(1), tempfile.TemporaryDirectory(prefix="falsify-grpo-") as d:
        cfg = _config(str(Path(d) / "run"), seed, **kw)
        run = GrpoRun(cfg, FT.Objectives(), _parts(backend))
        run.open(None)
        run.load(_base(seed), _problems(), None)
        run.build()
        if before is not None:
            before(run)
        err, result = None, None
        try:
            result = run.loop(None, keep_model=True)
        except RewardFailed as e:
            err = str(e)
        metrics = [json.loads(x) for x in (run.out / "metrics.jsonl").read_text().splitlines()]
        return run, result, err, metrics


def _fixed_tokens(seed: int):
    import torch

    g = torch.Generator().manual_seed(seed + 99)
    return torch.randint(4, 512, (3, 24), generator=g)


# ------------------------------------------------------------------------- run functions
def frozen_reference_run(backend, dtype="float32", method="qlora", steps=4, seed=0):
    """The reference policy is the frozen base: after `steps` updates every base tensor is
    bit-identical, the reference log-probs of fixed tokens equal those taken before training
    bit for bit, and the policy's own log-probs moved (so the comparison has power)."""
    import torch

    from falsify.llm import lora_model as LM
    from falsify.llm.grpo import policy_logps

    x = _fixed_tokens(seed)
    seen = {}

    def before(run):
        seen["base"] = {k: v.detach().clone() for k, v in LM.base_tensors(run.model).items()}
        seen["ref0"] = run.parts.reference_logps(run.model, x)
        seen["pol0"] = policy_logps(run.model, x)

    run, _, _, _ = _run(backend, seed, before, policy=method, max_steps=steps)
    after = LM.base_tensors(run.model)
    ref1 = run.parts.reference_logps(run.model, x)
    pol1 = policy_logps(run.model, x)
    return {"changed": sorted(k for k, v in seen["base"].items()
                              if not torch.equal(v, after[k])),
            "ref_diff": float((ref1 - seen["ref0"]).abs().max()),
            "policy_moved": float((pol1 - seen["pol0"]).abs().max()),
            "ref0_is_policy0": bool(torch.equal(seen["ref0"], seen["pol0"]))}


def reference_base_run(backend, dtype="float32", method="qlora", steps=3, seed=0):
    """The reference is the frozen base once the policy has moved: after `steps` updates
    (B ≠ 0), on token sequences the run never sampled, the bound reference log-probs equal
    those of the un-adapted Transformer on the same base weights (NF4 dequantized by the numpy
    reference: falsify/probes/qlora_finetune.py's `plain_base`, which shares no layer, kernel or
    adapter switch with the loop), token by token within the op-order bound, while the policy's
    own log-probs differ from the base's by more than 10× it.

    Bound: the two models' logits differ by δ ≤ `op_order_tol`; a log-softmax value
    z_y − logsumexp(z) moves by ≤ 2δ when every logit moves by ≤ δ, and each side rounds its
    log-softmax over V terms to ≤ (V + 8)·u: tol = 2δ + 2·(V + 8)·u per token."""
    import torch

    from falsify.llm import lora_model as LM
    from falsify.llm.grpo import policy_logps, token_logps
    from falsify.probes.qlora_finetune import U32, op_order_tol, plain_base, tiny_base

    run, _, _, _ = _run(backend, seed, policy=method, max_steps=steps)
    x = _fixed_tokens(seed + 1)
    ref = run.parts.reference_logps(run.model, x)
    pol = policy_logps(run.model, x)
    base = plain_base(run.model, tiny_base(seed, 0.08, **TINY))
    with torch.no_grad():
        logits = base(x[:, :-1])
        want = token_logps(base, x)
    tol = 2 * op_order_tol(logits) + 2 * (logits.shape[-1] + 8) * U32
    b_max = max(float(p.detach().abs().max()) for k, p in LM.adapter_parameters(run.model).items()
                if ".lora_B." in k)
    return {"updates": run.trainer.step, "b_max": b_max,
            "ref_vs_base": float((ref - want).abs().max()),
            "policy_vs_base": float((pol - want).abs().max()), "tol": tol}


def old_logps_run(backend, dtype="float32", batches=2, iterations=2, seed=0):
    """π_old is taken once per batch, before its first update: the first update of every batch
    sees ratio exactly 1 (max |log π − log π_old| = 0 over the completion tokens), a later
    update on the same batch sees the moved policy against the unchanged π_old (> 0)."""
    _, _, _, metrics = _run(backend, seed, grpo_iterations=iterations,
                            max_steps=batches * iterations)
    steps = [m for m in metrics if "iteration" in m]
    first = [m["ratio_dev"] for m in steps if m["iteration"] == 0]
    later = [m["ratio_dev"] for m in steps if m["iteration"] > 0]
    return {"first_ratio_dev": max(first), "later_ratio_dev_min": min(later),
            "batches": len(first), "updates": len(steps)}


def determinism_run(backend, dtype="float32", steps=3, seed=0):
    """The same seed twice: the same samples, rewards and final adapter bit for bit; another
    seed: other samples (so identity is not vacuous)."""
    import torch

    from falsify.llm import lora_model as LM

    def once(s):
        run, _, _, _ = _run(backend, s, max_steps=steps)
        return ([h["tokens"] for h in run.history], [h["rewards"] for h in run.history],
                {k: v.detach().clone() for k, v in LM.adapter_parameters(run.model).items()})

    t1, r1, a1 = once(seed)
    t2, r2, a2 = once(seed)
    t3, _, _ = once(seed + 1)
    return {"samples_equal": t1 == t2, "rewards_equal": r1 == r2,
            "adapter_equal": all(torch.equal(a1[k], a2[k]) for k in a1),
            "other_seed_differs": t1 != t3, "completions": sum(len(b) for b in t1)}


def reward_error_run(backend, dtype="float32", steps=3, seed=0):
    """A raising reward: by default the failures of the batch are counted, the run stops with
    an error naming the first and applies no update; with reward_error=score:0 every failure
    is counted and scored exactly 0, and the run completes. The expected failures are the
    probe's own rule applied to the recorded completions."""
    from falsify.probes.grpo_finetune import fails

    flaky = "falsify.probes.grpo_finetune:flaky_reward"
    run, _, err, metrics = _run(backend, seed, reward=flaky, max_steps=steps)
    h = run.history[-1]
    expected = sum(fails(c) for c in h["completions"])
    stop = {"stopped": err is not None, "error_names_first": bool(err and "ValueError" in err),
            "updates_applied": run.trainer.step, "expected_first": expected,
            "counted_first": metrics[-1].get("reward_errors") if metrics else None}
    run2, _, err2, metrics2 = _run(backend, seed, reward=flaky, reward_error="score:0",
                                   max_steps=steps)
    exp2 = [sum(fails(c) for c in h["completions"]) for h in run2.history]
    got2 = [m["reward_errors"] for m in metrics2 if "iteration" in m]
    zero_scored = all(h["rewards"][i] == 0.0 for h in run2.history
                      for i, c in enumerate(h["completions"]) if fails(c))
    return {**stop, "score_completed": err2 is None and run2.trainer.step == steps,
            "expected_per_batch": exp2, "counted_per_batch": got2,
            "failed_scored_zero": zero_scored, "total_expected": sum(exp2)}


def update_direction_run(backend, dtype="float32", steps=4, seed=0):
    """Each update raises the log-likelihood of the completions with positive advantage
    relative to those with negative: per batch, the correlation between a completion's
    Δ Σ_t log π (after − before the update) and its advantage. The reward is 1 for a
    completion that starts with a space (about a quarter do at first)."""
    import torch

    from falsify.llm import finetune as FT
    from falsify.llm import run as R
    from falsify.llm.grpo import GrpoRun, policy_logps

    corr = []
    with R.torch_threads(1), tempfile.TemporaryDirectory(prefix="falsify-grpo-") as d:
        cfg = _config(str(Path(d) / "run"), seed, reward=f"{__name__}:lead_space_reward",
                      max_new_tokens=2, group_size=8, prompts_per_step=4, lr=5e-2,
                      kl_beta=0.0, max_steps=steps)
        run = GrpoRun(cfg, FT.Objectives(), _parts(backend))
        run.open(None)
        run.load(_base(seed), _problems(), None)
        run.build()
        for _ in range(steps):
            ro = run.make_rollout()
            run.trainer.train_step([ro])
            gain = ((policy_logps(run.model, ro.x) - ro.old_logp) * ro.mask).sum(1)
            # the probe's own scores of what was sampled, not the loop's
            r = torch.tensor([lead_space_reward(None, c, None) for c in ro.completions])
            corr.append(float(torch.corrcoef(torch.stack([gain, r]))[0, 1]))
    return {"corr": corr, "corr_mean": sum(corr) / len(corr)}


def lead_space_reward(prompt, completion, problem) -> float:
    return float(completion[:1] == " ")


def sampler_run(backend, dtype="float32", seed=0, temperature=0.5, top_p=0.8, n=4000,
                max_new=8):
    """The sampler against what it must draw from, computed here: the first tokens of n
    completions of one prompt, against softmax(topp(z/T)) of the model's own last-position
    logits in float64 (z from a full forward in eval mode, the nucleus cut by the same rule:
    the mass of the more likely tokens before a token already reaches top_p drops it). Every
    token's frequency within 6 binomial standard deviations of its probability (two-sided,
    about 2e-9 per token, 1e-6 over the vocabulary), every filtered token never drawn. Each
    block's forward records its mode and whether autograd is on (a sampler in train mode, or
    building graphs, is a different function or a training forward's memory), and the model's
    mode is back to what it was. A second call with stop tokens: each completion ends at its
    first stop token, which it keeps, or after max_new tokens, never with a token past it."""
    import numpy as np
    import torch

    from falsify.llm import data as data_mod
    from falsify.probes.qlora_finetune import tiny_base

    sample = _bound("sample_group", backend)
    model = tiny_base(seed, 0.08, **TINY)
    model.train()
    seen = []
    hooks = [b.register_forward_pre_hook(
        lambda mod, args: seen.append((mod.training, torch.is_grad_enabled())))
        for b in model.layers]
    prompt = data_mod.encode(_tokenizer(), _problems(1)[0].prompt)[-24:]

    model.eval()
    with torch.no_grad():
        z = model(torch.tensor([prompt]))[0, -1].double().numpy() / temperature
    model.train()
    seen.clear()
    order = np.argsort(-z, kind="stable")
    ps = np.exp(z[order] - z[order].max())
    ps /= ps.sum()
    before = np.cumsum(ps) - ps
    kept = order[before < top_p]
    p = np.zeros_like(z)
    p[kept] = np.exp(z[kept] - z[kept].max())
    p /= p.sum()

    g = torch.Generator().manual_seed(seed)
    first = [o[0] for o in sample(model, prompt, n, 1, temperature, top_p, g, 0)]
    f = np.bincount(first, minlength=z.size) / n
    sd = np.sqrt(np.maximum(p * (1 - p), 1e-300) / n)
    worst_z = float(np.max(np.where(p > 0, np.abs(f - p) / sd, 0.0)))
    filtered_drawn = int(np.count_nonzero((p == 0) & (f > 0)))
    forwards = len(seen)
    train_fw, grad_fw = sum(t for t, _ in seen), sum(on for _, on in seen)
    restored = model.training

    stops = [int(t) for t in kept[:3]]  # likely tokens, so completions often stop early
    g = torch.Generator().manual_seed(seed + 1)
    outs = sample(model, prompt, 64, max_new, temperature, top_p, g, 0, torch.tensor(stops))
    stop_set = set(stops) | {0}
    well_ended = all(len(o) <= max_new and not (set(o[:-1]) & stop_set)
                     and (len(o) == max_new or o[-1] in stop_set) for o in outs)
    for h in hooks:
        h.remove()
    return {"worst_z": worst_z, "filtered_drawn": filtered_drawn, "kept": int(kept.size),
            "vocab": int(z.size), "cut_margin": float(np.min(np.abs(before - top_p))),
            "forwards": forwards, "train_mode_forwards": int(train_fw),
            "grad_forwards": int(grad_fw), "mode_restored": bool(restored),
            "well_ended": well_ended, "stopped_early": sum(len(o) < max_new for o in outs),
            "ran_full": sum(len(o) == max_new for o in outs)}
