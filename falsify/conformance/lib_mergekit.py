"""mergekit 0.1.5 (PyPI `mergekit`, Arcee AI): its per-tensor merge kernels against
merging-kernel-v1.

Bound:
- `linear`: `mergekit.merge_methods.linear.linear_merge` (its implementation over a
  `TensorBatch`, `normalize=True`), the contract's Σ w_i θ_i / Σ w_i;
- `slerp`: `mergekit.merge_methods.slerp.slerp_merge_method` (its implementation over a
  `TensorBatch` with a as the base: `slerp(t, v0, v1)`, DOT_THRESHOLD 0.9995, the linear
  fallback, norms over the whole tensor);
- `ties`: the registry's `ties` method (`GeneralizedTaskArithmeticMerge`: magnitude
  sparsification, consensus "sum", `normalize=True`, `rescale=False`, `lambda`) through its
  `merge_group` on a `TensorGroup` whose base is entry 0.

mergekit's kernels take a leading output-batch axis (`TensorBatch`: each tensor [outputs,
*weight_shape]); the adapters add it (`x[None]`) and take it off (`[0]`), a view each way.
Weights and densities are per-input parameters in mergekit (floats from a merge config): the
adapters hand them over as Python floats (`Tensor.tolist()`, exact for fp32/fp16 values).

Not bound:
- `dare_linear`: the contract's equation is a function of (seed, shape): its mask is numpy's
  PCG64 draw `default_rng(seed).random(shape) >= p` and survivors are rescaled by 1/(1 − p).
  mergekit's `sparsify.bernoulli` takes no seed or mask (it calls `torch.bernoulli` on torch's
  global generator) and rescales by the L1-norm ratio ‖τ‖₁/‖masked τ‖₁
  (`rescaled_masked_tensor`), so no adapter can make it compute the contract's deterministic
  value without replacing its arithmetic; tests/test_merging_impl.py compares it with a patched
  mask and in distribution instead.
- `trim`: mergekit's `sparsify.magnitude(x, density)` computes the same top-K magnitude mask
  but returns only x·mask; the contract's `trim` returns (trimmed, keep), and the mask cannot be
  read back from the product (a kept zero looks dropped) without recomputing it. Its trim is
  judged inside `ties`.
"""

from __future__ import annotations

import torch

from falsify.conformance.registry import Binding, Finding, Library


def linear(thetas, weights):
    """linear_merge over a TensorBatch of the k models ([1, m, n] each), weight [1, k]."""
    from mergekit.merge_methods.base import TensorBatch
    from mergekit.merge_methods.linear import linear_merge

    batch = TensorBatch(tensors=tuple(t[None] for t in thetas.unbind(0)))
    return linear_merge.implementation(batch, weight=weights[None], normalize=True)[0]


def slerp(t, a, b):
    """The `slerp` merge method's implementation (`slerp_merge_method`: a floating-point check,
    then `slerp(t, base, other)`) over a TensorBatch (a, b) whose base is a; t as its
    one-element batch parameter (float64: mergekit casts it to its float32 working dtype)."""
    from mergekit.merge_methods.base import TensorBatch
    from mergekit.merge_methods.slerp import slerp_merge_method

    batch = TensorBatch(tensors=(a[None], b[None]), base_index=0)
    return slerp_merge_method.implementation(batch, t=torch.tensor([t], dtype=torch.float64))[0]


def ties(base, thetas, weights, density, lam):
    """The registry's `ties` merge of base (entry 0) and the k models, each model with the
    contract's weight and density."""
    from mergekit.merge_methods import registry
    from mergekit.merge_methods.base import TensorGroup

    group = TensorGroup.from_tensors([base, *thetas.unbind(0)], base_index=0)
    ids = [e.id for e in group.non_base]
    return registry.get("ties").merge_group(
        group, weight=dict(zip(ids, weights.tolist())), density=dict.fromkeys(ids, density),
        int8_mask=False, normalize=True, rescale=False, **{"lambda": lam})


_M = "falsify.conformance.lib_mergekit"

# linear_merge and slerp pick their working dtype as float64 for float64 inputs, else float32
# (bfloat16 widened, the result cast back); the ties merge works in the tensors' own dtype.
# Each returns a result of the input's dtype for both.
_FLOATS = ("float64", "bfloat16")


def _int_refusal(method: str, error: str, repro: str | None = None) -> Finding:
    return Finding(
        kind="deviation", repro=repro,
        evidence=(f"int64 (and int32) tensors are refused by {method} with {error}: not an "
                  "error that names the dtype, which the dtypes check (MRG-DTY-001) asks of "
                  "every refusal. float64 and bfloat16 are accepted, with results of that "
                  "dtype, and declared"))


LIBRARY = Library(
    name="mergekit",
    distribution="mergekit",
    bindings=(
        Binding(
            name="linear_merge", contract="merging-kernel-v1",
            binds={"linear": f"{_M}:linear"},
            dtypes=_FLOATS,
            findings={
                "FALSIFY-MRG-022": _int_refusal(
                    "linear_merge",
                    "TypeError 'Linear merging requires floating-point tensors', before any work",
                    repro="mergekit_integer_dtype_message.py"),
                "FALSIFY-MRG-027": Finding(
                    kind="deviation",
                    repro="mergekit_linear_no_models.py",
                    evidence=("k = 0 (no models): the contract's rule is a ValueError naming "
                              "'k = 0'; mergekit refuses before any work, but with "
                              "TensorBatch.__post_init__'s ValueError 'TensorBatch requires "
                              "nonempty output and input axes' (merge_methods/base.py), which "
                              "does not name the dim. m = 0 and n = 0 give the empty [0, n] / "
                              "[m, 0] results the rule asks for (checked by hand: the layouts "
                              "check stops at the first dim)")),
            },
        ),
        Binding(
            name="slerp", contract="merging-kernel-v1",
            binds={"slerp": f"{_M}:slerp"},
            dtypes=_FLOATS,
            findings={
                "FALSIFY-MRG-023": _int_refusal(
                    "slerp_merge_method",
                    "TypeError 'SLERP requires floating-point tensors', before any work",
                    repro="mergekit_integer_dtype_message.py"),
            },
        ),
        Binding(
            name="ties", contract="merging-kernel-v1",
            binds={"ties": f"{_M}:ties"},
            dtypes=_FLOATS,
            findings={
                "FALSIFY-MRG-011/float32": Finding(
                    kind="variant", variant="unstable tie order in the magnitude trim",
                    evidence=("base = 0, thetas = ones [1, 1, 17], density 0.1 (K = 1), λ = 0.5: "
                              "the reference keeps the lowest flat index of the 17 equal "
                              "|τ| = 1 (y[0, 0] = 0.5), mergekit keeps index 8 (y[0, 0] = 0.0, "
                              "y[0, 8] = 0.5). sparsify.magnitude ranks with "
                              "torch.argsort(|τ|, descending=True), an unstable sort, so which "
                              "of equal magnitudes it keeps is unspecified (the contract's trim "
                              "derivation names this difference); on distinct magnitudes the "
                              "parity holds")),
                "FALSIFY-MRG-012": Finding(
                    kind="variant", variant="unstable tie order in the magnitude trim",
                    evidence=("base = 0, thetas = ones [1, 3, 6], density 0.1 (K = 1): the "
                              "predicate's stable trim keeps (0, 0), mergekit's "
                              "torch.argsort(descending=True) keeps (1, 3), so y − base ≠ 0 "
                              "where the predicate's elected sign is 0; the same all-ties case "
                              "in float16")),
                "FALSIFY-MRG-011/float16": Finding(
                    kind="deviation",
                    repro="mergekit_ties_fp16.py",
                    evidence=("k = 1, base 0.4233, θ −0.4424, w 0.3625 (fp16), density 0.25, "
                              "λ = 1: mergekit −0.44287109375, reference −0.4423828125 (exact; "
                              "2 fp16 ulps, bound 2.29e-06 + eps16/2 relative). "
                              "GeneralizedTaskArithmeticMerge.merge_group works in base.dtype: "
                              "deltas = base.new_empty(...), θ − base, w·τ, the masked sums and "
                              "the division are each rounded to fp16, where the contract allows "
                              "fp32 arithmetic and one final rounding")),
                "FALSIFY-MRG-013/float16": Finding(
                    kind="deviation",
                    repro="mergekit_ties_fp16.py",
                    evidence=("model 0 = base, density 1 (k = 2, [3, 37], w 0.3376, 0.603): "
                              "48 elements off base + λ(θ* − base) beyond the fp32-accumulation "
                              "bound (up to 1.5e-3 in a hand run of the same construction, our "
                              "kernel 0): the fp16 arithmetic of merge_group (see "
                              "FALSIFY-MRG-011/float16) rounds τ, w·τ, the sums and the "
                              "quotient to fp16")),
                "FALSIFY-MRG-025": _int_refusal(
                    "ties (merge_group)",
                    "RuntimeError 'result type Float can't be cast to the desired output type "
                    "Long' from torch at mixed_delta /= divisor, after the merge's work",
                    repro="mergekit_ties_integer_dtype.py"),
                "FALSIFY-MRG-030": Finding(
                    kind="variant", variant="no models merge to the base",
                    evidence=("k = 0: the contract's rule is a ValueError naming 'k = 0'; "
                              "GeneralizedTaskArithmeticMerge.merge_group returns the base tensor "
                              "itself (`if not entries: return base`), shape [m, n], the merge "
                              "of no task vectors. Neither size-0 rule (empty, error) describes "
                              "it. m = 0 and n = 0 give empty results (checked by hand)")),
            },
        ),
    ),
)
