"""model-parity-v1's probes: one small model, one seeded batch, through the backend's kernels
(built from the contract's bindings, so a bound mutant is what the model runs) and through the
float64 reference model (falsify/reference/model.py).

Several checks read one run: the forward comparison, the gradient comparison and greedy
decoding are memoised on (backend, config, seed, every binding), so a run with a mutant bound
is never answered from one without it.
"""

from __future__ import annotations

CONTRACT = "model-parity-v1"
# contract equation -> the Ops field it fills
EQUATIONS = ("linear", "rmsnorm", "rope", "attention", "swiglu", "embedding")
U32 = 2.0 ** -24


def _refs(backend: str) -> dict:
    from falsify.harness import backends, runtime

    c = runtime.contract(CONTRACT)
    return {eq: backends.binding_ref(c, eq, backend)[0] for eq in EQUATIONS}


def _setup(layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
           vocab: int, tokens: int, init_std: float, seed: int):
    from falsify.llm import parity as P

    cfg = P.config_from("tiny", dict(
        vocab_size=vocab, hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, intermediate_size=intermediate, max_seq_len=2 * tokens,
        init_std=init_std))
    return P.Setup(cfg, P.random_weights(cfg, seed), P.random_tokens(cfg, tokens, seed))


_MEMO: dict = {}


def model_parity_run(backend: str = "torch", dtype: str = "float32", layers: int = 3,
                     hidden: int = 64, heads: int = 2, kv_heads: int = 1,
                     intermediate: int = 160, vocab: int = 256, tokens: int = 16,
                     init_std: float = 0.2, seed: int = 0, greedy: int = 4) -> dict:
    """Forward, gradient and greedy-decoding parity of the model on `backend` against the
    float64 reference. Returns flat numbers the predicates read: logit cosine, top-1, KL,
    the per-layer growth, the derived per-layer budget β, the worst parameter-gradient
    cosine, and greedy agreement."""
    if dtype != "float32":
        raise ValueError(f"dtype={dtype!r}: the model-parity probe runs float32 only")
    refs = _refs(backend)
    key = (backend, layers, hidden, heads, kv_heads, intermediate, vocab, tokens, init_std,
           seed, greedy, tuple(sorted(refs.items())))
    if key not in _MEMO:
        _MEMO[key] = _run(backend, refs, _setup(layers, hidden, heads, kv_heads, intermediate,
                                                vocab, tokens, init_std, seed), seed, greedy)
    return _MEMO[key]


def _run(backend: str, refs: dict, setup, seed: int, greedy: int) -> dict:
    from falsify.harness import backends
    from falsify.llm import parity as P

    ops = P.ops_for(backend, {eq: backends.resolve(ref) for eq, ref in refs.items()})
    fwd = P.forward_parity(setup, {backend: ops})[backend]
    grad = P.grad_parity(setup, ops, seed)
    dec = P.greedy_parity(setup, ops, greedy)
    lg = fwd["logits"]
    return {"backend": backend, "layers": setup.cfg.num_layers,
            "beta": P.layer_budget(setup.cfg, setup.ids.shape[1]), "u32": U32,
            "logit_cos": lg["cosine"], "logit_rel": lg["rel"], "top1": lg["top1"],
            "kl": lg["kl"], "growth": fwd["growth"],
            "block_rel": [fwd["points"][f"L{n}.block"]["rel"]
                          for n in range(setup.cfg.num_layers)],
            "grad_cos_min": grad["grad_cos_min"], "grad_worst": grad["grad_worst"],
            **dec}
