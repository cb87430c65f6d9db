"""`falsify generate [--model BASE] [--adapter DIR] [--merged DIR] (--prompt TEXT | --prompt-file F)
[--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]`

Samples the same prompt from the base, from base+adapter (with --adapter) and from a merged
model (with --merged, our or the HF layout), one panel each, so the adapter's effect and the
merge's faithfulness can be seen side by side. Without --model the adapter's recorded base is
used. Temperature 0 (the default) is greedy, so base+adapter and merged should agree.
"""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from falsify.llm import data as data_mod
from falsify.llm import finetune as FT
from falsify.llm import lora_model as LM
from falsify.llm.config import ConfigError
from falsify.llm.data import DataError
from falsify.llm.model import generate


def register(sub) -> None:
    p = sub.add_parser("generate", help="sample from a checkpoint: base, +adapter, merged",
                       description="sample from a base, base+adapter and a merged model")
    p.add_argument("--model", metavar="BASE", help="base model (our checkpoint or HF dir)")
    p.add_argument("--adapter", metavar="DIR", help="adapter written by `falsify finetune`")
    p.add_argument("--merged", metavar="DIR", help="merged model written by `falsify merge`")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt", help="prompt text")
    g.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-base", action="store_true", help="skip the base model's sample")
    p.add_argument("--backend", default="auto", choices=("torch", "triton", "auto"))
    p.set_defaults(func=cmd_generate)


def sample(model, tok, prompt: str, args) -> str:
    eos = tok.token_to_id(data_mod.EOS)
    ids = [eos] + data_mod.encode(tok, prompt)
    if len(ids) >= model.cfg.max_seq_len:
        raise DataError(f"the prompt is {len(ids)} tokens; the model's context is "
                        f"{model.cfg.max_seq_len}")
    n = min(args.max_new_tokens, model.cfg.max_seq_len - len(ids))
    gen = torch.Generator().manual_seed(args.seed)
    out = generate(model, torch.tensor([ids]), n, args.temperature, args.top_k, gen,
                   stop_id=eos)[0, len(ids):].tolist()
    return data_mod.decode(tok, [t for t in out if t != eos])


def cmd_generate(args) -> int:
    console = Console()
    if not (args.model or args.adapter or args.merged):
        console.print("[bold red]error:[/] give --model, --adapter and/or --merged")
        return 2
    if args.max_new_tokens < 1 or args.temperature < 0 or (args.top_k is not None
                                                           and args.top_k < 1):
        console.print("[bold red]error:[/] --max-new-tokens and --top-k must be >= 1, "
                      "--temperature >= 0")
        return 2
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text()
    panels = []
    try:
        tok = None
        if args.adapter:
            from falsify.cli.merge import load_adapted

            model, base, _ = load_adapted(args.adapter, args.model, args.backend, console)
            tp = Path(args.adapter) / "tokenizer.json"
            tok = data_mod.load_tokenizer(tp) if tp.is_file() else base.tokenizer
            if tok is None:
                raise ConfigError("no tokenizer.json in the adapter or next to the base")
            if not args.no_base:
                with LM.adapters_disabled(model):
                    panels.append((f"base ({base.source})", sample(model, tok, prompt, args)))
            panels.append((f"base + adapter ({args.adapter})", sample(model, tok, prompt,
                                                                      args)))
        elif args.model and not args.no_base:
            base = FT.load_base(args.model, args.backend)
            tok = base.tokenizer
            panels.append((f"base ({base.source})", sample(base.model, tok, prompt, args)))
        if args.merged:
            merged = FT.load_base(args.merged, args.backend)
            panels.append((f"merged ({args.merged})", sample(merged.model, merged.tokenizer,
                                                            prompt, args)))
    except (ConfigError, DataError, LM.LoraConfigError, FileNotFoundError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    console.print(Panel(Text(prompt), title="prompt", expand=False))
    for title, text in panels:
        console.print(Panel(Text(text), title=title, expand=False))
    return 0

