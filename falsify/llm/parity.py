"""Model-level parity: one config, one set of weights, one batch of tokens through several
backends, compared op by op against the float64 numpy reference (falsify/reference/model.py).

Per-kernel contracts bound each kernel's error on its own; this measures what they add up to
over a whole model, where accumulation-order differences compound layer by layer. The torch
model is instrumented with forward hooks (its arithmetic is untouched); the reference's points
are read from the cache its forward returns (the same float64 values, no second forward).

Points, in forward order: `embedding`; per layer `L<n>.attn_norm`, `L<n>.attn` (the attention
block's output before the residual add), `L<n>.mlp_norm`, `L<n>.mlp`, `L<n>.block` (the
residual stream after the layer); `final_norm`; `logits`.

Errors are normwise, so a near-zero element cannot blow them up: rel = ‖y − r‖₂/‖r‖₂,
max_rel = max|y − r| / max|r|, mean_rel = mean|y − r| / mean|r|. The growth of layer n is
rel(L<n>.block) / max(rel(previous residual stream), β), β the rounding one fp32 layer may
add (`layer_budget`): below β the inherited error is rounding noise, and dividing by it (an
exact embedding has error 0) would report noise as growth.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from falsify.llm.model import ModelConfig, Transformer, preset
from falsify.llm.ops import Ops, get_ops

U32 = 2.0 ** -24  # fp32 unit roundoff
DTYPES = {"float32": torch.float32}
OPS = ("attn_norm", "attn", "mlp_norm", "mlp", "block")


class ParityInputError(ValueError):
    """Bad input (a preset, override, checkpoint or backend that cannot be used): one line."""


# ------------------------------------------------------------------------------ inputs
def config_from(model: str, overrides: dict) -> ModelConfig:
    from falsify.llm.model import ModelConfigError

    try:
        return preset(model, **overrides)
    except (ModelConfigError, TypeError) as e:
        raise ParityInputError(f"--model {model}: {e}") from None


def load_checkpoint(path: str | Path) -> tuple[ModelConfig, dict]:
    """(config, fp32 state dict) of a run's checkpoint: model.safetensors + state.json."""
    from safetensors.torch import load_file

    d = Path(path)
    st, weights = d / "state.json", d / "model.safetensors"
    for f in (st, weights):
        if not f.is_file():
            raise ParityInputError(f"--checkpoint {d}: {f.name} not found")
    try:
        state = json.loads(st.read_text())
        mc = state["config"]["model"]
        cfg = ModelConfig(**mc)
        cfg.validate()
    except (ValueError, KeyError, TypeError) as e:
        raise ParityInputError(f"--checkpoint {d}: state.json has no usable config.model "
                               f"({type(e).__name__}: {e})") from None
    try:
        sd = load_file(str(weights))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own types; one line out
        raise ParityInputError(f"--checkpoint {d}: model.safetensors unreadable ({e})") from None
    from falsify.reference.model import param_shapes

    want = param_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if got != want:
        bad = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k] != got[k])
        raise ParityInputError(f"--checkpoint {d}: model.safetensors does not match state.json's "
                               f"config (first mismatch: {bad[0]})")
    return cfg, {k: v.float() for k, v in sd.items()}


def random_weights(cfg: ModelConfig, seed: int) -> dict:
    """The model's own seeded init (build_model), as an fp32 state dict."""
    from falsify.llm.model import build_model

    return {k: v.detach().clone() for k, v in build_model(cfg, "torch", seed=seed)
            .state_dict().items()}


def random_tokens(cfg: ModelConfig, n: int, seed: int, batch: int = 1) -> torch.Tensor:
    if not 1 <= n <= cfg.max_seq_len:
        raise ParityInputError(f"--tokens {n}: must be in [1, max_seq_len={cfg.max_seq_len}]")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, n), generator=g)


def ref_config(cfg: ModelConfig):
    from falsify.reference.model import RefModelConfig

    return RefModelConfig(**{f.name: getattr(cfg, f.name)
                             for f in dataclasses.fields(RefModelConfig)})


def ops_for(backend: str, bindings: dict | None = None) -> Ops:
    """The model's kernel bundle for `backend`, with `bindings` (kernel -> function) in place
    of the bundle's own: the contract's probe passes its equations' bound functions here, so
    a mutant bound in the contract is what the model runs."""
    from falsify.llm.ops import BackendUnavailableError

    try:
        ops = get_ops(backend)
    except (BackendUnavailableError, ValueError) as e:
        raise ParityInputError(f"--backend {backend}: {e}") from None
    return dataclasses.replace(ops, **(bindings or {}))


def torch_model(cfg: ModelConfig, weights: dict, ops: Ops) -> Transformer:
    with torch.device("meta"):
        m = Transformer(cfg, ops=ops)
    m = m.to_empty(device="cpu")
    m.load_state_dict(weights)
    return m.eval()


# ------------------------------------------------------------------------------ capture
def capture_torch(model: Transformer, ids: torch.Tensor) -> dict[str, np.ndarray]:
    """Every point's output as float64, from forward hooks (the forward is the model's own)."""
    out: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(name):
        def hook(_mod, _args, y):
            out[name] = y.detach()
        return hook

    hooks.append(model.layers[0].register_forward_pre_hook(
        lambda _m, args: out.__setitem__("embedding", args[0].detach())))
    for n, layer in enumerate(model.layers):
        for name, mod in (("attn_norm", layer.input_layernorm), ("attn", layer.self_attn),
                          ("mlp_norm", layer.post_attention_layernorm), ("mlp", layer.mlp),
                          ("block", layer)):
            hooks.append(mod.register_forward_hook(keep(f"L{n}.{name}")))
    hooks.append(model.norm.register_forward_hook(keep("final_norm")))
    try:
        with torch.no_grad():
            out["logits"] = model(ids)
    finally:
        for h in hooks:
            h.remove()
    return {k: v.double().numpy() for k, v in out.items()}


def ref_params(weights: dict) -> dict:
    return {k: v.double().numpy() for k, v in weights.items()}


def capture_reference(params: dict, ids: np.ndarray, rcfg) -> dict[str, np.ndarray]:
    """The same points from the reference forward's cache: each block output is the product
    the forward computed (o·Woᵀ, act·Wdᵀ), recomputed with the same float64 operations."""
    from falsify.reference import model as R

    logits, cache = R.forward(params, ids, rcfg)
    out = {"embedding": cache["layers"][0]["x_in"] if cache["layers"] else None}
    for n, c in enumerate(cache["layers"]):
        p = f"layers.{n}."
        attn = c["o"] @ params[p + "self_attn.o_proj.weight"].T
        mlp = c["act"] @ params[p + "mlp.down_proj.weight"].T
        out.update({f"L{n}.attn_norm": c["a"], f"L{n}.attn": attn, f"L{n}.mlp_norm": c["m"],
                    f"L{n}.mlp": mlp, f"L{n}.block": c["x_mid"] + mlp})
    out["final_norm"] = cache["xf"]
    out["logits"] = logits
    return out


# ------------------------------------------------------------------------------ metrics
def errors(y: np.ndarray, r: np.ndarray) -> dict:
    d = y - r
    nr = float(np.linalg.norm(r))
    # clipped at 1: float64 rounding of an exact match can land a hair above it
    cos = min(1.0, float(np.dot(y.ravel(), r.ravel()) / (np.linalg.norm(y) * nr))) if nr else 1.0
    return {"cosine": cos, "rel": float(np.linalg.norm(d)) / nr if nr else 0.0,
            "max_rel": float(np.abs(d).max() / np.abs(r).max()),
            "mean_rel": float(np.abs(d).mean() / np.abs(r).mean())}


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def logit_metrics(y: np.ndarray, r: np.ndarray) -> dict:
    lp, lq = log_softmax(r), log_softmax(y.astype(np.float64))
    kl = float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))
    return {**errors(y, r), "top1": float(np.mean(y.argmax(-1) == r.argmax(-1))), "kl": kl}


def layer_budget(cfg: ModelConfig, tokens: int) -> float:
    """β: the normwise relative rounding error one fp32 decoder layer may add, in the
    random-walk model of rounding (√K·u for a length-K reduction, u = 2⁻²⁴; [higham2002] §3.5): the
    q/k/v, o, gate and up GEMMs reduce over H, the down GEMM over I, attention over d (the
    scores) and s (the P·V sum), plus 10·u for the two norms, RoPE and SwiGLU's elementwise
    roundings."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    return (4 * math.sqrt(h) + math.sqrt(i) + math.sqrt(d) + math.sqrt(tokens) + 10) * U32


def compare(points: dict, ref: dict, num_layers: int, beta: float) -> dict:
    """Per point errors, per layer growth (floored at β), logit metrics."""
    rows = {k: errors(points[k], ref[k]) for k in ref if k != "logits" and ref[k] is not None}
    growth, prev = [], rows["embedding"]["rel"] if "embedding" in rows else 0.0
    for n in range(num_layers):
        e = rows[f"L{n}.block"]["rel"]
        growth.append(e / max(prev, beta))
        prev = e
    return {"points": rows, "growth": growth, "logits": logit_metrics(points["logits"],
                                                                       ref["logits"])}


# ------------------------------------------------------------------------------ runs
@dataclasses.dataclass
class Setup:
    cfg: ModelConfig
    weights: dict
    ids: torch.Tensor


def forward_parity(setup: Setup, backends: dict[str, Ops]) -> dict:
    """{backend: compare(...)} for each named Ops bundle, against the float64 reference."""
    params = ref_params(setup.weights)
    ref = capture_reference(params, setup.ids.numpy(), ref_config(setup.cfg))
    beta = layer_budget(setup.cfg, setup.ids.shape[1])
    return {name: compare(capture_torch(torch_model(setup.cfg, setup.weights, ops), setup.ids),
                          ref, setup.cfg.num_layers, beta) for name, ops in backends.items()}


def grad_parity(setup: Setup, ops: Ops, seed: int) -> dict:
    """Cosine of ∇θ mean-CE (the training loss, through the model's fused head + CE) with the
    float64 reference's hand-written backward, per parameter; min over parameters."""
    from falsify.reference import model as R

    g = torch.Generator().manual_seed(seed + 1)
    tgt = torch.randint(0, setup.cfg.vocab_size, setup.ids.shape, generator=g)
    m = torch_model(setup.cfg, setup.weights, ops).train()
    total, n = m.loss_sum(setup.ids, tgt)
    (total / n).backward()
    loss = float(total.detach()) / n
    params = ref_params(setup.weights)
    loss_ref, grads, _ = R.loss_and_grads(params, [(setup.ids.numpy(), tgt.numpy())],
                                          ref_config(setup.cfg))
    cos = {}
    for name, p in m.named_parameters():
        a, b = p.grad.double().numpy().ravel(), grads[name].ravel()
        cos[name] = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    worst = min(cos, key=cos.get)
    return {"grad_cos_min": cos[worst], "grad_worst": worst, "grad_cos": cos,
            "loss_rel": abs(loss - loss_ref) / abs(loss_ref)}


def greedy_parity(setup: Setup, ops: Ops, n_new: int) -> dict:
    """Greedy decoding of `n_new` tokens after setup.ids, backend vs reference. Where they part,
    the reference's top-2 margin there is reported: a margin within the logits' error is a
    tie, which no fp32 computation is obliged to break the reference's way."""
    from falsify.reference import model as R

    params, rcfg = ref_params(setup.weights), ref_config(setup.cfg)
    m = torch_model(setup.cfg, setup.weights, ops)
    ids = setup.ids[:1]
    agree, margin, diff_at = 0, None, None
    with torch.no_grad():
        for _ in range(n_new):
            zr, _ = R.forward(params, ids.numpy(), rcfg)
            zr = zr[0, -1]
            zb = m(ids)[0, -1].double().numpy()
            tr, tb = int(zr.argmax()), int(zb.argmax())
            if tr != tb:
                top2 = np.sort(zr)[-2:]
                margin, diff_at = float(top2[1] - top2[0]), float(np.abs(zb - zr).max())
                break
            agree += 1
            ids = torch.cat([ids, torch.tensor([[tr]])], 1)
    return {"greedy_n": n_new, "greedy_agree": agree, "greedy_margin": margin,
            "greedy_logit_err": diff_at}
