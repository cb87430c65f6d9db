"""Mutants of the pretraining loop (falsify/contracts/train-loop-v1.yaml): buggy variants of the
loop's
swappable pieces (falsify/llm/trainer.LoopParts), each one a bug seen in real training code. The
contract's run functions (falsify/probes/train_loop.py) build the real loop with whatever the
harness binds, so each variant runs inside the real Trainer / train()."""

from __future__ import annotations

import math

from falsify.kernels.torch.adamw import AdamW
from falsify.llm import config as LC
from falsify.llm import data as D
from falsify.llm import preflight as PF
from falsify.llm import trainer as TR
from falsify.llm.model import ModelConfig, param_count


# ---------------------------------------------------------------------------- optimizer
def build_optimizer_beta2_default(model, cfg):
    """β₂ not passed on, so AdamW's default 0.999 replaces the
    configured 0.95."""
    opt, names = TR.build_optimizer(model, cfg)
    for g in opt.param_groups:
        g["betas"] = (cfg.beta1, 0.999)
    return opt, names


def _adamw(model, cfg, groups):
    """The loop's own optimizer class and update, over the given groups."""
    return AdamW(groups, lr=cfg.lr, beta1=cfg.beta1, beta2=cfg.beta2, eps=cfg.adam_eps,
                 weight_decay=cfg.weight_decay, backend=model.ops.backend,
                 update=model.ops.adamw)


def build_optimizer_decay_everything(model, cfg):
    """One parameter group: weight decay also pulls the norm gains and the embedding to 0."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _adamw(model, cfg, [{"params": params, "weight_decay": cfg.weight_decay,
                               "name": "decay"}])
    return opt, [n for n, p in model.named_parameters() if p.requires_grad]


def build_optimizer_without_no_decay_group(model, cfg):
    """The no-decay group is never handed to the optimizer: norm gains and the embedding get
    gradients but are never updated."""
    opt, names = TR.build_optimizer(model, cfg)
    keep = opt.param_groups[0]
    opt = _adamw(model, cfg, [{k: v for k, v in keep.items() if k not in ("lr", "betas",
                                                                           "eps")}])
    return opt, names[:len(keep["params"])]


# ----------------------------------------------------------------------------- clipping
def _clip_with_norm_power(params, max_norm, power):
    """Global-norm clipping whose coefficient uses ‖g‖^power where ‖g‖ belongs."""
    norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
    coef = min(1.0, max_norm / (norm ** power + 1e-6))
    for p in params:
        p.grad.mul_(coef)
    return norm


def clip_gradients_quartic(params, max_norm, ops=None):
    """The clip coefficient computed with ‖g‖⁴ instead of ‖g‖ (a known clipping bug)."""
    return _clip_with_norm_power(params, max_norm, 4)


def clip_gradients_squared(params, max_norm, ops=None):
    """The clip coefficient computed with ‖g‖² (a squared norm passed where the norm belongs)."""
    return _clip_with_norm_power(params, max_norm, 2)


def clip_gradients_only_if_set(params, max_norm, ops=None):
    """The safety clip behind an optional setting (`if let Some(c) = grad_clip`): the
    config's default value stands for "not set", so a run with the default trains unclipped
    (the norm is still computed and reported)."""
    norm = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
    if max_norm != LC.TrainConfig.grad_clip:
        coef = min(1.0, max_norm / (norm + 1e-6))
        for p in params:
            p.grad.mul_(coef)
    return norm


# ------------------------------------------------------------------------- accumulation
def micro_batch_divisors_mean_of_means(token_counts):
    """Each micro-batch normalised by its own token count, then averaged over micro-batches:
    the mean of per-micro-batch means (tokens of short micro-batches weigh more)."""
    return [len(token_counts) * n for n in token_counts]


# ------------------------------------------------------------------------ data, config
class OneEpochSampler(D.BatchSampler):
    """The loop makes one pass over the data whatever `epochs` says (43 of 5000
    steps)."""

    def __init__(self, stream, seq_len, batch_size, grad_accum, epochs, seed, data_key=""):
        super().__init__(stream, seq_len, batch_size, grad_accum, 1, seed, data_key)


class UnseededSampler(D.BatchSampler):
    """The epoch order drawn from OS entropy instead of (seed, epoch): runs are not
    reproducible."""

    def _permutation(self, epoch):
        if self._perm_epoch != epoch:
            import numpy as np

            self._perm = np.random.default_rng().permutation(self.n_blocks)
            self._perm_epoch = epoch
        return self._perm


def check_config_algebra_warmup_only(n_sequences, batch_size, grad_accum, epochs, max_steps,
                                     warmup_steps, seq_len=1):
    """Preflight checks the warmup fraction but not whether max_steps is reachable."""
    a = PF.config_algebra(n_sequences, batch_size, grad_accum, epochs, max_steps, warmup_steps,
                         seq_len)
    if 10 * warmup_steps > max_steps:
        raise PF.PreflightError(f"warmup_steps={warmup_steps} > 10% of max_steps={max_steps}")
    return a


# ------------------------------------------------------------------------------ resume
def restore_position_without_step(trainer, sampler, state):
    """Resume restores weights, AdamW state and data position but not the step counter: the LR
    schedule restarts from warmup and the run trains max_steps more steps."""
    sampler.load_state_dict(state["data"])


def restore_position_without_data(trainer, sampler, state):
    """Resume restores the step but not the data position: the resumed run replays the
    epoch's first batches."""
    trainer.step = int(state["step"])


# ------------------------------------------------------------------------------ memory
def param_count_untied(cfg: ModelConfig) -> int:
    """Counts a separate LM head (V·H) although the embedding is tied."""
    return param_count(cfg) + cfg.vocab_size * cfg.hidden_size


def memory_estimate_one_moment(mcfg, batch_size, seq_len, activation_checkpointing=False,
                               act_bytes=4, grad_accum=1):
    """AdamW's state counted as one fp32 moment (4P) instead of two (8P)."""
    m = PF.memory_estimate(mcfg, batch_size, seq_len, activation_checkpointing, act_bytes,
                          grad_accum)
    m["total"] -= m["optimizer"] - 4 * m["params"]
    m["optimizer"] = 4 * m["params"]
    return m


# ------------------------------------------------------------------------- RNG on resume
def load_checkpoint_without_rng(ckpt, model, optimizer, param_names):
    """Resume restores weights and AdamW state and returns state.json, but every global RNG
    stays where it was: bit-identical resume breaks at the first dropout or unseeded draw."""
    from falsify.llm import checkpoint as C
    from falsify.llm.checkpoint_load import load_checkpoint

    js, tensors = C.rng_state()
    state = load_checkpoint(ckpt, model, optimizer, param_names)
    C.set_rng_state(js, tensors)
    return state


# --------------------------------------------------------------------------- evaluation
def evaluate_with_grad(trainer, batches):
    """Evaluation in eval mode but without torch.no_grad(): every batch builds an autograd
    graph (activations held alive, memory of a training step per batch); the value is the
    same."""
    with TR.eval_mode(trainer.forward_model):
        return TR.mean_token_ce(trainer, batches)


def evaluate_in_train_mode(trainer, batches):
    """Evaluation under no_grad but without model.eval(): dropout stays on, so the validation
    loss is a random draw (invisible while no module draws)."""
    import torch

    with torch.no_grad():
        return TR.mean_token_ce(trainer, batches)


def evaluate_leaves_eval_mode(trainer, batches):
    """model.eval() for evaluation and never put back: the run trains on in eval mode after
    its first evaluation (dropout silently off)."""
    import torch

    trainer.forward_model.eval()
    with torch.no_grad():
        return TR.mean_token_ce(trainer, batches)
