"""Prune a model's projections: magnitude or WANDA (Sun et al. 2023, "A Simple and Effective
Pruning Approach for Large Language Models"), unstructured per output row or N:M.

WANDA scores W_ij by |W_ij|·‖X_j‖₂, X the inputs the projection sees on calibration text. The
inputs are collected by recording every `ops.linear` call during calibration forwards (the
model calls its projections through `ops.linear`, so a hook on the nn.Linear modules would
never fire): a copy of the model's `Ops` whose `linear` adds Σ_tokens x_j² per weight, put on
every module for the duration and taken off after, so no other model sharing the cached `Ops`
sees it. The masks come from the contract-checked kernel (pruning-kernel-v1,
falsify/kernels/torch/pruning.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from falsify.kernels.torch import pruning as kernel
from falsify.llm import data as data_mod
from falsify.llm.model import Transformer

PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class PruneError(ValueError):
    """A bad pruning setting: one line naming it."""


@dataclass(frozen=True)
class Plan:
    method: str               # magnitude | wanda
    sparsity: float | None    # unstructured: the pruned fraction of each row
    pattern: tuple[int, int] | None = None  # N:M: keep N of every M consecutive columns

    def describe(self) -> str:
        shape = (f"{self.pattern[0]}:{self.pattern[1]}" if self.pattern
                 else f"sparsity {self.sparsity:g} per row")
        return f"{self.method}, {shape}"


def parse_plan(method: str, sparsity: float | None, pattern: str | None) -> Plan:
    if method not in ("magnitude", "wanda"):
        raise PruneError(f"--method {method!r}: choose magnitude or wanda")
    if (sparsity is None) == (pattern is None):
        raise PruneError("give exactly one of --sparsity and --pattern")
    if pattern is not None:
        try:
            n, m = (int(v) for v in pattern.split(":"))
        except ValueError:
            raise PruneError(f"--pattern {pattern!r}: N:M, keep N of every M (e.g. 2:4)") \
                from None
        if not 0 < n <= m:
            raise PruneError(f"--pattern {pattern}: need 0 < N <= M")
        return Plan(method, None, (n, m))
    if not 0.0 <= sparsity < 1.0:
        raise PruneError(f"--sparsity {sparsity}: must be in [0, 1)")
    return Plan(method, sparsity)


def projection_weights(model: Transformer) -> dict[str, torch.Tensor]:
    return {f"layers.{i}.{p}": dict(block.named_parameters())[f"{p}.weight"]
            for i, block in enumerate(model.layers) for p in PROJECTIONS}


@contextlib.contextmanager
def _recording(model: Transformer, sumsq: dict[str, torch.Tensor]):
    weights = {id(w): name for name, w in projection_weights(model).items()}
    base = model.ops

    def linear(x, w, *a, **k):
        name = weights.get(id(w))
        if name is not None:
            s = x.detach().double().pow(2).reshape(-1, x.shape[-1]).sum(0)
            sumsq[name] = sumsq[name] + s if name in sumsq else s
        return base.linear(x, w, *a, **k)

    rec = dataclasses.replace(base, linear=linear)
    mods = [m for m in model.modules() if getattr(m, "ops", None) is base]
    for m in mods:
        m.ops = rec
    try:
        yield
    finally:
        for m in mods:
            m.ops = base


def calibration_ids(tok, n_seqs: int, seq_len: int) -> list[list[int]]:
    """The first n_seqs windows of the shipped SFT set's text (prompt + response), each
    preceded by <|endoftext|>, packed into windows of seq_len tokens."""
    from falsify.llm import sft_data as SD

    eos = tok.token_to_id(data_mod.EOS)
    stream: list[int] = []
    for rec in SD.read_jsonl(SD.SHIPPED_DATASET):
        text = "".join(str(v) for k, v in rec.fields.items() if k in ("prompt", "response"))
        stream += [eos] + data_mod.encode(tok, text)
        if len(stream) >= n_seqs * seq_len:
            break
    out = [stream[i:i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]
    return out[:n_seqs]


@torch.no_grad()
def activation_norms(model: Transformer, windows: list[list[int]]) -> dict[str, torch.Tensor]:
    """‖X_j‖₂ over every calibration token, per projection."""
    model.eval()
    dev = next(model.parameters()).device
    sumsq: dict[str, torch.Tensor] = {}
    with _recording(model, sumsq):
        for w in windows:
            model(torch.tensor([w], device=dev))
    missing = set(projection_weights(model)) - set(sumsq)
    if missing:
        raise RuntimeError(f"calibration saw no input for {sorted(missing)[:3]}")
    return {k: v.sqrt() for k, v in sumsq.items()}


@torch.no_grad()
def prune(model: Transformer, plan: Plan, norms: dict[str, torch.Tensor] | None,
          masks: dict[str, torch.Tensor] | None = None) -> dict:
    """Prune in place; per projection the fraction of its entries the mask removed. Given a
    dict `masks`, each projection's keep mask (bool, True = kept) from the kernel is stored in
    it under the projection's name: the masks a pruned checkpoint records (masks.safetensors),
    which are the source of truth for which weights are pruned — a kept weight may happen to
    be 0, a pruned one must be."""
    stats = {}
    for name, w in projection_weights(model).items():
        x = (norms[name].to(w.dtype) if plan.method == "wanda"
             else torch.ones(w.shape[1], dtype=w.dtype, device=w.device))
        if plan.pattern is not None:
            keep_n, m = plan.pattern
            if w.shape[1] % m:
                raise PruneError(f"--pattern {keep_n}:{m}: {name} has {w.shape[1]} input "
                                 f"columns, not a multiple of {m}")
            pruned, keep = kernel.n_m(w, x, m - keep_n, m)
        else:
            pruned, keep = kernel.wanda(w, x, plan.sparsity)
        w.copy_(pruned)
        stats[name] = 1.0 - float(keep.float().mean())
        if masks is not None:
            masks[name] = keep.to(torch.bool).cpu()
    return stats
