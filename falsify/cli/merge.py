"""`falsify merge --adapter DIR [--model BASE] --out DIR [--layout ours,hf]`
`falsify merge --method linear|slerp|ties|dare --models A B [...] [--base B0] --out DIR`
(A, B, ...: models, or adapter directories of one base)

With --adapter: writes a merged full-precision model: every adapted projection becomes
W' = deq(W) + (α/r)·B·A (deq = the NF4 dequantization the adapter was trained against, for
QLoRA), in our checkpoint layout (OUT/ours: model.safetensors + state.json, loadable as a
`--model` base) and/or the Hugging Face LLaMA layout (OUT/hf, falsify/llm/hf.py). Without --model
the
base recorded in the adapter is used; either way the base's fingerprint must equal the one the
adapter was trained on. The command then checks its own output: merged logits vs base+adapter
logits on a probe batch, against the fp32 op-order tolerance.

With --method: merges whole models (ours or HF layout, one architecture) tensor by tensor with
the contract-checked merging kernels (falsify/llm/model_merge.py): linear (--weights), slerp from
the first model to the second (--t), TIES (--base, --density, --lambda, --weights) or
DARE-linear (--base, --drop, --seed, --weights); it reports the perplexity on held-out code of
every input and of the result. --models may instead name adapter directories trained on one
base (linear, ties, dare): their task vectors ΔW_i = s_i·B_i·A_i go through the same kernels
with the base's ΔW = 0 as TIES/DARE's base, and the merged model is base + merged ΔW. --base
then names that base (default: the one the first adapter records); adapters of different
bases, and a mix of adapters and models, are refused.

A masked adapter (`falsify finetune --keep-masks` on a `falsify prune` output) merges to
W + M ⊙ (s·B·A): every pruned weight stays exactly 0, and the masks are written beside the
merged weights (masks.safetensors) so a later fine-tune can keep them again.

Exit codes: 0 done, 2 error, 4 self-check failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console

from falsify.llm import data as data_mod
from falsify.llm import finetune as FT
from falsify.llm import lora_model as LM
from falsify.llm import merge_stage as MS
from falsify.llm.config import ConfigError
from falsify.llm.data import DataError
from falsify.llm.finetune_base import load_adapted  # noqa: F401  (export, eval, generate)
from falsify.llm.merge_stage import write_ours  # noqa: F401  (tests)


def register(sub) -> None:
    p = sub.add_parser("merge", help="merge an adapter into its base, or models with each other",
                       description="merge a LoRA/QLoRA adapter into its base (fp32), or merge "
                       "models tensor by tensor")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--adapter", metavar="DIR",
                      help="adapter directory written by `falsify finetune`")
    mode.add_argument("--method", choices=("linear", "slerp", "ties", "dare"),
                      help="merge --models tensor by tensor")
    p.add_argument("--models", nargs="+", metavar="DIR", default=[],
                   help="with --method: the models (ours or HF layout, one architecture), or "
                   "adapter directories trained on one base (linear, ties, dare)")
    p.add_argument("--base", metavar="DIR", help="with ties/dare: the model task vectors are "
                   "taken against; with adapters: their shared base (default: the recorded one)")
    p.add_argument("--weights", default=None, help="comma-separated, one per model "
                   "(default: equal)")
    p.add_argument("--t", type=float, default=0.5, help="slerp: 0 = first model, 1 = second")
    p.add_argument("--density", type=float, default=1.0, help="ties: fraction of each task "
                   "vector kept")
    p.add_argument("--lambda", dest="lam", type=float, default=1.0, help="ties: scale of the "
                   "merged task vector")
    p.add_argument("--drop", type=float, default=0.5, help="dare: drop probability p")
    p.add_argument("--seed", type=int, default=0, help="dare: the drop masks' seed")
    p.add_argument("--no-perplexity", action="store_true",
                   help="with --method: skip the held-out perplexity of inputs and result")
    p.add_argument("--model", metavar="BASE",
                   help="the base (our checkpoint or HF dir); default: the adapter's recorded base")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--layout", default="ours,hf",
                   help="comma-separated: ours, hf (default: both)")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_merge)


def cmd_merge(args) -> int:
    console = Console()
    try:
        layouts = MS.parse_layouts(args.layout)
    except MS.MergeStageError as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    if args.method:
        return merge_models_cmd(args, layouts, console)
    if args.models or args.base:
        console.print("[bold red]error:[/] --models and --base go with --method, not --adapter")
        return 2
    try:
        r = MS.merge_adapter(args.adapter, Path(args.out), layouts, args.model, args.backend,
                             console)
    except (ConfigError, DataError, LM.LoraConfigError, FileNotFoundError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    return MS.show_adapter_merge(console, r)


def is_adapter_dir(path: str) -> bool:
    return (Path(path) / LM.FALSIFY_META).is_file()


def merge_adapters_cmd(args, spec, layouts: list[str], console) -> int:
    """--method over adapter directories: task vectors on their shared base (model_merge.
    merge_adapters). --base, if given, names that base; otherwise the one the first adapter
    records. Every adapter must have been trained on it (fingerprints)."""
    from falsify.llm import model_merge as MM

    try:
        spec.validate(len(args.models), True)  # the shared base is the task vectors' origin
        sides = [json.loads((Path(a) / LM.FALSIFY_META).read_text()) for a in args.models]
        fps = [sd.get("base_fingerprint") for sd in sides]
        for a, fp in zip(args.models, fps):
            if not fp:
                raise MM.MergeError(f"{a}: {LM.FALSIFY_META} records no base fingerprint: "
                                    "cannot tell which base it was trained on")
        for a, fp in zip(args.models[1:], fps[1:]):
            if fp != fps[0]:
                raise MM.MergeError(f"{a} and {args.models[0]} were trained on different bases "
                                    "(base fingerprints differ): adapters merge only over the "
                                    "base they share")
        base_path = args.base or sides[0].get("base_path")
        if not base_path:
            raise MM.MergeError(f"{args.models[0]} does not record its base; pass --base")
        loaded = [load_adapted(a, base_path, args.backend) for a in args.models]
        adapted = [m.eval() for m, _, _ in loaded]
        base = loaded[0][1]
        merged = MM.merge_adapters(spec, adapted, list(args.models)).eval()
        masks = [LM.model_masks(m) for m in adapted]
        keep = masks[0] if all(
            mk is not None and set(mk) == set(masks[0])
            and all(torch.equal(mk[k], masks[0][k]) for k in mk) for mk in masks) else None
        tok_path = next((str(Path(a) / "tokenizer.json") for a in args.models
                         if (Path(a) / "tokenizer.json").is_file()), base.tokenizer_path)
        meta = {"method": args.method, "adapters": [str(Path(a).resolve()) for a in args.models],
                "base": base.source, "spec": spec.__dict__}
        written = MS.write_layouts(merged, Path(args.out), layouts, tok_path, meta, keep)
    except (MM.MergeError, ConfigError, DataError, LM.LoraConfigError, FileNotFoundError,
            ValueError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    console.print(f"merged {len(adapted)} adapter(s) by {args.method} on their task vectors "
                  f"over {base.source}")
    if keep is not None:
        console.print("  every adapter keeps the same pruning masks: the merged model keeps "
                      f"them too ({LM.MASKS_FILE})")
    return show_written(console, args, written, tok_path, "adapters", lambda: (
        [("base (as the adapters were trained against)", LM.base_as_trained(adapted[0]))]
        + list(zip(args.models, adapted)) + [("merged", merged)]))


def merge_models_cmd(args, layouts: list[str], console) -> int:
    from falsify.llm import model_merge as MM

    try:
        weights = ([float(w) for w in args.weights.split(",")] if args.weights else [])
    except ValueError:
        console.print(f"[bold red]error:[/] --weights {args.weights!r}: comma-separated numbers")
        return 2
    spec = MM.MergeSpec(args.method, weights, args.t, args.density, args.lam, args.drop,
                        args.seed)
    adapters = [is_adapter_dir(m) for m in args.models]
    if any(adapters):
        if not all(adapters):
            a = next(m for m, k in zip(args.models, adapters) if k)
            b = next(m for m, k in zip(args.models, adapters) if not k)
            console.print(f"[bold red]error:[/] --models mixes adapters ({a}) and models ({b}): "
                          "give adapters trained on one base, or whole models (merge an "
                          "adapter into its base first with `falsify merge --adapter`)")
            return 2
        return merge_adapters_cmd(args, spec, layouts, console)
    try:
        spec.validate(len(args.models), args.base is not None)
        loaded = [FT.load_base(m, args.backend, need_tokenizer=False) for m in args.models]
        base = FT.load_base(args.base, args.backend, need_tokenizer=False) if args.base else None
        everyone = loaded + ([base] if base else [])
        MM.check_same_architecture([b.model for b in everyone], [b.source for b in everyone])
        merged = MM.merge_models(spec, [b.model for b in loaded], base.model if base else None)
        tok_path = next((b.tokenizer_path for b in everyone if b.tokenizer_path), None)
        meta = {"method": args.method, "models": [b.source for b in loaded],
                "base": base.source if base else None, "spec": spec.__dict__}
        written = MS.write_layouts(merged, Path(args.out), layouts, tok_path, meta)
    except (MM.MergeError, ConfigError, DataError, ValueError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    console.print(f"merged {len(loaded)} model(s) by {args.method}"
                  + (f" against {base.source}" if base else ""))
    return show_written(console, args, written, tok_path, "models",
                        lambda: [(b.source, b.model) for b in everyone] + [("merged", merged)])


def show_written(console, args, written: list[Path], tok_path: str | None, inputs: str,
                 rows) -> int:
    """A --method merge's directories written and, unless --no-perplexity, the held-out
    perplexity of each (label, model) of `rows()` (called only then: a row may build its
    model); the exit code, 0."""
    for w in written:
        console.print(f"  wrote {w}")
    if args.no_perplexity:
        return 0
    if tok_path is None:
        console.print(f"note: no tokenizer found for these {inputs}: no perplexity reported")
        return 0
    from falsify.llm import evaluate as EV

    tok = data_mod.load_tokenizer(tok_path)
    texts = [p.prompt + p.canonical_solution for p in EV.load_problems()]
    for label, m in rows():
        ppl = EV.perplexity(m, tok, texts)["perplexity"]
        console.print(f"  perplexity on held-out code: {ppl:.3f}  {label}")
    return 0
