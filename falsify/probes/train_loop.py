"""Run functions for falsify/contracts/train-loop-v1.yaml (`training`-kind checks of the pretraining
loop: falsify/llm/run.py, falsify/llm/run_base.py and falsify/llm/trainer.py) and the
reference-loop parity harness that tests/test_reference_loop.py also uses.

Every run drives the real loop (Trainer, train(), run_steps, resume_equivalence) on the tiny
synthetic config (2 layers, hidden 64, vocab 512, seq 32: small enough that a 100-step run fits
in a check) with the loop's swappable pieces (falsify/llm/trainer.LoopParts: optimizer builder,
gradient clip, micro-batch divisors, batch sampler, config algebra, resume position) looked up
through the harness at call time (`parts`), so when `falsify mutants` swaps a binding the loop
under test runs the mutant. Each compares against something the loop did not compute: the config
it was given, the model's own parameter list, the numpy float64 reference loop, one full batch,
an uninterrupted run, a second run, the meta-device model, bytes counted by the torch profiler.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from pathlib import Path

import numpy as np

from falsify.probes import device, watch_evaluation

CONTRACT = "train-loop-v1"

# Hyperparameters of the shared 100-step run, every one different from torch.optim.AdamW's
# defaults (betas (0.9, 0.999), eps 1e-8, weight_decay 0.01) so a silent default is visible.
HYPER = dict(beta1=0.85, beta2=0.95, adam_eps=1e-7, weight_decay=0.05, lr=3e-3, lr_min=3e-4)


# ------------------------------------------------------------------------------ bindings
def _bound(equation: str):
    from falsify.harness import backends, runtime

    # The loop pieces are backend-independent Python/torch code: their `torch` binding serves
    # both model backends (triton only changes the model's kernels).
    return backends.function(runtime.contract(CONTRACT), equation, "torch")


def _bound_ref(equation: str) -> str:
    from falsify.harness import backends, runtime

    return backends.binding_ref(runtime.contract(CONTRACT), equation, "torch")[0]


LOOP_EQUATIONS = {"optimizer": "build_optimizer", "clip": "clip_gradients",
                  "accumulation": "micro_batch_divisors", "data_order": "sampler",
                  "config_algebra": "check_config_algebra", "resume": "restore_position",
                  "evaluation": "evaluate"}


def parts():
    """falsify/llm/trainer.LoopParts with every piece taken from the contract's current bindings."""
    from falsify.llm.trainer import LoopParts

    return LoopParts(**{field: _bound(eq) for eq, field in LOOP_EQUATIONS.items()})


_MEMO: dict = {}


def _memo(key: tuple, fn):
    """Several checks read the same 100-step run; the key holds the binding of every loop piece,
    so a run with a mutant bound is never answered from a run without it."""
    key = key + tuple(_bound_ref(eq) for eq in LOOP_EQUATIONS)
    if key not in _MEMO:
        _MEMO[key] = fn()
    return _MEMO[key]


def _placement(backend: str) -> dict:
    """Config overrides that run the loop on the check's backend and that backend's device;
    left to `auto`, a GPU machine would run the triton backend on CUDA under a torch check."""
    return {"backend": backend, "device": device(backend)}


def _steps_run(steps: int, seed: int, backend: str) -> dict:
    from falsify.llm import run as RUN

    return _memo(("run_steps", steps, seed, backend),
                 lambda: RUN.run_steps(steps=steps, seed=seed, parts=parts(), **HYPER,
                                       **_placement(backend)))


def _finite(xs) -> bool:
    return all(math.isfinite(x) for x in xs)


# ------------------------------------------------------------------- stability, flow, ...
def stability_run(backend, dtype="float32", steps=100, seed=0):
    """TL-STB-001: loss, pre-clip global gradient norm (finite ⇔ every gradient element is,
    short of overflow) and parameters finite after every one of `steps` steps; the Trainer's
    Andon stop would end the run early, so the number of steps is part of the result."""
    r = _steps_run(steps, seed, backend)
    return {"steps": len(r["losses"]), "loss_finite": _finite(r["losses"]),
            "grad_finite": _finite(r["grad_norms"]), "params_finite": all(r["params_finite"]),
            "max_grad_norm": max(r["grad_norms"]), "max_loss": max(r["losses"])}


def gradient_flow_run(backend, dtype="float32", steps=100, seed=0):
    """TL-GRD-001: after step 1 every parameter of the model (from the model, not from the
    optimizer) has a gradient with max |g| > 0, every one is in exactly one optimizer group,
    and every one changed over the run."""
    from falsify.llm import config as LC
    from falsify.llm import run as RUN
    from falsify.llm.model import param_tensor_count

    r = _steps_run(steps, seed, backend)
    in_opt = [n for g in r["optimizer_groups"] for n in g["param_names"]]
    mcfg = LC.model_config(RUN.tiny_config("unused"))
    return {"n_params": len(r["grad_flow"]), "n_expected": param_tensor_count(mcfg),
            "min_grad": min(r["grad_flow"].values()),
            "zero_grad": [n for n, v in r["grad_flow"].items() if not v > 0],
            "not_in_optimizer": sorted(set(r["grad_flow"]) - set(in_opt)),
            "in_optimizer_twice": len(in_opt) - len(set(in_opt)),
            "unchanged": [n for n, c in r["params_changed"].items() if not c]}


def hyperparameter_run(backend, dtype="float32", steps=100, seed=0):
    """TL-HYP-001: every optimizer group holds the configured lr (the schedule's value of the
    last update), betas, eps; the decay group holds weight_decay and exactly the projection
    matrices, the no-decay group 0 and exactly the norm gains and the embedding."""
    from falsify.llm import trainer as TR

    r = _steps_run(steps, seed, backend)
    groups = r["optimizer_groups"]
    cfg = r["config"]["train"]
    lr_last = TR.lr_at(steps - 1, cfg["lr"], cfg["lr_min"], cfg["warmup_steps"], steps)
    bad = []
    for g in groups:
        for key, want in (("betas", [cfg["beta1"], cfg["beta2"]]), ("eps", cfg["adam_eps"]),
                          ("lr", lr_last)):
            if g[key] != want:
                bad.append(f"group {g.get('name')}: {key}={g[key]} but configured {want}")
        norms_or_embed = [n for n in g["param_names"]
                          if n.endswith("norm.weight") or n == "embed_tokens.weight"]
        if g["weight_decay"] == 0.0:
            wrong = sorted(set(g["param_names"]) - set(norms_or_embed))
        elif g["weight_decay"] == cfg["weight_decay"]:
            wrong = norms_or_embed
        else:
            wrong = [f"weight_decay={g['weight_decay']} (configured {cfg['weight_decay']})"]
        bad += [f"group {g.get('name')}: {w}" for w in wrong]
    return {"mismatches": bad, "n_groups": len(groups),
            "n_no_decay": sum(len(g["param_names"]) for g in groups
                              if g["weight_decay"] == 0.0)}


def convergence_run(backend, dtype="float32", steps=100, seed=0):
    """TL-CNV-001: the loss of the tiny model on the synthetic Markov corpus over `steps`."""
    r = _steps_run(steps, seed, backend)
    losses = r["losses"]
    return {"first": losses[0], "last10": float(np.mean(losses[-10:])), "steps": len(losses),
            "ln_vocab": math.log(r["config"]["model"]["vocab_size"])}


# ------------------------------------------------------------------------- config algebra
def config_algebra_run(backend, dtype="float32", epochs=3):
    """TL-CFG-001 on the real loop: (1) a config whose max_steps needs `epochs` epochs runs
    exactly max_steps steps, crossing epoch boundaries; (2) the same data with one epoch too few
    is refused by preflight before step 1 (no metrics written), the message naming the
    achievable steps and the epochs needed; (3) warmup 2000 with 43 steps per epoch is refused."""
    from falsify.llm import config as LC
    from falsify.llm import data as D
    from falsify.llm import preflight as PF
    from falsify.llm import run as RUN

    p = parts()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = RUN.tiny_config(Path(tmp) / "probe", synthetic_tokens=6_000, val_fraction=0.0,
                              max_steps=1, warmup_steps=0)
        mcfg = LC.model_config(probe)
        data = D.prepare_data(RUN.data_spec(probe, mcfg.vocab_size), probe.cache_dir)
        stream = D.token_stream(data.train, data.special_ids[D.EOS])
        spe = D.steps_per_epoch(D.num_blocks(len(stream), mcfg.max_seq_len), probe.batch_size,
                                probe.grad_accum)
        max_steps = (epochs - 1) * spe + 1  # needs `epochs` epochs, one step into the last
        kw = dict(synthetic_tokens=6_000, val_fraction=0.0, max_steps=max_steps,
                  warmup_steps=max_steps // 10, save_interval=max_steps,
                  eval_interval=max_steps, **_placement(backend))
        res = RUN.train(RUN.tiny_config(Path(tmp) / "ok", epochs=epochs, **kw), parts=p)
        out.update(steps_per_epoch=spe, max_steps=max_steps, final_step=res.final_step,
                   losses=len(res.losses), stopped=res.stopped)
        short = Path(tmp) / "short"
        try:
            RUN.train(RUN.tiny_config(short, epochs=epochs - 1, **kw), parts=p)
            out["refused"], out["message"] = False, ""
        except PF.PreflightError as e:
            out["refused"], out["message"] = True, str(e)
        out["metrics_written"] = (short / "metrics.jsonl").exists()
        out["message_names_fix"] = f">= {epochs}" in out["message"] and \
            f"gives {(epochs - 1) * spe} steps" in out["message"]
    try:
        p.check_config_algebra(22079, 4, 128, 1, 5000, 500)
        out["alb060_refused"] = False
    except PF.PreflightError:
        out["alb060_refused"] = True
    return out


# ----------------------------------------------------------------------------- memory
PRESET_COUNTS = {"350m": 398_509_056}  # the 350M preset's count, not from our formula


def param_count_run(backend, dtype="float32"):
    """TL-MEM-001: the closed-form count (bound `param_count`) equals the number of elements of
    the real module instantiated on the meta device (no memory), for every preset and the tiny
    test config; 350m also equals 398,509,056, a count stated independently of the formula."""
    from falsify.llm import config as LC
    from falsify.llm import run as RUN
    from falsify.llm.model import PRESETS, meta_param_count

    count = _bound("param_count")
    cfgs = dict(PRESETS)
    cfgs["tiny_test"] = LC.model_config(RUN.tiny_config("unused"))
    counts = {k: (int(count(c)), meta_param_count(c)[0]) for k, c in cfgs.items()}
    return {"mismatch": {k: v for k, v in counts.items() if v[0] != v[1]},
            "presets": sorted(counts), "count_350m": counts["350m"][1],
            "albor_350m": PRESET_COUNTS["350m"]}


def _tensor_bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def memory_run(backend, dtype="float32", steps=3):
    """TL-MEM-002: after `steps` steps of the tiny config, the bytes actually held by the
    gradients and by AdamW's moments (exp_avg, exp_avg_sq; the per-tensor 0-d step counters,
    4 bytes each, are listed apart) equal the estimate's grads = 4P and optimizer = 8P, and the
    peak of live CPU tensor bytes during a step — the torch profiler's allocation events, summed
    in time order on top of what was live before the step — stays within the estimate's total."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from falsify.llm import config as LC
    from falsify.llm import run as RUN
    from falsify.llm import trainer as TR
    from falsify.llm.model import build_model

    estimate = _bound("memory")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = RUN.tiny_config("unused", max_steps=10, warmup_steps=1)
        mcfg = LC.model_config(cfg)
        model = build_model(mcfg, "torch", seed=0)
        tr = TR.Trainer(model, cfg, torch.device("cpu"), parts=parts())
        g = torch.Generator().manual_seed(0)
        shape = (cfg.batch_size, mcfg.max_seq_len)
        micro = [(torch.randint(4, mcfg.vocab_size, shape, generator=g),
                  torch.randint(4, mcfg.vocab_size, shape, generator=g))
                 for _ in range(cfg.grad_accum)]
        for _ in range(steps - 1):
            tr.train_step(micro)
        params = list(model.parameters())
        # Free the last step's gradients before profiling: the profiler does not record the
        # release of a block allocated before it started, so they would count twice.
        tr.optimizer.zero_grad(set_to_none=True)
        live = _tensor_bytes(params)
        live += _tensor_bytes(v for s in tr.optimizer.state.values() for v in s.values())
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            tr.train_step(micro)
        cur = peak = 0
        for e in sorted((e for e in prof.profiler.kineto_results.events()
                         if e.name() == "[memory]"), key=lambda e: e.start_ns()):
            cur += e.nbytes()
            peak = max(peak, cur)
    finally:
        torch.set_num_threads(threads)
    state = tr.optimizer.state
    moments = _tensor_bytes(s[k] for s in state.values() for k in ("exp_avg", "exp_avg_sq"))
    est = estimate(mcfg, cfg.batch_size, mcfg.max_seq_len, cfg.activation_checkpointing,
                   grad_accum=cfg.grad_accum)
    p = sum(x.numel() for x in params)
    return {"P": p, "grad_bytes": _tensor_bytes(x.grad for x in params), "moment_bytes": moments,
            "step_counter_bytes": _tensor_bytes(s["step"] for s in state.values()),
            "weight_bytes": _tensor_bytes(params), "est_weights": est["weights"],
            "est_grads": est["grads"], "est_optimizer": est["optimizer"],
            "est_total": est["total"], "measured_peak": live + peak, "live_before": live,
            "est_accum_grads": est["accum_grads"],
            "peak_delta": peak}


# ------------------------------------------------------------------------------ resume
def resume_run(backend, dtype="float32", total=8, kill_at=3):
    """TL-RES-001: a run killed after `kill_at` steps and resumed from its checkpoint continues
    bit-identically: the loss of every step, the final weights."""
    from falsify.llm import run as RUN

    with tempfile.TemporaryDirectory() as tmp:
        r = RUN.resume_equivalence(total, kill_at, tmp, parts=parts(), val_fraction=0.0,
                                   **_placement(backend))
    return {"straight": r["losses_straight"], "spliced": r["losses_killed"] +
            r["losses_resumed"], "n_resumed": len(r["losses_resumed"]),
            "bit_identical": r["bit_identical"], "max_abs_diff": r["max_abs_diff"],
            "resumed_at": int(Path(r["resumed_from"]).name.split("-")[1])}


# ------------------------------------------------------------------------ accumulation
def accumulation_run(backend, dtype="float32", seed=0):
    """TL-ACC-001: one step over 2 micro-batches whose counted tokens differ (14 vs 64: the
    first has most targets set to ignore_index) against one step over the single batch holding
    both: loss, every gradient and every parameter update. Clipping is set out of reach so the
    gradients compared are the accumulated ones."""
    import torch

    from falsify.llm import config as LC
    from falsify.llm import run as RUN
    from falsify.llm import trainer as TR
    from falsify.llm.model import build_model

    p = parts()
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 512, (4, 32), generator=g)
    y = torch.randint(4, 512, (4, 32), generator=g)
    y[:2, :25] = TR.IGNORE_INDEX
    over = dict(grad_clip=1e9, andon_grad_norm=1e9, warmup_steps=0, max_steps=10)
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, micro in (("accum", [(x[:2], y[:2]), (x[2:], y[2:])]), ("full", [(x, y)])):
            cfg = RUN.tiny_config("unused", **over)
            model = build_model(LC.model_config(cfg), "torch", seed=seed)
            init = {n: q.detach().clone() for n, q in model.named_parameters()}
            tr = TR.Trainer(model, cfg, torch.device("cpu"), parts=p)
            st = tr.train_step(micro)
            out[name] = (st, {n: q.grad.detach().clone() for n, q in model.named_parameters()},
                         {n: (q.detach() - init[n]) for n, q in model.named_parameters()})
    finally:
        torch.set_num_threads(threads)
    (sa, ga, da), (sb, gb, db) = out["accum"], out["full"]
    grad_rel = max(float((ga[n] - gb[n]).abs().max() / gb[n].abs().max()) for n in gb)
    upd_rel = max(float(torch.linalg.vector_norm(da[n] - db[n]) / torch.linalg.vector_norm(db[n]))
                  for n in db)
    return {"tokens": [sa.tokens, sb.tokens], "loss_accum": sa.loss, "loss_full": sb.loss,
            "grad_rel": grad_rel, "update_rel": upd_rel}


# ------------------------------------------------------------------------- determinism
def determinism_run(backend, dtype="float32", steps=6):
    """TL-DET-001: two runs with the same seed write checkpoints whose tensors (weights, AdamW
    state, RNG states) hash identically; a run with another seed hashes differently (so the
    hash does see the weights)."""
    from falsify.llm import checkpoint as C
    from falsify.llm import run as RUN

    def digest(ckpt: Path) -> str:
        h = hashlib.sha256()
        for f in ("model.safetensors", "optimizer.safetensors", "rng.safetensors"):
            h.update((ckpt / f).read_bytes())
        return h.hexdigest()

    hashes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, seed in (("a", 0), ("b", 0), ("other_seed", 1)):
            cfg = RUN.tiny_config(Path(tmp) / name, max_steps=steps, warmup_steps=0, seed=seed,
                                val_fraction=0.0, save_interval=steps, **_placement(backend))
            RUN.train(cfg, parts=parts())
            hashes[name] = digest(C.latest_checkpoint(Path(tmp) / name))
    return {"same_seed_equal": hashes["a"] == hashes["b"],
            "other_seed_differs": hashes["a"] != hashes["other_seed"], "hash": hashes["a"]}


# ------------------------------------------------------------------------------ clipping
def clipping_run(backend, dtype="float32", seed=0):
    """TL-CLP-001: with the default config (grad_clip 1.0, nothing optional set) and a first
    step whose gradient norm is above 1.2, the gradient AdamW receives has global norm
    ‖g‖·min(1, c / (‖g‖ + 1e-6)) = c; with c far above ‖g‖ the gradient is untouched. ‖g‖ is
    away from 1 so that clipping by any power of the norm gives another result."""
    import torch

    from falsify.llm import config as LC
    from falsify.llm import run as RUN
    from falsify.llm import trainer as TR
    from falsify.llm.model import build_model

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(4, 512, (4, 32), generator=g)
    micro = [(x, x.roll(-1, 1))]
    out = {}
    for name, clip in (("active", LC.TrainConfig.grad_clip), ("inactive", 1e4)):
        cfg = RUN.tiny_config("unused", grad_clip=clip, andon_grad_norm=1e9)
        model = build_model(LC.model_config(cfg), "torch", seed=seed)
        tr = TR.Trainer(model, cfg, torch.device("cpu"), parts=parts())
        st = tr.train_step(micro)
        after = math.sqrt(sum(float((q.grad.double() ** 2).sum()) for q in tr.params))
        out[name] = {"clip": clip, "pre": st.grad_norm, "post": after,
                     "expected": st.grad_norm * min(1.0, clip / (st.grad_norm + 1e-6))}
    return {"pre_norm": out["active"]["pre"],
            "active_rel_err": abs(out["active"]["post"] - out["active"]["expected"])
            / out["active"]["expected"],
            "inactive_rel_err": abs(out["inactive"]["post"] - out["inactive"]["pre"])
            / out["inactive"]["pre"], "clip": out["active"]["clip"]}


# --------------------------------------------------------------------------- evaluation
def add_dropout(model, p: float) -> None:
    """Give every block of `model` a dropout on its output: an nn.Dropout child (so train() and
    eval() reach it, as they reach any dropout of a real model) applied by a forward hook. The
    loop's Transformer has no dropout of its own, so without this a train-mode evaluation
    computes the same numbers as an eval-mode one."""
    import torch

    for block in model.layers:
        block.probe_dropout = torch.nn.Dropout(p)
        block.register_forward_hook(lambda mod, args, out: mod.probe_dropout(out))


def evaluation_run(backend, dtype="float32", seed=0, dropout=0.1):
    """TL-EVL-001: the bound evaluation (Trainer.evaluate) of the tiny model with a dropout in
    every block, called with the model in train mode as the loop calls it: (a) two calls give
    the same loss, equal to the probe's own eval-mode, no_grad forward with the loss_sum of the
    same batches (the same operations, so exactly equal), which differs from a train-mode
    forward (the dropout has an effect to hide); (b) a forward hook sees every forward of the
    evaluation run with autograd off, with no module in train mode, and returning a logits
    tensor that is not part of a graph; (c) afterwards every module is in the mode it had,
    whether the model was in train or in eval mode before. Global RNG state is left as it
    was."""
    import torch

    from falsify.llm import config as LC
    from falsify.llm import run as RUN
    from falsify.llm import trainer as TR
    from falsify.llm.model import build_model, loss_sum

    cfg = RUN.tiny_config("unused", max_steps=10, warmup_steps=1)
    model = build_model(LC.model_config(cfg), "torch", seed=seed)
    add_dropout(model, dropout)
    tr = TR.Trainer(model, cfg, torch.device("cpu"), parts=parts())
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(2):
        x = torch.randint(4, 512, (2, 32), generator=g)
        y = x.roll(-1, 1)
        y[0, :5] = TR.IGNORE_INDEX
        batches.append((x, y))

    def explicit(train: bool) -> float:
        model.train(train)
        total, n = 0.0, 0
        with torch.no_grad():
            for x, y in batches:
                s, c = loss_sum(model(x), y, TR.IGNORE_INDEX)
                total, n = total + float(s), n + c
        return total / n

    return watch_evaluation(model, model, lambda: tr.evaluate(batches)[0], explicit,
                            len(batches), seed)


# -------------------------------------------------------------------- reference parity
# Tolerances of torch (fp32) vs the numpy float64 loop, derived (u = 2^-24 ≈ 6e-8, fp32 unit
# roundoff; the reference's float64 error ≈ 1e-16 is ignored):
#  * loss, per step: the fp32 forward chains ~12 GEMM / norm / softmax stages per layer with
#    reductions of length K ≤ 192; typical (random-walk) rounding is ~√K·u ≈ 14u per stage, so
#    ≈ 2 layers · 12 · 14u ≈ 340u ≈ 2e-5 relative on the logits at worst, and the loss (≈ ln V
#    ≈ 6.2) inherits it: TOL_LOSS = 2e-5 · 6.2 ≈ 1.2e-4 absolute. Parameter drift adds less than
#    that over 12 steps (below). Observed: ≤ 6e-7.
#  * parameters, per tensor: ‖θ_torch − θ_ref‖ / ‖θ_ref − θ_0‖, the error relative to the total
#    update. Adam's step η·m̂/(√v̂+ε) is invariant to gradient scale, so a relative gradient error
#    ε_g (≈ 2e-5, as for the logits) becomes an ≈ ε_g relative error of each step; over T = 12
#    steps they add at most linearly: TOL_PARAM = 12 · 2e-5 ≈ 2.4e-4, rounded to 3e-4. (Elements
#    whose gradient is below the fp32 noise floor can flip Adam's sign-like first step; they are
#    few and the per-tensor L2 norm bounds their weight.) Observed: ≤ 4e-5.
#  * grad norm, per step: a sum of squares of ~2e5 terms: ≈ ε_g relative: 1e-4.
# The smaller triton config (1 layer, K ≤ 48) has fewer and shorter reductions, so the same
# bounds hold with margin. tests/test_reference_loop.py shows each bound is ≥ 40× below what the
# known bugs produce.
TOL_LOSS = 1.2e-4
TOL_PARAM = 3e-4
TOL_GNORM = 1e-4
SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=48,
             seq_len=8, batch_size=1)


def parity_setup(backend: str = "torch", steps: int = 12, small: bool = False,
                 loop_parts=None) -> dict:
    """The torch loop (falsify/llm/trainer.Trainer, fp32, model kernels of `backend`) for `steps`
    steps
    with grad_accum 2, ignored targets (micro-batches carry different token counts), warmup +
    cosine and active clipping; returns its per-step stats, initial and final weights, and what
    the numpy loop needs to replay the same steps (`reference()` runs it)."""
    import torch

    from falsify.llm import config as LC
    from falsify.llm import data as D
    from falsify.llm import run as RUN
    from falsify.llm import trainer as TR
    from falsify.llm.model import build_model
    from falsify.reference import model as RM
    from falsify.reference import train as RT

    dev = device(backend)  # model and loop; the batches stay on the CPU (the Trainer moves them)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = RUN.tiny_config(tmp, max_steps=steps, warmup_steps=1, grad_accum=2, lr=3e-3,
                                lr_min=3e-4, backend=backend, **(SMALL if small else {}))
        mcfg = LC.model_config(cfg)
        data = D.prepare_data(RUN.data_spec(cfg, mcfg.vocab_size))
        sampler = D.BatchSampler(D.token_stream(data.train, 0), mcfg.max_seq_len,
                                 cfg.batch_size, cfg.grad_accum, cfg.epochs, cfg.seed)
        seq = mcfg.max_seq_len
        batches = []
        for t in range(steps):
            micro = sampler.next_step()
            x, y = micro[0]
            y = y.clone()
            y[:, : (3 * t) % seq] = TR.IGNORE_INDEX  # unequal token counts per micro-batch
            micro[0] = (x, y)
            batches.append(micro)
        model = build_model(mcfg, backend, dev, seed=0)  # initialised on the CPU, then moved
        init = {k: v.detach().double().cpu().numpy().copy()
                for k, v in model.state_dict().items()}
        tr = TR.Trainer(model, cfg, torch.device(dev), parts=loop_parts)
        stats = [tr.train_step(m) for m in batches]
    finally:
        torch.set_num_threads(threads)
    final = {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}
    rcfg = RM.RefModelConfig(**{k: getattr(mcfg, k) for k in (
        "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
        "intermediate_size", "max_seq_len", "rope_theta", "rms_norm_eps")})
    hyper = RT.RefHyper(cfg.lr, cfg.lr_min, cfg.warmup_steps, cfg.max_steps, cfg.beta1,
                        cfg.beta2, cfg.adam_eps, cfg.weight_decay, cfg.grad_clip)
    np_steps = [[(x.numpy(), y.numpy()) for x, y in m] for m in batches]

    def reference():
        return RT.train(init, np_steps, rcfg, hyper)

    return {"stats": stats, "init": init, "final": final, "reference": reference,
            "backend": model.ops.backend}


def param_rel(final: dict, ref: dict, init: dict) -> dict:
    return {k: float(np.linalg.norm(final[k] - ref[k]) / np.linalg.norm(ref[k] - init[k]))
            for k in ref}


def reference_parity_run(backend, dtype="float32", steps=12, small=False):
    """TL-REF-001: per-step loss, pre-clip grad norm and LR, and the final parameters of the
    torch loop against falsify/reference/train.py from the same weights on the same batches."""
    run = parity_setup(backend, steps, small, parts())
    params, state, losses, norms, lrs = run["reference"]()
    stats = run["stats"]
    rel = param_rel(run["final"], params, run["init"])
    worst = max(rel, key=rel.get)
    return {"steps": len(stats), "ref_steps": state["t"], "model_backend": run["backend"],
            "loss_err": max(abs(s.loss - r) for s, r in zip(stats, losses, strict=True)),
            "gnorm_rel": max(abs(s.grad_norm - r) / r for s, r in zip(stats, norms,
                                                                       strict=True)),
            "lr_rel": max(abs(s.lr - r) / max(r, 1e-300) for s, r in zip(stats, lrs,
                                                                         strict=True)),
            "param_rel": rel[worst], "worst_param": worst, "clip_active": any(n > 1.0
                                                                           for n in norms),
            "ref_first": losses[0], "ref_last": losses[-1],
            "tol_loss": TOL_LOSS, "tol_param": TOL_PARAM, "tol_gnorm": TOL_GNORM}


# ------------------------------------------------------------------------- RNG on resume
def _rng_snapshot() -> dict:
    """Every generator the loop can draw from, read directly (not via checkpoint.rng_state, the
    code under test)."""
    import random

    import torch

    snap = {"numpy": np.random.get_state(), "python": random.getstate(),
            "torch_cpu": torch.get_rng_state().clone()}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            snap[f"torch_cuda_{i}"] = torch.cuda.get_rng_state(i).clone()
    return snap


def _same_state(a, b) -> bool:
    import torch

    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return a == b


def _draws() -> dict:
    import random

    import torch

    d = {"numpy": np.random.rand(4).tolist(), "python": [random.random() for _ in range(4)],
         "torch_cpu": torch.rand(4).tolist(),
         "dropout": torch.nn.functional.dropout(torch.ones(16), 0.5).tolist()}
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            d[f"torch_cuda_{i}"] = torch.rand(4, device=f"cuda:{i}").tolist()
    return d


def rng_resume_run(backend, dtype="float32"):
    """TL-RES-002: save a checkpoint, advance every generator, load it with the bound
    load_checkpoint: each generator's state equals the one at save time, and the next draws
    (uniforms and a dropout mask) equal those taken right after the save. The process's own
    generator states are put back afterwards."""
    import random

    import torch

    from falsify.llm import checkpoint as C
    from falsify.llm.config import model_config
    from falsify.llm.model import build_model
    from falsify.llm.run import tiny_config
    from falsify.llm.trainer import Trainer

    load = _bound("checkpoint_rng")
    outer = _rng_snapshot()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = tiny_config(Path(tmp), max_steps=4, warmup_steps=0)
            tr = Trainer(build_model(model_config(cfg), "torch", seed=0), cfg, torch.device("cpu"))
            x = torch.randint(4, 512, (2, 32), generator=torch.Generator().manual_seed(0))
            tr.train_step([(x, x.roll(-1, 1))])  # AdamW state to save and load
            random.seed(11)
            np.random.seed(12)
            torch.manual_seed(13)  # seeds every CUDA device too
            ck = C.save_checkpoint(tmp, 1, tr.model, tr.optimizer, tr.param_names,
                                   data_state={}, config={})
            saved = _rng_snapshot()
            expected_draws = _draws()
            for _ in range(3):  # the rest of a run moves every generator on
                _draws()
            moved = sorted(k for k, v in _rng_snapshot().items() if not _same_state(v, saved[k]))
            load(ck, tr.model, tr.optimizer, tr.param_names)
            after = _rng_snapshot()
            draws = _draws()
    finally:
        random.setstate(outer["python"])
        np.random.set_state(outer["numpy"])
        torch.set_rng_state(outer["torch_cpu"])
        for k, v in outer.items():
            if k.startswith("torch_cuda_"):
                torch.cuda.set_rng_state(v, int(k.rsplit("_", 1)[1]))
    expected = sorted(["numpy", "python", "torch_cpu"]
                      + [f"torch_cuda_{i}" for i in range(torch.cuda.device_count())
                         if torch.cuda.is_available()])
    return {"generators": sorted(saved), "expected": expected, "moved": moved,
            "restored": sorted(k for k in saved if _same_state(after[k], saved[k])),
            "draws_equal": draws == expected_draws}
