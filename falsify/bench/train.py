"""`falsify bench train`: our training step vs transformers.LlamaForCausalLM, side by side, as
transformers runs it out of the box (eager) and under torch.compile (what a user who cares about
speed picks: `Trainer(torch_compile=True)`, i.e. torch.compile(model), inductor).

All models are loaded from one exported HF directory (same weights), checked to give the same
loss on the same batch (a benchmark of two different computations would be meaningless; ours
is computed the way the timed step computes it, LM head and cross-entropy fused; the compiled
model's first step must give eager transformers' loss too). Each side then lives in its own
subprocess and runs training steps (forward, backward, global-norm clip at 1.0, fused AdamW
β=(0.9, 0.95), wd 0.1; fp32 on CPU; HF uses attn_implementation="eager"), one step at a time on
command, rotating through the sides (who goes first rotates too), so a change in the machine's
load hits every side alike. The speedup against a side is the median over rounds of adjacent
steps of t_side / t_ours, reported with its quartiles; tokens/s per side come from its median
step time. (On a shared 2-core machine, runs of whole rounds per side disagreed by up to 1.7x
on tiny; paired steps are what keep the ratio stable.)

Compilation: the compiled side runs its first step before the timed rounds; its wall time,
minus the side's median step, is reported as the compile time, with the FX graph cache's hits
and misses (a warm cache, from an earlier run of the same shapes, compiles in a fraction of the
time), the graphs and graph breaks dynamo produced. Where torch.compile cannot work (no C++
compiler, an inductor error), that side is reported as failed with the error, and the others
still run.

Memory: each child resets its resident-set high-water mark (/proc/self/clear_refs) once its
model and batch are loaded (for the compiled side: once compiled) and reports VmHWM minus the
RSS after loading: the training steps' own memory (gradients, AdamW state, activations,
allocator slack; for the compiled side also what compilation left resident, reported on its
own as well). tracemalloc cannot see torch's allocations, which do not go through Python's
allocator.

FLOPs per token (PaLM appendix B): 6·P + 12·L·S·H, P all parameters (the tied embedding counts
once: it is the LM-head GEMM; the lookup is free), the second term the attention score and
value GEMMs (counted over the full S×S, as PaLM does, though causal work is half). MFU is
reported against a measured fp32 GEMM peak of this machine (a 1024³ matmul with the same thread
count, best of measurements at the start, in every child and at the end, since other load on
the machine depresses any single one), not a datasheet number.

Where the time goes: after the timed rounds each child runs `PROFILE_STEPS` more steps under
torch.profiler and splits the ops' own (self) CPU time into GEMMs (mm/addmm/bmm/baddbmm, the
dense products the sides share), fused attention kernels, and everything else. The shares are
applied to the side's timed median step (a profiled step runs slower, and one disturbed by other
load on the machine would otherwise show as a slow category). From ours' GEMM time comes the
*ceiling*: t_HF / t_GEMM(ours), the speedup over eager transformers ours would reach if every
op that is not a GEMM cost nothing. It tells a target that needs faster GEMMs from one that
needs fewer or cheaper elementwise passes.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from falsify.errors import UsageError
from falsify.helptext import first_paragraph

U32 = 2.0**-24
PROFILE_STEPS = 3
# aten ops that are dense matrix products (torch.profiler names); the attention kernels are
# matched by ATTENTION_MARKERS instead, since their time is softmax as much as products.
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm",
                      "aten::addbmm", "aten::_addmm_activation"})
ATTENTION_MARKERS = ("scaled_dot_product", "flash_attention", "efficient_attention")
SIDES = ("ours", "hf", "hf_compiled")
LABELS = {"ours": "falsify", "hf": "HF eager", "hf_compiled": "HF compiled"}
OPTIONAL_SIDES = ("hf_compiled",)  # where it cannot run, the bench says why and goes on


def flops_per_token(cfg, seq_len: int) -> float:
    from falsify.llm.model import param_count

    return 6.0 * param_count(cfg) + 12.0 * cfg.num_layers * seq_len * cfg.hidden_size


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _vm(key: str) -> int:
    """A /proc/self/status figure (VmHWM, VmRSS) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the resident-set high-water mark (VmHWM) restarts from the current RSS


def _gemm_peak(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    for _ in range(3):
        a @ b
    best = math.inf
    for _ in range(10):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 1024**3 / best


def breakdown(events, steps: int) -> dict:
    """Self CPU ms per step of GEMMs, fused attention kernels and the rest, from torch.profiler's
    key_averages(). Self times add up to the profiled wall time on the CPU: every op and the
    autograd engine run on the calling thread, intra-op threads inside an op."""
    ms = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for e in events:
        if e.key in GEMM_OPS:
            part = "gemm"
        elif any(m in e.key for m in ATTENTION_MARKERS):
            part = "attention"
        else:
            part = "other"
        ms[part] += e.self_cpu_time_total / 1e3 / steps
    total = sum(ms.values())
    return {**{f"{k}_ms": v for k, v in ms.items()}, "total_ms": total,
            **{f"{k}_share": v / total if total else 0.0 for k, v in ms.items()}}


def ceiling_figures(ref_step_s: float, ours_step_s: float, ours_gemm_share: float,
                    target: float) -> dict:
    """The ceiling t_ref / t_GEMM(ours) (ours' GEMM time = its profiled share of its timed
    step: the ratio ours would reach if nothing but its GEMMs cost anything), the non-GEMM time
    `target` allows ours, and ours' non-GEMM time now (ms per step)."""
    gemm_s = ours_step_s * ours_gemm_share
    return {"ceiling": ref_step_s / gemm_s if gemm_s > 0 else math.inf,
            "non_gemm_budget_ms": (ref_step_s / target - gemm_s) * 1e3,
            "non_gemm_ms": (ours_step_s - gemm_s) * 1e3}


def ceiling_sentence(r: dict, target: float, ref: str) -> str:
    """One line from ceiling_figures' keys in `r`."""
    if r["non_gemm_budget_ms"] < 0:
        need = "is out of reach even if nothing but ours' GEMMs cost anything"
    else:
        need = (f"needs ours' non-GEMM time <= {r['non_gemm_budget_ms']:.1f} ms per step, it is "
                f"{r['non_gemm_ms']:.1f} ms")
    return (f"ceiling t_{ref} / t_GEMM(ours) = {r['ceiling']:.2f}x (ours' ratio if nothing but "
            f"its GEMMs cost anything); {target}x {need}")


def _ours_step(hf_dir: str, x, y, backend: str):
    import torch

    from falsify.llm.config import TrainConfig
    from falsify.llm.hf import import_hf
    from falsify.llm.trainer import Trainer

    model = import_hf(hf_dir, backend=backend)
    cfg = TrainConfig(max_steps=10**9, warmup_steps=0, lr=1e-4, lr_min=1e-4,
                      andon_grad_norm=1e9)
    trainer = Trainer(model, cfg, torch.device("cpu"))
    return lambda: trainer.train_step([(x, y)]).loss


def _hf_step(hf_dir: str, x, y, compiled: bool):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(hf_dir, local_files_only=True,
                                             attn_implementation="eager", dtype=torch.float32)
    model.train()
    # As a transformers user gets it: Trainer's default optimizer on torch >= 2.8 is
    # "adamw_torch_fused", and its clipping calls clip_grad_norm_ with torch's defaults.
    # Ours uses the fused AdamW too (falsify/kernels/torch/adamw.py, the loop's Ops.adamw), so the
    # optimizer
    # costs both sides the same and the ratio measures the model.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    # Trainer(torch_compile=True) does exactly this: torch.compile(model) with its defaults
    # (inductor); the optimizer and the clipping stay eager there too.
    forward = torch.compile(model) if compiled else model

    def step():
        opt.zero_grad(set_to_none=True)
        logits = forward(input_ids=x).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    return step


def _compile(step, base: int) -> dict:
    """The compiled side's first step, where torch.compile traces and generates the forward
    and backward code: its wall time, its loss (before the update, for the same-loss check),
    what the compilation left resident, and how it went."""
    from torch._dynamo.utils import counters

    _reset_hwm()
    t = time.perf_counter()
    loss = step()
    first = time.perf_counter() - t
    return {"first_step_s": first, "first_loss": loss, "compile_mem": _vm("VmHWM") - base,
            "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "fx_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
            "fx_cache_misses": counters["inductor"]["fxgraph_cache_miss"]}


def _child(kind: str, hf_dir: str, batch_path: str, threads: int, backend: str, conn) -> None:
    """One side of the benchmark: builds its model and step, then runs one step per "step"
    command (replying with its wall time) until "done" (replying with its memory figures).
    Its first message is ("ready", info) or, where torch.compile fails, ("failed", error)."""
    import torch

    torch.set_num_threads(threads)
    batch = torch.load(batch_path)
    x, y = batch["x"], batch["y"]
    step = (_ours_step(hf_dir, x, y, backend) if kind == "ours"
            else _hf_step(hf_dir, x, y, compiled=kind == "hf_compiled"))
    base = _rss_bytes()
    info = {}
    if kind == "hf_compiled":
        try:
            info = _compile(step, base)
        except Exception as e:  # inductor failed here (no compiler, ...): say so, with why
            conn.send(("failed", f"{type(e).__name__}: {e}".strip()))
            return
    _reset_hwm()  # from here on the high-water mark is the training steps'
    conn.send(("ready", info))
    while (cmd := conn.recv()) in ("step", "profile"):
        if cmd == "profile":
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(PROFILE_STEPS):
                    step()
            conn.send(breakdown(prof.key_averages(), PROFILE_STEPS))
            continue
        t = time.perf_counter()
        step()
        conn.send(time.perf_counter() - t)
    if cmd != "done":
        raise ValueError(f"bench child: unknown command {cmd!r}")
    peak = _vm("VmHWM")
    conn.send({"peak_rss": peak, "base_rss": base, "step_mem": peak - base,
               "gemm_peak": _gemm_peak(threads)})


def _start(sides, hf_dir, batch_path, threads, backend) -> dict:
    ctx = mp.get_context("spawn")
    out = {}
    for kind in sides:
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(kind, hf_dir, batch_path, threads, backend,
                                                theirs))
        proc.start()
        theirs.close()  # only the child holds its end now: a child that dies reads as EOF here
        out[kind] = (proc, mine)
    return out


def _stop(proc, conn) -> None:
    conn.close()
    proc.join(timeout=60)
    if proc.is_alive():
        proc.kill()


def run_paired(hf_dir: str, batch_path: str, steps: int, warmup: int, threads: int,
               backend: str, sides=SIDES) -> dict:
    """Every side in a live subprocess; `warmup` then `steps` rounds of one step per side, in
    an order that rotates each round. Returns per side {times, step_mem, info, ...}, per other
    side the paired ratios t_side / t_ours, and the sides that could not run ("failed": only
    an optional side may fail; ours and eager transformers are the comparison)."""
    live = _start(sides, hf_dir, batch_path, threads, backend)

    def answer(kind, what):
        proc, conn = live[kind]
        try:
            if not conn.poll(3600):
                raise TimeoutError(f"bench child {kind!r} did not answer {what} within an hour")
            return conn.recv()
        except EOFError:
            proc.join(timeout=60)
            raise RuntimeError(f"bench child {kind!r} died before answering {what} (exit code "
                               f"{proc.exitcode}; its traceback is above)") from None

    def ask(kind, msg):
        live[kind][1].send(msg)
        return answer(kind, repr(msg))

    info, failed = {}, {}
    try:
        for kind in list(live):
            msg = answer(kind, "'ready'")
            if msg[0] == "failed" and kind in OPTIONAL_SIDES:
                failed[kind] = msg[1]
                _stop(*live.pop(kind))
            elif msg[0] != "ready":
                raise RuntimeError(f"bench child {kind!r} sent {msg!r} instead of 'ready'")
            else:
                info[kind] = msg[1]
        order = list(live)
        times = {kind: [] for kind in order}
        for i in range(warmup + steps):
            r = i % len(order)  # who goes first rotates, so load drift hits every side alike
            pair = {kind: ask(kind, "step") for kind in order[r:] + order[:r]}
            if i >= warmup:
                for kind, t in pair.items():
                    times[kind].append(t)
        out = {kind: {"times": times[kind], "info": info[kind],
                      "breakdown": ask(kind, "profile"), **ask(kind, "done")} for kind in order}
    finally:
        for proc, conn in live.values():
            _stop(proc, conn)
    out["ratios"] = {kind: [t / o for t, o in zip(times[kind], times["ours"], strict=True)]
                     for kind in order if kind != "ours"}
    out["failed"] = failed
    return out


def check_same_loss(hf_dir: Path, x, y, backend: str) -> dict:
    """Loss of ours and of transformers on the same batch from the same weights. Tolerance: both
    fp32, op orders differ; logits agree to 8·(2L+1)·√K·u·max|logit| (tests/test_hf.py) and
    cross-entropy is 2-Lipschitz in the max-norm of the logits."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    from falsify.llm.hf import import_hf

    ours = import_hf(hf_dir, backend=backend).eval()
    hf = LlamaForCausalLM.from_pretrained(hf_dir, local_files_only=True,
                                          attn_implementation="eager", dtype=torch.float32)
    hf.eval()
    with torch.no_grad():
        lo = ours(x)
        lh = hf(input_ids=x).logits
        # ours: the loss as the timed training step computes it (LM head + CE fused,
        # Transformer.loss_sum), not via the logits
        s, n = ours.loss_sum(x, y)
    v = lo.shape[-1]
    loss_o = float(s) / n
    loss_h = float(F.cross_entropy(lh.reshape(-1, v), y.reshape(-1)))
    cfg = ours.cfg
    k = max(cfg.hidden_size, cfg.intermediate_size)
    tol = 2 * 8 * (2 * cfg.num_layers + 1) * math.sqrt(k) * U32 * float(lo.abs().max())
    return {"loss_ours": loss_o, "loss_hf": loss_h, "diff": abs(loss_o - loss_h), "tol": tol,
            "max_logit_diff": float((lo - lh).abs().max()), "ok": abs(loss_o - loss_h) <= tol}


def bench_preset(name: str, batch: int, seq: int, steps: int, warmup: int, threads: int,
                 backend: str, seed: int = 0) -> dict:
    import torch

    from falsify.llm.hf import export_hf
    from falsify.llm.model import build_model, param_count, preset

    cfg = preset(name, max_seq_len=seq)
    model = build_model(cfg, backend, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # Move the weights away from init (logits ~0 there, so any two models would agree on
        # the loss ≈ ln V): std 0.08 matrices, gains in [0.5, 1.5]. Speed does not depend on it.
        for pname, prm in model.named_parameters():
            if pname.endswith("norm.weight"):
                prm.copy_(0.5 + torch.rand(prm.shape, generator=g))
            else:
                prm.copy_(0.08 * torch.randn(prm.shape, generator=g))
    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    y = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = export_hf(model, Path(tmp) / "hf")
        del model
        same = check_same_loss(hf_dir, x, y, backend)
        if not same["ok"]:
            raise SystemExit(f"{name}: ours and transformers disagree on the loss "
                             f"({same['loss_ours']} vs {same['loss_hf']}, tol {same['tol']:.2e})"
                             ": refusing to compare speed of different computations")
        bp = Path(tmp) / "batch.pt"
        torch.save({"x": x, "y": y}, bp)
        runs = run_paired(str(hf_dir), str(bp), steps, warmup, threads, backend)
    out = {"preset": name, "params": param_count(cfg), "batch": batch, "seq": seq,
           "threads": threads, "loss_check": same, "flops_per_token": flops_per_token(cfg, seq)}
    _summarise(out, runs)
    return out


def _quartiles(xs: list[float]) -> list[float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else xs * 3
    return [q[0], q[2]]


def _summarise(out: dict, runs: dict) -> None:
    """Per side: median step, tokens/s, GFLOP/s, memory; per other side: the paired ratios;
    the compiled side also its compile figures, or why it did not run."""
    tokens, fpt, same = out["batch"] * out["seq"], out["flops_per_token"], out["loss_check"]
    for kind, error in runs["failed"].items():
        out[kind] = {"failed": error}
    comp = runs.get("hf_compiled", {}).get("info")
    if comp and abs(comp["first_loss"] - same["loss_hf"]) > same["tol"]:
        # a compiled model that computes another loss is not the same computation: no speed
        out["hf_compiled"] = {"failed": f"its first step's loss {comp['first_loss']:.6f} differs "
                                        f"from eager transformers' {same['loss_hf']:.6f} by "
                                        f"more than {same['tol']:.1e}", **comp}
        del runs["hf_compiled"], runs["ratios"]["hf_compiled"]
    for kind in (k for k in SIDES if k in runs):
        r = runs[kind]
        med = statistics.median(r["times"])
        out[kind] = {"step_s": med, "tok_s": tokens / med, "gflop_s": fpt * tokens / med / 1e9,
                     "step_mem_mb": r["step_mem"] / 2**20, "peak_rss_mb": r["peak_rss"] / 2**20,
                     "times_s": r["times"], "breakdown": r["breakdown"], **r["info"]}
    if "first_step_s" in out.get("hf_compiled", {}):
        c = out["hf_compiled"]
        c["compile_s"] = c["first_step_s"] - c.get("step_s", 0.0)
        c["compile_mem_mb"] = c.pop("compile_mem") / 2**20
    out["gemm_peak"] = max(runs[k]["gemm_peak"] for k in SIDES if k in runs)
    out["vs"] = {kind: {"speedup": statistics.median(rs), "quartiles": _quartiles(rs),
                        "pairs": rs, "mem_ratio": out["ours"]["step_mem_mb"]
                        / out[kind]["step_mem_mb"]} for kind, rs in runs["ratios"].items()}
    # against eager transformers, the stated target (TARGET_SPEEDUP) and the ceiling
    hf = out["vs"]["hf"]
    out["speedup"], out["speedup_quartiles"] = hf["speedup"], hf["quartiles"]
    out["paired_ratios"], out["mem_ratio"] = hf["pairs"], hf["mem_ratio"]
    out.update(ceiling_figures(out["hf"]["step_s"], out["ours"]["step_s"],
                               out["ours"]["breakdown"]["gemm_share"], TARGET_SPEEDUP))


# Per preset: (batch, sequence length). The sequence length is the preset's own context length
# (ModelConfig.max_seq_len: tiny 128, 50m and 350m 1024), the blocks `falsify train` packs, so the
# step measured is the step training runs. The batch is the training default (16) for tiny and 1
# for the larger presets, to keep the benchmark to a few minutes on 2 cores (tokens/s at 1024
# tokens a step hardly depends on the batch). `--seq` measures shorter
# blocks, where attention is a smaller share of the step and the ratio is lower.
DEFAULT_BATCH = {"tiny": 16}
TARGET_SPEEDUP = 1.3  # the target: >= 1.3x transformers tokens/s at tiny and 50m on CPU


def default_shape(name: str) -> tuple[int, int]:
    from falsify.llm.model import preset

    return DEFAULT_BATCH.get(name, 1), preset(name).max_seq_len


def register(sub) -> None:
    p = sub.add_parser("train", help="training step, ours vs transformers (eager, compiled)",
                       description=first_paragraph(__doc__))
    p.add_argument("--presets", default="tiny,50m", help="comma-separated model presets")
    p.add_argument("--batch", type=int, help="batch size (default per preset)")
    p.add_argument("--seq", type=int, help="sequence length (default per preset)")
    p.add_argument("--steps", type=int, default=15,
                   help="timed steps per side, alternating the sides step by step")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads in each child (default: all cores, or 1 if the "
                        "machine is already loaded; see falsify/llm/run.py:resolve_threads)")
    p.add_argument("--backend", default="torch", choices=["torch", "triton", "auto"])
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    if args.steps < 1 or args.warmup < 0:
        raise UsageError(f"falsify bench train: --steps must be >= 1 and --warmup >= 0 (got "
                         f"{args.steps}, {args.warmup})")
    from rich.console import Console

    from falsify.llm.run import resolve_threads

    load = os.getloadavg()
    threads, why = resolve_threads(args.threads)
    console = Console()
    console.print(f"torch threads per child: {why}")
    peak = _gemm_peak(threads)
    console.print(f"fp32 GEMM peak measured here (1024^3, {threads} threads): "
                  f"{peak / 1e9:.1f} GFLOP/s")
    results = _presets(args, threads, console)
    peak = max([peak, _gemm_peak(threads), *(r["gemm_peak"] for r in results)])
    load = (load[0], os.getloadavg()[0])
    for r in results:
        r["gemm_peak_gflop_s"] = peak / 1e9
        r["load_average"] = load
        r["target_speedup"], r["target_met"] = TARGET_SPEEDUP, r["speedup"] >= TARGET_SPEEDUP
        vc = r["vs"].get("hf_compiled")
        r["ahead_of_compiled"] = None if vc is None else vc["speedup"] > 1.0
    console.print(f"fp32 GEMM peak, best of all measurements (start, each child, end): "
                  f"{peak / 1e9:.1f} GFLOP/s")
    _print_tables(console, results)
    _print_verdicts(console, results, args.steps, load)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def _presets(args, threads: int, console) -> list[dict]:
    """One result per preset, watched through the shared progress display on stderr, redrawn
    between presets only (the steps are timed in child processes on the same cores): on a
    terminal presets done of total and an ETA; in a log one line per finished preset."""
    from rich.console import Console

    from falsify.harness.progress import Progress

    names = args.presets.split(",")
    results = []
    with Progress(Console(stderr=True), "presets", total=len(names), ticking=False) as view:
        for name in names:
            b, s = default_shape(name)
            view.start(f"{name} ({args.warmup} + {args.steps} steps per side)")
            t0 = time.monotonic()
            r = bench_preset(name, args.batch or b, args.seq or s, args.steps, args.warmup,
                             threads, args.backend)
            results.append(r)
            lc = r["loss_check"]
            console.print(f"[bold]{name}[/] ({r['params']:,} params, batch {r['batch']}x"
                          f"{r['seq']}): same loss: ours {lc['loss_ours']:.6f} vs transformers "
                          f"{lc['loss_hf']:.6f} (|diff| {lc['diff']:.1e} <= tol "
                          f"{lc['tol']:.1e}; max |logit diff| {lc['max_logit_diff']:.1e})")
            view.finished(f"bench train: {name}: {r['batch']}x{r['seq']}, {args.steps} steps "
                          f"per side, {time.monotonic() - t0:.0f} s")
    return results


def _print_tables(console, results: list[dict]) -> None:
    from rich.table import Table

    t = Table(title="training step, CPU fp32: falsify vs transformers LlamaForCausalLM "
                    "(eager attention) as is (HF eager) and under torch.compile (HF compiled)")
    for c in ("preset", "impl", "tokens/s", "step ms", "step mem MB", "GFLOP/s", "MFU*"):
        t.add_column(c, justify="right")
    for r in results:
        for kind in SIDES:
            k = r[kind]
            if "failed" in k:
                t.add_row(r["preset"], LABELS[kind], "[red]failed[/]", "", "", "", "")
                continue
            t.add_row(r["preset"], LABELS[kind], f"{k['tok_s']:,.0f}", f"{k['step_s'] * 1e3:.1f}",
                      f"{k['step_mem_mb']:.0f}", f"{k['gflop_s']:.1f}",
                      f"{k['gflop_s'] / r['gemm_peak_gflop_s']:.1%}")
        for kind, v in r["vs"].items():
            t.add_row(r["preset"], f"[bold]ratio vs {LABELS[kind].removeprefix('HF ')}[/]",
                      f"[bold]{v['speedup']:.2f}x[/]", "", f"{v['mem_ratio']:.2f}x", "", "")
    console.print(t)
    console.print("ratio: median over adjacent steps of t_theirs / t_ours (> 1: ours is faster; "
                  "memory ratio < 1: ours is smaller). * MFU against the measured GEMM peak "
                  "above; FLOPs/token = 6P + 12·L·S·H. Step memory = peak RSS during the "
                  "steps (VmHWM) - RSS after loading, per subprocess; for the compiled side "
                  "it includes what compilation leaves resident.")
    b = Table(title=f"where the step goes: ms of the timed median step, split by the shares of "
                    f"self CPU time in {PROFILE_STEPS} profiled steps per side")
    for c in ("preset", "impl", "GEMM", "attention", "other", "GEMM share"):
        b.add_column(c, justify="right")
    for r in results:
        for kind in (k for k in SIDES if "breakdown" in r[k]):
            k, step_ms = r[kind]["breakdown"], r[kind]["step_s"] * 1e3
            b.add_row(r["preset"], LABELS[kind], *(f"{k[f'{part}_share'] * step_ms:.1f}"
                                                   for part in ("gemm", "attention", "other")),
                      f"{k['gemm_share']:.0%}")
    console.print(b)
    console.print("transformers' eager attention is bmm (counted as GEMM) and softmax (other); "
                  "ours is torch's fused SDPA kernel (attention); inductor's generated C++ "
                  "kernels count as other.")


def _print_verdicts(console, results: list[dict], steps: int, load) -> None:
    from rich.markup import escape

    for r in results:
        c = r["hf_compiled"]
        if "first_step_s" in c:
            console.print(
                f"{r['preset']}: torch.compile: first step {c['first_step_s']:.1f} s, of which "
                f"compiling ~{c['compile_s']:.1f} s (FX graph cache: {c['fx_cache_hits']} hit(s), "
                f"{c['fx_cache_misses']} miss(es)); {c['graphs']} graph(s), "
                f"{c['graph_breaks']} graph break(s); resident after compiling "
                f"+{c['compile_mem_mb']:.0f} MB")
        if "failed" in c:
            console.print(f"[bold red]{r['preset']}: transformers + torch.compile did not run:[/] "
                          f"{escape(_clip(c['failed']))}", highlight=False)
        console.print(f"{r['preset']}: {ceiling_sentence(r, TARGET_SPEEDUP, 'HF')}")
    for r in results:
        verdict = "[green]met[/]" if r["target_met"] else "[red]NOT met[/]"
        lo, hi = r["speedup_quartiles"]
        console.print(f"{r['preset']} ({r['batch']}x{r['seq']}): target >= {TARGET_SPEEDUP}x "
                      f"eager transformers tokens/s: {verdict} (median {r['speedup']:.2f}x, "
                      f"quartiles {lo:.2f}-{hi:.2f}x over {steps} step pairs)")
        vc = r["vs"].get("hf_compiled")
        if vc is None:
            console.print(f"{r['preset']}: vs transformers + torch.compile: [red]not measured"
                          "[/] (see above)")
            continue
        lo, hi = vc["quartiles"]
        verdict = "[green]ahead[/]" if r["ahead_of_compiled"] else "[red]NOT ahead[/]"
        console.print(f"{r['preset']}: vs transformers + torch.compile: {verdict} (median "
                      f"{vc['speedup']:.2f}x, quartiles {lo:.2f}-{hi:.2f}x)")
    console.print(f"load average (1 min) at start {load[0]:.1f}, at end {load[1]:.1f} on "
                  f"{os.cpu_count()} cores: other work on the machine slows every side; the "
                  "steps alternate so it slows them alike")


def _clip(text: str, n: int = 800) -> str:
    """An inductor error can be pages of compiler output: its head and its tail."""
    return text if len(text) <= n else f"{text[:n // 2]} … {text[-n // 2:]}"
