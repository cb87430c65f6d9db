"""`falsify bench finetune`: one QLoRA training step of ours vs the same model in transformers +
peft, on CPU, measured in one run, on two quantized bases: NF4 and GGUF q8_0.

Both sides get the same base weights (ours exported with falsify/llm/hf.py), the same adapters
(rank,
alpha, the seven target projections), the same batch with the same response-only labels, and
the same update (loss, backward, global-norm clip, AdamW over the adapters). The reference is
transformers' LlamaForCausalLM with bitsandbytes NF4 (`BitsAndBytesConfig(load_in_4bit=True,
nf4, double quant)`) when bitsandbytes is installed and its 4-bit layers run on this CPU;
otherwise it is plain fp32 LoRA (peft on an fp32 base), and the table says which.

Time: median of interleaved steps (ours, theirs, ours, …) after warm-up, in one process, so
load drift hits both sides alike; tokens/s counts every input token of the batch. Peak memory:
each side runs in a fresh subprocess; after its libraries are imported the resident-set
high-water mark is reset (`/proc/self/clear_refs`), the model is built and two steps run, and
VmHWM minus the post-import RSS is the peak (loading, activations, dequantized weights,
gradients, optimizer state); the RSS right after building is reported too. Linux only; counts
real resident pages, allocator caching included. The NF4 vs fp32 base memory is also reported
exactly, from the tensors' byte counts.

The GGUF row: the same weights exported as a q8_0 GGUF (`falsify export --gguf --gguf-type
q8_0`; q8_0 because it is the GGUF type falsify writes). Ours fine-tunes LoRA on it with the
projections kept as q8_0 blocks (gguf-quants-kernel-v1's fused dequantize-matmul, forward and
backward); transformers loads the same file with `from_pretrained(gguf_file=...)`, which
dequantizes it to an fp32 model, and peft adds the same adapters. llama.cpp is not a third side:
its `llama-finetune` (examples/training, as vendored in llama-cpp-python 0.3.36) trains every
weight of an FP32 model and has no LoRA or quantized-base training: no step comparable to this.

Where the step goes: after the timed steps each side runs PROFILE_STEPS more under torch.profiler,
split into GEMMs and the rest (bench/train.py's `breakdown`). Both sides run the same GEMMs (the
same shapes: base, adapters, LM head), so t_theirs / t_GEMM(ours) is the *ceiling*: the ratio
ours would reach if nothing but its GEMMs cost anything. It tells a target that needs fewer or
faster GEMMs from one that needs less work around them.

Known difference in the reference: transformers 5 + bitsandbytes on CPU quantize a bfloat16
copy of the weights (quant_state.dtype is bfloat16) although the model is loaded in fp32; ours
quantizes the fp32 weights (bit-identical to bitsandbytes.functional.quantize_4bit on fp32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from falsify.errors import UsageError
from falsify.helptext import first_paragraph

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SIZES = {
    # hidden, layers, heads, kv heads, intermediate, vocab, seq, batch
    "small": dict(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4,
                  intermediate_size=1376, vocab_size=4096, max_seq_len=128, batch=4),
    "tiny": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=384, vocab_size=1024, max_seq_len=64, batch=4),
}
RANK, ALPHA, LR = 16, 32.0, 1e-3
TARGET_RATIO = 1.2  # tokens/s ours / theirs asked of the QLoRA step, at <= their peak memory
BASES = {"nf4": "NF4 (bitsandbytes layout, double quantization)",
         "q8_0": "GGUF q8_0"}


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _cfg(size: str):
    from falsify.llm.model import ModelConfig

    s = dict(SIZES[size])
    s.pop("batch")
    return ModelConfig(**s)


def _batch(size: str):
    """Inputs and response-only labels: the first third of every row is prompt (-100)."""
    c = _cfg(size)
    b, s = SIZES[size]["batch"], c.max_seq_len
    g = torch.Generator().manual_seed(0)
    x = torch.randint(4, c.vocab_size, (b, s), generator=g)
    labels = torch.roll(x, -1, dims=1)
    labels[:, : s // 3] = -100
    labels[:, -1] = -100
    return x, labels


def bnb_cpu_ok() -> tuple[bool, str]:
    """Does bitsandbytes' NF4 Linear4bit run forward+backward on this CPU?"""
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        return False, f"bitsandbytes not installed ({e})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lin = bnb.nn.Linear4bit(64, 64, bias=False, compute_dtype=torch.float32,
                                    quant_type="nf4")
            lin = lin.to("cpu")
            x = torch.randn(2, 64, requires_grad=True)
            lin(x).sum().backward()
        return True, f"bitsandbytes {bnb.__version__} NF4 on CPU"
    except Exception as e:  # noqa: BLE001 - reported as the reason for the fp32 fallback
        return False, f"bitsandbytes 4-bit does not run on this CPU ({type(e).__name__}: {e})"


# ----------------------------------------------------------------------------- the sides
def _gguf_file(size: str, tmp: str) -> str:
    """The bench model (seed 0) written as a q8_0 GGUF in `tmp`: the same bytes on every call."""
    from falsify.llm import gguf_io
    from falsify.llm.model import build_model

    return str(gguf_io.write_gguf(build_model(_cfg(size), "torch", seed=0), f"{tmp}/base.gguf",
                                  gtype="q8_0"))


class Ours:
    def __init__(self, size: str, base: str = "nf4"):
        import tempfile

        from falsify.llm import finetune as FT
        from falsify.llm import gguf_io
        from falsify.llm import lora_model as LM
        from falsify.llm import sft_data as SD
        from falsify.llm.model import build_model

        if base == "nf4":
            self.name = "falsify QLoRA (NF4 + LoRA)"
            self.model = build_model(_cfg(size), "torch", seed=0)
            LM.apply_lora(self.model, LM.LoraSpec(method="qlora", r=RANK, alpha=ALPHA,
                                                  double_quant=True))
        else:
            self.name = "falsify LoRA on the q8_0 GGUF (fused dequantize-matmul)"
            with tempfile.TemporaryDirectory() as tmp:
                self.model, _ = gguf_io.base_model(_gguf_file(size, tmp), "torch")
            # the GGUF's quantized projections stay q8_0 blocks under either method
            LM.apply_lora(self.model, LM.LoraSpec(method="lora", r=RANK, alpha=ALPHA))
        cfg = FT.config_from_dict(dict(lr=LR, lr_min=LR, warmup_steps=0, max_steps=10**6,
                                       weight_decay=0.0, progress=False, device="cpu",
                                       backend="torch", lora_r=RANK, lora_alpha=ALPHA),
                                  source="bench")
        self.trainer = FT.FinetuneTrainer(self.model, cfg, torch.device("cpu"), None, "sft")
        x, labels = _batch(size)
        mask = labels != -100
        self.micro = [SD.Batch(x, labels, mask, torch.ones(len(x)), torch.arange(len(x)))]
        self.memory = LM.memory_bytes(self.model)

    def step(self) -> float:
        return self.trainer.train_step(self.micro).loss


class Theirs:
    def __init__(self, size: str, use_bnb: bool, base: str = "nf4"):
        import logging
        import tempfile

        from falsify.llm import hf
        from falsify.llm.model import build_model

        logging.getLogger("transformers").setLevel(logging.ERROR)
        from peft import LoraConfig, get_peft_model
        from transformers import BitsAndBytesConfig, LlamaForCausalLM

        if base == "q8_0":
            self.name = "transformers + peft on the q8_0 GGUF (dequantized to fp32 at load)"
        else:
            self.name = ("transformers + peft + bitsandbytes NF4" if use_bnb
                         else "transformers + peft, fp32 base (no NF4)")
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kw = dict(dtype=torch.float32, attn_implementation="sdpa")
            if base == "q8_0":
                kw["gguf_file"] = Path(_gguf_file(size, tmp)).name
                src = tmp
            else:
                src = f"{tmp}/base"
                hf.export_hf(build_model(_cfg(size), "torch", seed=0), src)
            if use_bnb and base == "nf4":
                kw.update(device_map="cpu", quantization_config=BitsAndBytesConfig(
                    load_in_4bit=True, bnb_4bit_quant_type="nf4",
                    bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32))
            model = LlamaForCausalLM.from_pretrained(src, **kw)
        self.model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA,
                                                     target_modules=TARGETS, lora_dropout=0.0,
                                                     task_type="CAUSAL_LM"))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                     weight_decay=0.0, foreach=False)
        self.x, labels = _batch(size)
        # HF shifts labels inside the loss: pass the unshifted targets (ours are next-token)
        self.labels = torch.cat([torch.full((len(labels), 1), -100), labels[:, :-1]], dim=1)
        self.model.train()

    def step(self) -> float:
        self.opt.zero_grad(set_to_none=True)
        loss = self.model(input_ids=self.x, labels=self.labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0, foreach=False)
        self.opt.step()
        return float(loss.detach())


def _make(which: str, size: str, use_bnb: bool, base: str):
    return Ours(size, base) if which == "ours" else Theirs(size, use_bnb, base)


def _import_side(which: str) -> None:
    """Import every module a side uses before the baseline RSS is read, so that "model
    resident" counts the model, not the libraries' code and import-time tables."""
    if which == "ours":
        import falsify.llm.finetune  # noqa: F401
    else:
        import peft  # noqa: F401
        import transformers  # noqa: F401
        from transformers import LlamaForCausalLM  # noqa: F401
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            pass
    import falsify.llm.gguf_io  # noqa: F401
    import falsify.llm.hf  # noqa: F401
    # torch.optim's first constructor lazily imports torch._dynamo, inductor, sympy and triton
    # (~145 MiB of library code). transformers imports them at import time; without this, only
    # our side would pay for that code inside the measured region.
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])


def measure_memory(which: str, size: str, use_bnb: bool, base: str) -> dict:
    """Peak RSS of building the model and running two steps, over the post-import baseline
    (so it includes however the side materialises its base: ours builds the fp32 model, then
    quantizes), and the RSS right after building."""
    _import_side(which)
    rss0 = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    side = _make(which, size, use_bnb, base)
    rss1 = _status("VmRSS")
    side.step()
    side.step()
    return {"model_rss": max(0, rss1 - rss0), "peak": max(0, _status("VmHWM") - rss0)}


def memory_in_subprocess(which: str, size: str, use_bnb: bool, base: str) -> dict:
    # through `python -m falsify`, so that this module is imported by its own name, never
    # re-executed as __main__ (falsify/bench/kernels.py says why that matters)
    r = subprocess.run([sys.executable, "-m", "falsify", "bench", "finetune", "--measure", which,
                        "--size", size, "--base", base] + (["--bnb"] if use_bnb else []),
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"memory measurement of {which} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _profile(side, steps: int) -> dict:
    """GEMM / attention / other ms per step of `steps` profiled steps (bench/train.py's split)."""
    from torch.profiler import ProfilerActivity, profile

    from falsify.bench.train import breakdown

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            side.step()
    return breakdown(prof.key_averages(), steps)


def run(size: str, steps: int, memory: bool, base: str = "nf4") -> dict:
    from falsify.bench.train import PROFILE_STEPS, ceiling_figures

    ok, why = bnb_cpu_ok()
    ours, theirs = Ours(size, base), Theirs(size, ok, base)
    for _ in range(2):  # warm-up (allocator, first-call paths)
        ours.step()
        theirs.step()
    t_o, t_t = [], []
    for _ in range(steps):
        for side, acc in ((ours, t_o), (theirs, t_t)):
            t0 = time.perf_counter()
            side.step()
            acc.append(time.perf_counter() - t0)
    x, _ = _batch(size)
    toks = x.numel()
    mo, mt = statistics.median(t_o), statistics.median(t_t)
    split = {"ours": _profile(ours, PROFILE_STEPS), "theirs": _profile(theirs, PROFILE_STEPS)}
    out = {"base": base, "base_label": BASES[base], "size": size, "model": SIZES[size],
           "rank": RANK, "alpha": ALPHA, "threads": torch.get_num_threads(),
           "ours_name": ours.name, "reference": theirs.name,
           "bnb": why if base == "nf4" else None,
           "ours_step_s": mo, "theirs_step_s": mt, "ours_tok_s": toks / mo,
           "theirs_tok_s": toks / mt, "tok_s_ratio": (toks / mo) / (toks / mt),
           "breakdown": split, "target_ratio": TARGET_RATIO,
           **ceiling_figures(mt, mo, split["ours"]["gemm_share"], TARGET_RATIO)}
    if base == "nf4":
        out["nf4_base"] = ours.memory
    if memory:
        m_o = memory_in_subprocess("ours", size, ok, base)
        m_t = memory_in_subprocess("theirs", size, ok, base)
        out.update(ours_memory=m_o, theirs_memory=m_t,
                   peak_ratio=m_o["peak"] / m_t["peak"] if m_t["peak"] else None,
                   model_rss_ratio=(m_o["model_rss"] / m_t["model_rss"]
                                    if m_t["model_rss"] else None))
    out["target_met"] = (out["tok_s_ratio"] >= TARGET_RATIO
                         and (not memory or (out["peak_ratio"] or 0.0) <= 1.0))
    return out


def register(sub) -> None:
    p = sub.add_parser("finetune", help="a LoRA step on NF4 and GGUF bases, ours vs HF + peft",
                       description=first_paragraph(__doc__))
    p.add_argument("--size", choices=list(SIZES), default="small")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side")
    p.add_argument("--base", choices=[*BASES, "all"], default="all",
                   help="the quantized base: NF4, the q8_0 GGUF, or both rows (default)")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--measure", choices=["ours", "theirs"], help=argparse.SUPPRESS)
    p.add_argument("--bnb", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_finetune)


def cmd_finetune(args) -> int:
    if args.steps < 1:
        raise UsageError(f"falsify bench finetune: --steps must be >= 1 (got {args.steps})")
    if args.measure:
        if args.base == "all":
            raise UsageError("falsify bench finetune --measure needs one --base")
        print(json.dumps(measure_memory(args.measure, args.size, args.bnb, args.base)))
        return 0
    bases = list(BASES) if args.base == "all" else [args.base]
    rows = _rows(args, bases)
    if args.format == "json":
        print(json.dumps({"rows": rows}, indent=1, default=str))
        return 0
    from rich.console import Console

    c = Console(width=160)
    for r in rows:
        _print_row(c, r)
    return 0


def _rows(args, bases: list[str]) -> list[dict]:
    """One row per quantized base, watched through the shared progress display on stderr
    (stdout is the table or JSON), redrawn between bases only, never while a step is timed: on
    a terminal bases done of total and an ETA; in a log one line per finished base."""
    from rich.console import Console

    from falsify.harness.progress import Progress

    rows = []
    with Progress(Console(stderr=True), "bases", total=len(bases), ticking=False) as view:
        for b in bases:
            view.start(f"{b} ({args.size}, {args.steps} steps per side)")
            t0 = time.monotonic()
            r = run(args.size, args.steps, not args.no_memory, b)
            rows.append(r)
            view.finished(f"bench finetune: {b}: ours {r['ours_tok_s']:.0f} tok/s, reference "
                          f"{r['theirs_tok_s']:.0f} tok/s, ratio {r['tok_s_ratio']:.2f}, "
                          f"{time.monotonic() - t0:.0f} s")
    return rows


def _print_row(c, r: dict) -> None:
    from rich.table import Table

    from falsify.bench.train import ceiling_sentence

    mb = 2.0**20
    m = r["model"]
    t = Table(title=f"falsify bench finetune — {r['base_label']} base — CPU, {r['threads']} "
                    f"threads, one LoRA step (L={m['num_layers']} H={m['hidden_size']} "
                    f"I={m['intermediate_size']} V={m['vocab_size']}, batch "
                    f"{m['batch']}x{m['max_seq_len']}, r={RANK}, 7 targets)")
    for col in ("", "ours", "reference", "ratio ours/ref"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row("implementation", r["ours_name"], r["reference"], "")
    t.add_row("step (median) s", f"{r['ours_step_s']:.3f}", f"{r['theirs_step_s']:.3f}",
              f"{r['ours_step_s'] / r['theirs_step_s']:.2f}")
    t.add_row("tokens/s", f"{r['ours_tok_s']:,.0f}", f"{r['theirs_tok_s']:,.0f}",
              f"{r['tok_s_ratio']:.2f}")
    b = r["breakdown"]
    t.add_row("GEMM ms per step (profiled share x median)",
              f"{b['ours']['gemm_share'] * r['ours_step_s'] * 1e3:.1f}",
              f"{b['theirs']['gemm_share'] * r['theirs_step_s'] * 1e3:.1f}", "")
    t.add_row("other ms per step",
              f"{(1 - b['ours']['gemm_share']) * r['ours_step_s'] * 1e3:.1f}",
              f"{(1 - b['theirs']['gemm_share']) * r['theirs_step_s'] * 1e3:.1f}", "")
    if "ours_memory" in r:
        o, h = r["ours_memory"], r["theirs_memory"]
        t.add_row("peak RSS, build + 2 steps, MiB", f"{o['peak'] / mb:.1f}",
                  f"{h['peak'] / mb:.1f}", f"{r['peak_ratio']:.2f}" if r["peak_ratio"] else "-")
        t.add_row("resident after build, MiB", f"{o['model_rss'] / mb:.1f}",
                  f"{h['model_rss'] / mb:.1f}",
                  f"{r['model_rss_ratio']:.2f}" if r["model_rss_ratio"] else "-")
    c.print(t)
    if r["bnb"]:
        c.print(f"reference: {r['reference']} — {r['bnb']}")
    nb = r.get("nf4_base")
    if nb:
        c.print(f"base projections: NF4 {nb['projections_stored'] / mb:.2f} MiB vs fp32 "
                f"{nb['projections_fp32'] / mb:.2f} MiB = 1/{1 / nb['projections_ratio']:.2f} "
                f"(double quantization); whole base incl. fp32 embedding and norms: "
                f"{nb['base_total'] / mb:.2f} vs {nb['base_total_fp32'] / mb:.2f} MiB = "
                f"1/{nb['base_total_fp32'] / nb['base_total']:.2f}")
    c.print(ceiling_sentence(r, TARGET_RATIO, "ref"))
    verdict = "[green]met[/]" if r["target_met"] else "[red]NOT met[/]"
    c.print(f"target {TARGET_RATIO}x tokens/s at <= the reference's peak memory: {verdict} "
            f"({r['tok_s_ratio']:.2f}x)")
