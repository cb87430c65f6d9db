"""Bisection of a model-level parity failure to one kernel and the obligation it breaks.

1. The first point, in forward order, whose error leaves its budget: the embedding must be
   exact (error ≤ u); inside layer l every point may carry G·max(e_{l−1}, β) (the growth
   bound of model-parity-v1), with e_{l−1} the residual stream's error entering the layer;
   the final norm and the logits G·max(e_L, β).
2. That op is re-run kernel by kernel on the float64 reference's own input to each kernel,
   cast to fp32: what the kernel adds, without what it inherited.
3. The kernel with the largest isolated error (normwise relative, in units of β) is named,
   with its kernel contract and the obligation whose float32 tolerance its isolated output
   breaks, evaluated at this op's dimensions and magnitudes; when it breaks none, no
   kernel-level obligation covers the drift, a gap in the contracts.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from falsify.llm import parity as P

G = 4.0  # model-parity-v1's per-layer growth bound (PAR-GROW-001)
# kernel -> (contract, its float32 parity check) the isolated output is held to; `linear` is
# F.linear on every backend, which no kernel contract binds (gemm-kernel-v1 tests
# falsify/kernels/*/gemm.py, which the model does not call)
KERNEL_CHECKS = {"rmsnorm": ("rmsnorm-kernel-v1", "FALSIFY-RN-001"),
                 "rope": ("rope-kernel-v1", "FALSIFY-ROPE-001"),
                 "attention": ("attention-kernel-v1", "FALSIFY-ATT-001"),
                 "swiglu": ("swiglu-kernel-v1", "FALSIFY-SWG-001"),
                 "embedding": ("embedding-kernel-v1", "FALSIFY-EMB-001"),
                 "linear": (None, None)}


def first_failure(res: dict, num_layers: int, beta: float) -> tuple[str, float, float] | None:
    """(point, its error, its budget) of the first point over budget, or None."""
    pts = res["points"]
    if pts["embedding"]["rel"] > P.U32:
        return "embedding", pts["embedding"]["rel"], P.U32
    prev = pts["embedding"]["rel"]
    for n in range(num_layers):
        budget = G * max(prev, beta)
        for op in P.OPS:
            e = pts[f"L{n}.{op}"]["rel"]
            if e > budget:
                return f"L{n}.{op}", e, budget
        prev = pts[f"L{n}.block"]["rel"]
    budget = G * max(prev, beta)
    for name in ("final_norm",):
        if pts[name]["rel"] > budget:
            return name, pts[name]["rel"], budget
    if res["logits"]["rel"] > G * max(pts["final_norm"]["rel"], beta):
        return "logits", res["logits"]["rel"], G * max(pts["final_norm"]["rel"], beta)
    return None


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).float()


def _rel(y: torch.Tensor, r: np.ndarray) -> float:
    return float(np.linalg.norm(y.double().numpy() - r) / max(np.linalg.norm(r), 1e-300))


def isolate(point: str, setup: P.Setup, ref: dict, ops) -> list[dict]:
    """Each kernel of `point`'s op run on the reference's input to it: [{kernel, where,
    y (fp32 output), ref (float64), dims}]."""
    cfg, params = setup.cfg, P.ref_params(setup.weights)
    w = {k: v.float() for k, v in setup.weights.items()}
    out = []

    def add(kernel, where, y, r, **dims):
        out.append({"kernel": kernel, "where": where, "y": y.detach(), "ref": r, "dims": dims})

    with torch.no_grad():
        if point == "embedding":
            add("embedding", "embed_tokens", ops.embedding(setup.ids, w["embed_tokens.weight"]),
                ref["embedding"])
            return out
        if point in ("final_norm", "logits"):
            if point == "final_norm":
                x = ref[f"L{cfg.num_layers - 1}.block"] if cfg.num_layers else ref["embedding"]
                add("rmsnorm", "norm", ops.rmsnorm(_t(x), w["norm.weight"], cfg.rms_norm_eps),
                    ref["final_norm"], n=cfg.hidden_size)
            else:
                add("linear", "lm_head", ops.linear(_t(ref["final_norm"]),
                                                    w["embed_tokens.weight"]),
                    ref["logits"], k=cfg.hidden_size)
            return out
        layer, op = point.split(".")
        n = int(layer[1:])
        p = f"layers.{n}."
        x_in = ref[f"L{n - 1}.block"] if n else ref["embedding"]
        x_mid = x_in + ref[f"L{n}.attn"]
        if op == "attn_norm":
            add("rmsnorm", p + "input_layernorm",
                ops.rmsnorm(_t(x_in), w[p + "input_layernorm.weight"], cfg.rms_norm_eps),
                ref[point], n=cfg.hidden_size)
        elif op == "mlp_norm":
            add("rmsnorm", p + "post_attention_layernorm",
                ops.rmsnorm(_t(x_mid), w[p + "post_attention_layernorm.weight"],
                            cfg.rms_norm_eps), ref[point], n=cfg.hidden_size)
        elif op == "attn":
            _isolate_attention(add, setup, ref, ops, w, params, n)
        elif op == "mlp":
            _isolate_mlp(add, ref, ops, w, params, n, cfg.hidden_size, cfg.intermediate_size)
        elif op == "block":  # each branch within budget, the sum not: the residual add
            add("residual add", p[:-1], _t(x_mid) + _t(ref[f"L{n}.mlp"]), ref[point])
    return out


def _isolate_attention(add, setup: P.Setup, ref: dict, ops, w: dict, params: dict,
                       n: int) -> None:
    """Layer n's attention: q/k/v projections, RoPE on q and k, attention, o projection, each
    on the reference's input to it."""
    from falsify.reference import model as R

    cfg = setup.cfg
    b, s = setup.ids.shape
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    pos = torch.arange(s)
    p, point = f"layers.{n}.", f"L{n}.attn"
    a = ref[f"L{n}.attn_norm"]
    lin = {}
    for nm, heads in (("q", hq), ("k", hkv), ("v", hkv)):
        wn = p + f"self_attn.{nm}_proj.weight"
        lin[nm] = (a @ params[wn].T).reshape(b, s, heads, d)
        add("linear", wn[:-7], ops.linear(_t(a), w[wn]), a @ params[wn].T,
            k=cfg.hidden_size)
    cos, sin = R.rope_tables(s, d, cfg.rope_theta)
    rot = {}
    for nm in ("q", "k"):
        rot[nm] = R.rope_fwd(lin[nm], cos, sin)
        add("rope", p + f"self_attn ({nm})", ops.rope(_t(lin[nm]), pos, cfg.rope_theta),
            rot[nm], d=d, s=s)
    qh, kh, vh = (np.ascontiguousarray(z.transpose(0, 2, 1, 3))
                  for z in (rot["q"], rot["k"], lin["v"]))
    o, _ = R.attention_fwd(qh, kh, vh, 1.0 / math.sqrt(d))
    add("attention", p + "self_attn", ops.attention(
        _t(qh), _t(kh), _t(vh), causal=True, scale=1.0 / math.sqrt(d)), o, d=d, s=s,
        vmax=float(np.abs(vh).max()), qk=float(np.abs(qh).max() * np.abs(kh).max()))
    o2 = o.transpose(0, 2, 1, 3).reshape(b, s, hq * d)
    wn = p + "self_attn.o_proj.weight"
    add("linear", wn[:-7], ops.linear(_t(o2), w[wn]), ref[point], k=hq * d)


def _isolate_mlp(add, ref: dict, ops, w: dict, params: dict, n: int, hidden: int,
                 intermediate: int) -> None:
    """Layer n's MLP: gate and up projections, SwiGLU, down projection."""
    from falsify.reference import model as R

    p, point = f"layers.{n}.", f"L{n}.mlp"
    m = ref[f"L{n}.mlp_norm"]
    gate = m @ params[p + "mlp.gate_proj.weight"].T
    up = m @ params[p + "mlp.up_proj.weight"].T
    for nm, r in (("gate", gate), ("up", up)):
        wn = p + f"mlp.{nm}_proj.weight"
        add("linear", wn[:-7], ops.linear(_t(m), w[wn]), r, k=hidden)
    act = gate * R._sigmoid(gate) * up
    add("swiglu", p + "mlp", ops.swiglu(_t(gate), _t(up)), act,
        gmax=float(np.abs(gate).max()))
    wn = p + "mlp.down_proj.weight"
    add("linear", wn[:-7], ops.linear(_t(act), w[wn]), ref[point],
        k=intermediate)


def kernel_verdict(kernel: str, y: torch.Tensor, r: np.ndarray, dims: dict) -> dict:
    """Whether the isolated output breaks its kernel contract's float32 parity tolerance:
    {contract, check, obligation, broken, worst (max |err| / allowed)}. Absolute tolerances
    derived for unit-bounded inputs (attention's: |q|, |k|, |v| ≤ 1) are scaled by this op's
    magnitudes."""
    from falsify.harness import expr, runtime

    cid, chk = KERNEL_CHECKS.get(kernel, (None, None))
    if cid is None:
        return {"contract": None, "check": None, "obligation": None, "broken": None}
    c = runtime.contract(cid)
    check = next(t for t in c.checks if t.id == chk)
    tol = (check.spec.get("tolerance") or {}).get("float32") or {"atol": 0.0}
    yd = y.double().numpy()
    ref_max = float(np.abs(r).max())
    env = {k: v for k, v in dims.items() if k not in ("vmax", "qk")}
    atol = expr.tolerance_value(tol.get("atol", 0.0), "float32", env, ref_max)
    rtol = expr.tolerance_value(tol.get("rtol", 0.0), "float32", env, ref_max)
    if kernel == "attention":
        atol *= dims["vmax"] * max(1.0, dims["qk"])
    allowed = atol + rtol * np.abs(r)
    err = np.abs(yd - r)
    worst = float(np.max(err / np.maximum(allowed, 1e-300)))
    return {"contract": cid, "check": chk, "obligation": check.obligation,
            "broken": bool((err > allowed).any()), "worst": worst}


def bisect(setup: P.Setup, ops, backend: str) -> dict:
    """The bisection report for one backend (see the module docstring)."""
    params = P.ref_params(setup.weights)
    ref = P.capture_reference(params, setup.ids.numpy(), P.ref_config(setup.cfg))
    beta = P.layer_budget(setup.cfg, setup.ids.shape[1])
    res = P.compare(P.capture_torch(P.torch_model(setup.cfg, setup.weights, ops), setup.ids),
                    ref, setup.cfg.num_layers, beta)
    first = first_failure(res, setup.cfg.num_layers, beta)
    report = {"backend": backend, "beta": beta, "first": None, "kernels": [], "culprit": None,
              "message": ""}
    if first is None:
        report["message"] = (f"{backend}: every point within its budget (G·max(inherited, β), "
                             f"β = {beta:.2e}): nothing to bisect")
        return report
    point, err, budget = first
    report["first"] = {"point": point, "rel": err, "budget": budget}
    rows = []
    for iso in isolate(point, setup, ref, ops):
        rel = _rel(iso["y"], iso["ref"])
        row = {"kernel": iso["kernel"], "where": iso["where"], "isolated_rel": rel,
               "in_beta": rel / beta}
        if iso["kernel"] in KERNEL_CHECKS:
            row.update(kernel_verdict(iso["kernel"], iso["y"], iso["ref"], iso["dims"]))
        rows.append(row)
    report["kernels"] = rows
    worst = max(rows, key=lambda r: r["isolated_rel"])
    head = (f"{backend}: first over budget: {point} (relative error {err:.2e} > budget "
            f"{budget:.2e}).")
    if worst["isolated_rel"] <= beta:
        report["message"] = (f"{head} Re-run on the reference's inputs, no kernel of it adds "
                             f"more than β = {beta:.2e}: the drift is inherited, compounded "
                             "from earlier layers, not added here")
        return report
    report["culprit"] = worst
    what = (f"kernel `{worst['kernel']}` at {worst['where']} adds {worst['isolated_rel']:.2e} "
            f"on the reference's input ({worst['in_beta']:.0f}·β)")
    if worst.get("broken"):
        report["message"] = (f"{head} {what}: it breaks {worst['obligation']} of "
                             f"falsify/contracts/{worst['contract']}.yaml ({worst['check']}: "
                             f"{worst['worst']:.1f}× its float32 tolerance)")
    elif worst.get("contract"):
        report["message"] = (f"{head} {what}, yet within {worst['obligation']} of "
                             f"falsify/contracts/{worst['contract']}.yaml ({worst['check']}, "
                             f"{worst['worst']:.2f}× its tolerance): no kernel-level obligation "
                             "covers it, which is a gap in the contracts (judged on the forward "
                             "output the model uses; the contract's other checks, its gradient "
                             "or layouts, may still catch the bug)")
    else:
        report["message"] = (f"{head} {what}: no kernel-level obligation covers it, which is a "
                             "gap in the contracts (the model's `linear` is F.linear, bound in "
                             "no kernel contract; gemm-kernel-v1 tests falsify/kernels/*/gemm.py)")
    return report
