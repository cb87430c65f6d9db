"""`falsify parity`: one model, one set of weights, one batch of tokens through several
backends against the float64 numpy reference, op by op.

    falsify parity [--model tiny] [--FIELD VALUE ...] [--checkpoint DIR]
                   [--backend reference,torch,triton] [--tokens N] [--seed S]
                   [--format table|json] [--plot FILE.png] [--grad] [--bisect]
                   [--bind KERNEL.BACKEND=module:function] [--train [--steps N]]

The bounds are model-parity-v1's (falsify/contracts/model-parity-v1.yaml): every layer's error
growth
≤ G = 4 over max(inherited, β), and 1 − cos(logits) ≤ ½ρ² with ρ = β·((4^L − 1)/3 + 1), β the
rounding one fp32 layer may add at this config (falsify/llm/parity.layer_budget). Exit codes: 0
every backend within them, 1 one is not (or, with --train, the runs separate within the
horizon), 2 bad input.

Every field of the model config is a flag overriding the preset's value (`--num-layers 2`);
`key=value` (`num_layers=2`) and `--backends` are the old forms, kept for this release.
"""

from __future__ import annotations

import json

from falsify.cli import config_flags as CF
from falsify.cli.common import resolve_user_binding
from falsify.errors import UsageError
from falsify.helptext import first_paragraph

KERNELS = ("linear", "rmsnorm", "rope", "attention", "swiglu", "embedding")
G = 4.0


def register(sub) -> None:
    p = sub.add_parser("parity", help="the whole model per backend vs the float64 reference",
                       description=first_paragraph(__doc__))
    p.intermixed = True  # key=value overrides may come before, between or after the flags
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="the old form of the model config flags, kept for this release "
                        "(they come last and win)")
    p.add_argument("--model", default="tiny", help="preset (default tiny)")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="a run's checkpoint (model.safetensors + state.json) instead of a "
                        "seeded random init")
    CF.add_renamed(p, "--backend", "--backends", dest="backends", default=None,
                   metavar="reference,torch,triton",
                   help="comma-separated from reference,torch,triton (default: all that can "
                        "run here; the float64 reference is always the trusted side)")
    p.add_argument("--tokens", type=int, default=32, help="random token ids (default 32)")
    p.add_argument("--seed", type=int, default=0, help="weights and tokens seed")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--plot", metavar="FILE.png", help="log relative error per point")
    p.add_argument("--grad", action="store_true",
                   help="also compare every parameter's gradient (cosine) with the reference's")
    p.add_argument("--bisect", action="store_true",
                   help="on failure, find the first op over budget and the kernel behind it")
    p.add_argument("--bind", action="append", default=[],
                   metavar="KERNEL.BACKEND=module:function",
                   help="run another function as one of the model's kernels (a mutant)")
    p.add_argument("--allow-any-import", action="store_true",
                   help="let --bind import a module from outside the project and the installed "
                        "packages (it runs that module's code)")
    p.add_argument("--train", action="store_true",
                   help="train two backends side by side and report where they separate")
    p.add_argument("--steps", type=int, default=50, help="--train steps (default 50, max 50)")
    from falsify.llm.model import ModelConfig

    CF.add_config_flags(p, [ModelConfig], title="model config fields",
                        description=" (default: the --model preset's value)",
                        show_defaults=False)
    p.set_defaults(func=cmd_parity)


# ------------------------------------------------------------------------------ input
def _value(key: str, s: str):
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    raise UsageError(f"model config field {key!r}: cannot parse {s!r} as a number")


def _overrides(items: list[str]) -> dict:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise UsageError(f"override {it!r}: expected key=value (e.g. num_layers=2)")
        out[k] = _value(k, v)
    return out


def _backends(spec: str | None) -> list[str]:
    """The compared backends (reference excluded: it is the trusted side). Named backends must
    run; the default takes every one that can and says which it left out."""
    from falsify.llm.ops import BackendUnavailableError, resolve_backend

    if spec is None:
        chosen = []
        for b in ("torch", "triton"):
            try:
                resolve_backend(b)
                chosen.append(b)
            except BackendUnavailableError as e:
                import sys
                print(f"note: backend {b} left out of the default: {e}", file=sys.stderr)
        return chosen
    names = [b.strip() for b in spec.split(",") if b.strip()]
    bad = [b for b in names if b not in ("reference", "torch", "triton")]
    if bad or not names:
        raise UsageError(f"--backend {spec!r}: unknown backend {', '.join(bad) or '(none)'} "
                         "(known: reference, torch, triton)")
    out = [b for b in names if b != "reference"]
    if not out:
        raise UsageError("--backend: name at least one of torch, triton to compare with the "
                         "reference")
    for b in out:
        try:
            resolve_backend(b)
        except BackendUnavailableError as e:
            raise UsageError(f"--backend {b}: {e}") from None
    return out


def _binds(items: list[str], allow_any_import: bool) -> dict[str, dict]:
    """{backend: {kernel: function}}."""
    out: dict[str, dict] = {}
    for b in items:
        key, sep, ref = b.partition("=")
        kernel, dot, backend = key.partition(".")
        if not sep or not dot or kernel not in KERNELS or backend not in ("torch", "triton"):
            raise UsageError(f"--bind {b!r}: expected KERNEL.BACKEND=module:function, KERNEL "
                             f"one of {', '.join(KERNELS)}, BACKEND torch or triton")
        out.setdefault(backend, {})[kernel] = resolve_user_binding(f"--bind {b!r}", ref,
                                                                   allow_any_import)
    return out


def _setup(args):
    from falsify.llm import parity as P

    over = _overrides(CF.config_overrides(args))
    if args.checkpoint:
        if over:
            raise UsageError("model config flags (and key=value overrides) apply to a preset, "
                             "not to --checkpoint")
        cfg, weights = P.load_checkpoint(args.checkpoint)
    else:
        cfg = P.config_from(args.model, over)
        weights = P.random_weights(cfg, args.seed)
    return P.Setup(cfg, weights, P.random_tokens(cfg, args.tokens, args.seed))


# ------------------------------------------------------------------------------ run
def cmd_parity(args) -> int:
    from falsify.llm import parity as P

    CF.note_old_form(args)
    if args.tokens < 1:
        raise UsageError(f"--tokens {args.tokens}: must be >= 1")
    if not 1 <= args.steps <= 50:
        raise UsageError(f"--steps {args.steps}: must be in [1, 50]")
    if args.plot and not args.plot.endswith(".png"):
        raise UsageError(f"--plot {args.plot}: must name a .png file")
    backends = _backends(args.backends)
    binds = _binds(args.bind, args.allow_any_import)
    for b in binds:
        if b not in backends:
            raise UsageError(f"--bind names backend {b}, which --backend does not compare")
    try:
        setup = _setup(args)
        ops = {b: P.ops_for(b, binds.get(b)) for b in backends}
    except P.ParityInputError as e:
        raise UsageError(str(e)) from None
    if args.train:
        return _train(args, setup, ops)
    cfg, s = setup.cfg, setup.ids.shape[1]
    beta = P.layer_budget(cfg, s)
    rho = beta * ((G ** cfg.num_layers - 1) / (G - 1) + 1)
    res = P.forward_parity(setup, ops)
    # ρ ≥ 1: the depth's worst case allows any direction; the growth bound still applies
    out = {"config": cfg.to_dict(), "tokens": s, "seed": args.seed, "beta": beta, "G": G,
           "cos_bound": 1 - 0.5 * rho ** 2 if rho < 1 else None, "backends": {}}
    ok = True
    for b, r in res.items():
        passed = (max(r["growth"], default=0.0) <= G
                  and 1 - r["logits"]["cosine"] <= 0.5 * rho ** 2)
        ok &= passed
        out["backends"][b] = {**r, "passed": passed}
        if args.grad:
            gr = P.grad_parity(setup, ops[b], args.seed)
            gpass = 1 - gr["grad_cos_min"] <= 0.5 * (3 * rho) ** 2
            ok &= gpass
            out["backends"][b].update(grad=gr, passed=passed and gpass)
    if args.bisect:
        from falsify.llm import parity_bisect as B

        out["bisect"] = {b: B.bisect(setup, ops[b], b) for b, r in out["backends"].items()
                         if not r["passed"]}
    if args.plot:
        from falsify.cli import charts

        names = [*next(iter(res.values()))["points"], "logits"] if res else []
        charts.line_chart(args.plot, {b: [*(v["rel"] for v in r["points"].values()),
                                          r["logits"]["rel"]] for b, r in res.items()},
                          log=True, xticks=names, xlabel="point", ylabel="relative error",
                          title="forward parity: relative error against the float64 model")
    if args.format == "json":
        print(json.dumps(out, indent=2, default=_jsonable))
    else:
        _table(out, args)
    return 0 if ok else 1


def _jsonable(o):
    return {k: v for k, v in o.items() if k not in ("y", "ref")} if isinstance(o, dict) else str(o)


def _fmt(x: float) -> str:
    return f"{x:.2e}"


def _table(out: dict, args) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    cfg = out["config"]
    con.print(f"model: L={cfg['num_layers']} H={cfg['hidden_size']} heads={cfg['num_heads']}/"
              f"{cfg['num_kv_heads']} I={cfg['intermediate_size']} V={cfg['vocab_size']}, "
              f"{out['tokens']} tokens, seed {out['seed']}; β = {_fmt(out['beta'])}, growth "
              f"bound {out['G']:g}, " + (f"1 − cos(logits) ≤ {_fmt(1 - out['cos_bound'])}"
                                         if out["cos_bound"] is not None else
                                         "logit cosine bound vacuous at this depth (ρ ≥ 1)"))
    for b, r in out["backends"].items():
        t = Table(title=f"{b} vs reference (float64)")
        for c in ("point", "1 − cos", "max rel", "mean rel", "rel (L2)", "growth"):
            t.add_column(c, justify="right" if c != "point" else "left")
        growth = {f"L{n}.block": g for n, g in enumerate(r["growth"])}
        for name, e in r["points"].items():
            g = growth.get(name)
            gs = "" if g is None else (f"[red]{g:.2f}[/]" if g > out["G"] else f"{g:.2f}")
            t.add_row(name, _fmt(1 - e["cosine"]), _fmt(e["max_rel"]), _fmt(e["mean_rel"]),
                      _fmt(e["rel"]), gs)
        lg = r["logits"]
        t.add_row("logits", _fmt(1 - lg["cosine"]), _fmt(lg["max_rel"]), _fmt(lg["mean_rel"]),
                  _fmt(lg["rel"]), "")
        con.print(t)
        line = (f"{b}: logits top-1 agreement {lg['top1']:.3f}, KL(ref‖{b}) {lg['kl']:.2e}, "
                f"1 − cos {1 - lg['cosine']:.2e}")
        if "grad" in r:
            line += (f"; gradient: worst cosine {r['grad']['grad_cos_min']:.12f} "
                     f"({r['grad']['grad_worst']})")
        con.print(line + (" — [green]PASS[/]" if r["passed"] else " — [red]FAIL[/]"))
    for rep in out.get("bisect", {}).values():
        con.print(f"bisect: {rep['message']}")
    if args.plot:
        names = ", ".join(f"{b} {c}" for b, c in zip(out["backends"], ("blue", "orange"),
                                                      strict=False))
        con.print(f"plot: {args.plot} (log10 relative error per point; {names})")


def _train(args, setup, ops) -> int:
    from falsify.llm import parity_train as T

    if len(ops) != 2:
        raise UsageError(f"--train compares exactly two backends; --backend gives "
                         f"{len(ops)} ({', '.join(ops) or 'none'}); e.g. --backend torch,triton")
    (a, oa), (b, ob) = ops.items()
    r = T.train_compare(setup, oa, ob, args.steps, args.seed)
    r.update(backends=[a, b])
    if args.format == "json":
        print(json.dumps(r, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"training: {a} vs {b}, {args.steps} steps")
        for c in ("step", f"loss {a}", f"loss {b}", "loss rel diff", "param drift", "budget"):
            t.add_column(c, justify="right")
        for row in r["steps"]:
            over = max(row["loss_rel"], row["param_drift"]) > row["budget"]
            mark = "[red]" if over else ""
            t.add_row(str(row["step"]), f"{row['loss_a']:.6f}", f"{row['loss_b']:.6f}",
                      mark + _fmt(row["loss_rel"]), mark + _fmt(row["param_drift"]),
                      _fmt(row["budget"]))
        con = Console()
        con.print(t)
        sep = r["separated_at"]
        con.print(f"separated at step {sep}" if sep else
                  f"no separation within {args.steps} steps (budget 2·ρ_g·t, ρ_g = "
                  f"{_fmt(r['rho_g'])})")
    return 1 if r["separated_at"] else 0

