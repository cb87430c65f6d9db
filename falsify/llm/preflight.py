"""Preflight: every check that can refuse a run before step 1, in two stages.

`preflight_config` needs only the config (and the device): architecture divisibility, the
warmup fraction (warmup <= 10 % of the steps) and the training-memory
estimate against the machine. The run driver calls it before preparing any data, so a config
that cannot run is refused in milliseconds, not after minutes of tokenizing.

`preflight` adds what needs the prepared data: tokenizer vocab == model vocab, the config
algebra (max_steps reachable with the configured epochs: epochs=1 must not silently run 43 of
5000 steps), and a validation split that holds at least one block.
"""

from __future__ import annotations

import math
import os

import torch

from falsify.llm.config import TrainConfig, model_config
from falsify.llm.model import ModelConfig, ModelConfigError, param_count

MAX_WARMUP_FRACTION = 0.1


class PreflightError(RuntimeError):
    """The run would fail or silently not do what the config says; raised before step 1."""


# ------------------------------------------------------------------------- config algebra
def config_algebra(n_sequences: int, batch_size: int, grad_accum: int, epochs: int,
                   max_steps: int, warmup_steps: int, seq_len: int = 1) -> dict:
    """The step and warmup equations on plain ints (z3/CrossHair-friendly).

    steps_per_epoch = floor(n_sequences / batch_size / grad_accum)
    achievable      = epochs · steps_per_epoch        (must be >= max_steps)
    min_epochs      = ceil(max_steps / steps_per_epoch)
    warmup_fraction = warmup_steps / max_steps         (must be <= 0.10)
    total_tokens    = max_steps · batch_size · grad_accum · seq_len
    """
    spe = n_sequences // (batch_size * grad_accum)
    return {"steps_per_epoch": spe, "achievable_steps": epochs * spe,
            "min_epochs": -(-max_steps // spe) if spe else None,
            "warmup_fraction": warmup_fraction(max_steps, warmup_steps),
            "total_tokens": max_steps * batch_size * grad_accum * seq_len,
            "ok": spe >= 1 and epochs * spe >= max_steps and 10 * warmup_steps <= max_steps}


def warmup_fraction(max_steps: int, warmup_steps: int) -> float:
    try:
        return warmup_steps / max_steps
    except OverflowError:  # a quotient beyond float range (CrossHair found it): IEEE's inf
        return math.inf


def check_warmup(max_steps: int, warmup_steps: int) -> None:
    """Warmup must be <= 10 % of the steps (integer test: exact for every int)."""
    if 10 * warmup_steps > max_steps:
        raise PreflightError(
            f"warmup_steps={warmup_steps} is {warmup_fraction(max_steps, warmup_steps):.1%} "
            f"of max_steps={max_steps}; must be <= 10% so warmup completes and the cosine "
            "phase dominates")


def check_config_algebra(n_sequences: int, batch_size: int, grad_accum: int, epochs: int,
                         max_steps: int, warmup_steps: int, seq_len: int = 1) -> dict:
    """Raise PreflightError if max_steps is unreachable or warmup exceeds 10 % of the steps.
    FALSIFY-CFG-001: (22079, 4, 128, epochs=1, max_steps=5000) -> 43 steps per epoch: error."""
    a = config_algebra(n_sequences, batch_size, grad_accum, epochs, max_steps, warmup_steps,
                       seq_len)
    spe = a["steps_per_epoch"]
    if spe < 1:
        raise PreflightError(
            f"steps_per_epoch = floor({n_sequences} sequences / batch_size {batch_size} / "
            f"grad_accum {grad_accum}) = 0: not enough data for one optimizer step")
    if a["achievable_steps"] < max_steps:
        raise PreflightError(
            f"max_steps={max_steps} is unreachable: steps_per_epoch = floor({n_sequences} / "
            f"{batch_size} / {grad_accum}) = {spe}, epochs={epochs} gives "
            f"{a['achievable_steps']} steps; set epochs >= {a['min_epochs']} or lower max_steps")
    check_warmup(max_steps, warmup_steps)
    return a


# --------------------------------------------------------------------------------- memory
# Bytes of saved activations per token per layer, fp32, for our block (what autograd keeps):
# norm inputs 2H, norm outputs 2H, q and attention output 2·Hq·d = 2H, k and v 2·D_kv,
# gate and up 2I, SwiGLU output I; i.e. (6H + 2·D_kv + 3I) floats. A K=10·H per layer rule
# undercounts the FFN when I = 4H; we report both and budget with ours.
def memory_estimate(mcfg: ModelConfig, batch_size: int, seq_len: int,
                    activation_checkpointing: bool = False, act_bytes: int = 4,
                    grad_accum: int = 1) -> dict:
    """Training-memory contract: weights 4P, grads 4P, AdamW 8P (fp32), + activations, + (with
    grad_accum > 1) 4P: from the second micro-batch on, autograd computes each gradient in a
    fresh buffer before adding it into .grad, and the torch profiler shows them coexisting
    (train-loop-v1, FALSIFY-TL-008). Outside the layers: the embedding output and the final
    norm's input and output (3·tokens·H), and the tied embedding's gradient, which arrives from
    the lookup and from the output projection and is summed in a second V·H buffer."""
    p = param_count(mcfg)
    h, i = mcfg.hidden_size, mcfg.intermediate_size
    d_kv = mcfg.num_kv_heads * mcfg.head_dim
    tokens = batch_size * seq_len
    per_layer = tokens * (6 * h + 2 * d_kv + 3 * i) * act_bytes
    if activation_checkpointing:  # block inputs kept, one block's internals live at a time
        acts = mcfg.num_layers * tokens * h * act_bytes + per_layer
    else:
        acts = mcfg.num_layers * per_layer
    # [tokens, V] fp32 buffers live at once at the loss's backward when the logits are built
    # (the autocast path): the logits, the saved log-softmax, the NLL's gradient, and
    # log-softmax backward's exp(output) temporary — the step's peak there (torch profiler).
    # The fp32 path fuses LM head + CE over token chunks and needs less: an upper bound there
    # (measured 3.66 MB vs 4.95 MB estimated on the tiny test config, train-loop-v1 TL-MEM-003).
    logits = 4 * tokens * mcfg.vocab_size * 4
    outside = 3 * tokens * h * act_bytes + mcfg.vocab_size * h * 4
    out = {"params": p, "weights": 4 * p, "grads": 4 * p, "optimizer": 8 * p,
           "accum_grads": 4 * p if grad_accum > 1 else 0,
           "activations": acts + outside + logits, "logits": logits,
           "activations_albor": mcfg.num_layers * seq_len * h * 10 * 4 * batch_size}
    out["total"] = (out["weights"] + out["grads"] + out["accum_grads"] + out["optimizer"]
                    + out["activations"])
    return out


def machine_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ------------------------------------------------------------------------------ the checks
def check_config(cfg) -> None:
    """The checks that need neither data nor a device: the config's own field rules and the
    warmup fraction (when the steps are set). A data-parallel launcher runs them once before
    any rank starts, so a bad field is one error, not one per rank."""
    cfg.validate()
    if cfg.max_steps is not None and cfg.warmup_steps is not None:
        check_warmup(cfg.max_steps, cfg.warmup_steps)


def preflight_config(cfg: TrainConfig, mcfg: ModelConfig, device: torch.device) -> dict:
    """The checks that need no data; returns the memory numbers for the run log."""
    try:
        mcfg.validate()
    except ModelConfigError as e:
        raise PreflightError(str(e)) from None
    check_warmup(cfg.max_steps, cfg.warmup_steps)
    mem = memory_estimate(mcfg, cfg.batch_size, mcfg.max_seq_len, cfg.activation_checkpointing,
                          grad_accum=cfg.grad_accum)
    budget = (cfg.memory_budget_gb * 2**30 if cfg.memory_budget_gb is not None
              else machine_memory_bytes(device))
    if mem["total"] > budget:
        raise PreflightError(
            f"estimated training memory {mem['total'] / 2**30:.2f} GiB (weights "
            f"{mem['weights'] / 2**30:.2f} + grads {mem['grads'] / 2**30:.2f} + AdamW "
            f"{mem['optimizer'] / 2**30:.2f} + activations {mem['activations'] / 2**30:.2f}) "
            f"exceeds the budget {budget / 2**30:.2f} GiB; lower batch_size or seq_len, or set "
            "activation_checkpointing=true")
    return {"memory": mem, "memory_budget": budget}


def preflight(cfg: TrainConfig, mcfg: ModelConfig, n_train_blocks: int, n_val_blocks: int,
              tokenizer_vocab: int, device: torch.device, parts=None) -> dict:
    """All pre-step-1 checks (the config-only ones again: they are cheap); returns the numbers
    for the run log, raises PreflightError. `parts`: the loop's LoopParts (falsify/llm/trainer.py),
    whose config algebra is the contract-bound one (by default this module's, which LoopParts
    holds unless a check binds another)."""
    algebra_of = parts.check_config_algebra if parts is not None else check_config_algebra
    early = preflight_config(cfg, mcfg, device)
    if tokenizer_vocab != mcfg.vocab_size:
        raise PreflightError(f"tokenizer vocab {tokenizer_vocab} != model vocab_size "
                             f"{mcfg.vocab_size}")
    algebra = algebra_of(n_train_blocks, cfg.batch_size, cfg.grad_accum, cfg.epochs,
                         cfg.max_steps, cfg.warmup_steps, mcfg.max_seq_len)
    if cfg.val_fraction > 0 and n_val_blocks == 0:
        raise PreflightError(f"val_fraction={cfg.val_fraction} but the validation split has "
                             f"fewer than {mcfg.max_seq_len + 1} tokens (no full block)")
    return {"algebra": algebra, **early}


def vocab_check(tokenizer_vocab: int, model_vocab: int) -> str:
    """bpe-tokenizer-kernel-v1's torch binding of vocab_check, so the contract checks the call
    the loop makes: `preflight` with a tokenizer of `tokenizer_vocab` tokens and the tiny model
    built with `model_vocab` rows; '' when it accepts, else its refusal message. The data
    figures are generous so that only the vocabulary can refuse."""
    cfg = TrainConfig(vocab_size=model_vocab)
    try:
        preflight(cfg, model_config(cfg), n_train_blocks=10**9, n_val_blocks=10**6,
                  tokenizer_vocab=tokenizer_vocab, device=torch.device("cpu"))
    except PreflightError as e:
        return str(e)
    return ""
