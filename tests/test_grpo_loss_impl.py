"""GRPO loss and group advantages: cases the contract cannot express (refusals, pads that change
the shape, non-finite pads, KL rounding at |d| < eps, bool masks), and TRL's GRPOTrainer as the
independent oracle for both the advantages and the loss with its gradient."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from falsify.kernels.torch import grpo_loss as T
from falsify.kernels.triton import grpo_loss as X
from falsify.reference import grpo_loss as R

EPS32 = float(np.finfo(np.float32).eps)
BACKENDS = [pytest.param(T, id="torch"), pytest.param(X, id="triton")]


def _batch(B=3, L=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = -4 * torch.rand(B, L, generator=g)
    old = -4 * torch.rand(B, L, generator=g)
    ref = -4 * torch.rand(B, L, generator=g)
    adv = torch.tensor([1.5, -0.7, 0.3])[:B]
    mask = torch.ones(B, L, dtype=torch.int64)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    return lp, old, ref, adv, mask


def _loss_and_grad(mod, lp, *rest, clip_eps=0.2, beta=0.04):
    x = lp.clone().requires_grad_(True)
    loss = mod.grpo_loss(x, *rest, clip_eps=clip_eps, beta=beta)
    loss.backward()
    return loss.detach(), x.grad


@pytest.mark.parametrize("mod", BACKENDS)
def test_bad_arguments_are_refused(mod):
    lp, old, ref, adv, mask = _batch()
    bad_mask = mask.clone()
    bad_mask[0, 0] = 2
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        mod.grpo_loss(lp, old, ref, adv, bad_mask, 0.2, 0.04)
    with pytest.raises(ValueError, match="old_logp"):
        mod.grpo_loss(lp, old[:, :-1], ref, adv, mask, 0.2, 0.04)
    with pytest.raises(ValueError, match="advantages"):
        mod.grpo_loss(lp, old, ref, adv[:-1], mask, 0.2, 0.04)
    with pytest.raises(ValueError, match="clip_eps"):
        mod.grpo_loss(lp, old, ref, adv, mask, 1.5, 0.04)
    with pytest.raises(ValueError, match="beta"):
        mod.grpo_loss(lp, old, ref, adv, mask, 0.2, -1.0)
    with pytest.raises(ValueError, match="G = 1"):
        mod.group_advantages(torch.ones(4), 1, 1e-4)
    with pytest.raises(ValueError, match="not a whole number of groups"):
        mod.group_advantages(torch.ones(5), 2, 1e-4)
    with pytest.raises(TypeError, match="float64"):
        mod.group_advantages(torch.ones(4, dtype=torch.float64), 2, 1e-4)


def test_reference_refuses_what_the_backends_refuse():
    lp, old, ref, adv, mask = (t.numpy().astype(np.float64) for t in _batch())
    bad = mask.copy()
    bad[0, 0] = 0.5
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        R.grpo_loss(lp, old, ref, adv, bad, 0.2, 0.04)
    with pytest.raises(ValueError, match="G = 1"):
        R.group_advantages(np.ones(4), 1, 1e-4)


@pytest.mark.parametrize("mod", BACKENDS)
def test_appended_padding_changes_nothing(mod):
    """Padding that lengthens the batch (the shape the contract's transforms cannot change):
    the loss and the gradients of the real tokens are bit-identical, the pads get 0."""
    lp, old, ref, adv, mask = _batch()
    loss1, g1 = _loss_and_grad(mod, lp, old, ref, adv, mask)
    pad = torch.full((3, 5), -7.0)
    loss2, g2 = _loss_and_grad(mod, torch.cat([lp, pad], 1), torch.cat([old, pad + 6], 1),
                               torch.cat([ref, pad - 3], 1), adv,
                               torch.cat([mask, torch.zeros(3, 5, dtype=mask.dtype)], 1))
    assert torch.equal(loss1, loss2)
    assert torch.equal(g1, g2[:, :9])
    assert torch.all(g2[:, 9:] == 0)


@pytest.mark.parametrize("mod", BACKENDS)
def test_non_finite_padding_stays_out(mod):
    lp, old, ref, adv, mask = _batch()
    loss1, g1 = _loss_and_grad(mod, lp, old, ref, adv, mask)
    pads = mask == 0
    loss2, g2 = _loss_and_grad(mod, lp.masked_fill(pads, -math.inf),
                               old.masked_fill(pads, math.nan), ref.masked_fill(pads, math.inf),
                               adv, mask)
    assert torch.equal(loss1, loss2) and torch.equal(g1, g2)


@pytest.mark.parametrize("mod", BACKENDS)
def test_bool_mask_equals_int_mask(mod):
    lp, old, ref, adv, mask = _batch()
    a = _loss_and_grad(mod, lp, old, ref, adv, mask)
    b = _loss_and_grad(mod, lp, old, ref, adv, mask.bool())
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("mod", BACKENDS)
def test_kl_not_negative_below_eps(mod):
    """ref − logp of a few ulps: exp(d) − d − 1 rounds to −d < 0 in fp32; the kernels must not
    return a negative KL (torch: expm1(d) − d; Triton: clamped at 0)."""
    lp = torch.full((1, 8), -1.0)
    ref = lp + torch.tensor([1, -1, 2, -2, 3, -3, 4, -4]) * 2.0 ** -24
    assert (torch.exp(ref - lp) - (ref - lp) - 1).min() < 0  # the naive form does go negative
    loss = mod.grpo_loss(lp, lp, ref, torch.zeros(1), torch.ones(1, 8), 0.2, 1.0)
    assert loss >= 0


def test_equal_rewards_zero_where_the_naive_mean_is_not():
    """0.9 in groups of 3, fp32: torch's mean rounds away from 0.9, so (r − mean)/(std + eps)
    is a rounding residue over eps, an advantage of ~0.06; the first-reward shift gives exact
    zeros on every backend."""
    r = torch.full((6,), 0.9, dtype=torch.float32)
    g = r.view(-1, 3)
    naive = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)
    assert naive.abs().max() > 1e-2  # the failure the shift prevents
    for fn in (T.group_advantages, X.group_advantages):
        assert torch.equal(fn(r, 3, 1e-6), torch.zeros(6))
    assert np.array_equal(R.group_advantages(r.double().numpy(), 3, 1e-6), np.zeros(6))


# ---------------------------------------------------------------------------------------------
# TRL's GRPOTrainer as the oracle: a tiny real LlamaForCausalLM (built from a config, saved
# locally so TRL can load its frozen reference copy offline) generates completions; TRL scores
# them with a reward function returning fixed rewards, computes its advantages, and its
# `compute_loss` (loss_type "dapo", the default) computes the loss from the per-token log-probs
# it gets from `_get_per_token_logps_and_entropies`. We feed the same log-probs, old/reference
# log-probs, advantages and masks to our loss and compare values and d loss / d logp.
# TRL 1.16 defaults to use_bias_correction_kl=True, which multiplies the k3 term by the ratio ρ
# (DeepSeek-V3.2); our loss is the plain k3 term, so the oracle runs with it off, and
# test_trl_default_kl_correction_is_another_loss shows the default is a different function.

G, P, MAX_NEW = 4, 3, 6
REWARDS = [1.0, 0.0, 0.5, 0.25, 2.0, 2.0, 2.0, 2.0, -1.0, 3.0, 0.0, 0.5]


@pytest.fixture(scope="module")
def trl_run(tmp_path_factory):
    pytest.importorskip("trl", reason="trl (extra `interop`)")
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from datasets import Dataset
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {"<pad>": 0, "<eos>": 1,
             **{c: i + 2 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ")}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                      bos_token_id=1)
    root = tmp_path_factory.mktemp("grpo")
    LlamaForCausalLM(cfg).save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")

    def reward(prompts, completions, **kw):
        return REWARDS[:len(completions)]

    args = GRPOConfig(output_dir=str(root / "out"), per_device_train_batch_size=P * G,
                      num_generations=G, max_completion_length=MAX_NEW, beta=0.04,
                      report_to=[], use_cpu=True, save_strategy="no", bf16=False,
                      use_bias_correction_kl=False)
    prompts = ["ab", "cde", "f"]
    trainer = GRPOTrainer(model=str(root / "tiny"), reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                          processing_class=tok)
    trainer.model.train()
    # what transformers' training loop sets before each step (one accumulation step here)
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    batch = trainer._generate_and_score_completions(
        [{"prompt": p} for p in prompts for _ in range(G)])
    return trainer, batch


def test_advantages_match_trl(trl_run):
    trainer, batch = trl_run
    assert trainer.scale_rewards == "group"
    theirs = batch["advantages"].float()
    r = torch.tensor(REWARDS)
    # both sides fp32, each within FALSIFY-GRPO-001's bound of the exact value:
    # 3(G + 2)√(G − 1)·eps + (G + 2)·eps·√(G − 1) (|A| < √(G − 1)), doubled for the two sides
    tol = 2 * (3 * (G + 2) * math.sqrt(G - 1) + (G + 2) * math.sqrt(G - 1)) * EPS32
    for fn in (T.group_advantages, X.group_advantages):
        ours = fn(r, G, 1e-4)  # TRL's eps: std + 1e-4
        assert torch.allclose(ours, theirs, rtol=0, atol=tol), (ours, theirs)
    ref = R.group_advantages(np.array(REWARDS), G, 1e-4)
    assert np.allclose(ref, theirs.numpy(), rtol=0, atol=tol)
    # the tied group: TRL gives 0 as well; the population std would not match TRL
    assert torch.all(theirs[4:8] == 0)
    pop = (r.view(-1, G) - r.view(-1, G).mean(1, keepdim=True)) / (
        r.view(-1, G).std(1, correction=0, keepdim=True) + 1e-4)
    assert not torch.allclose(pop.reshape(-1), theirs, rtol=0, atol=tol)
    from falsify.mutants.grpo_loss import batch_std_advantages

    assert not torch.allclose(batch_std_advantages(r, G, 1e-4), theirs, rtol=0, atol=tol)


def _trl_inputs(batch, seed):
    """TRL's batch with off-policy old/reference log-probs (so ratios straddle the clip range),
    advantages of both signs and a zero one, and ragged completion masks."""
    g = torch.Generator().manual_seed(seed)
    inputs = dict(batch)
    mask = batch["completion_mask"].clone()
    B, L = mask.shape
    for i in range(B):
        mask[i, 1 + (i * 5) % L:] = 0  # lengths 1..L, every row keeps its first token
    inputs["completion_mask"] = mask
    inputs["num_items_in_batch"] = mask.sum()
    inputs["advantages"] = torch.linspace(-2.0, 2.0, B)[torch.randperm(B, generator=g)]
    return inputs, g


def _trl_loss_and_logp_grad(trainer, inputs):
    """TRL's loss, and d loss / d per-token log-probs read off the tensor TRL computed them into
    (the method runs unchanged; its result is kept with retain_grad)."""
    kept = []
    orig = trainer._get_per_token_logps_and_entropies

    def keep(*a, **k):
        out = orig(*a, **k)
        out[0].retain_grad()
        kept.append(out[0])
        return out

    trainer._get_per_token_logps_and_entropies = keep
    try:
        loss = trainer.compute_loss(trainer.model, inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies
    loss.backward()
    trainer.model.zero_grad(set_to_none=True)
    return loss.detach(), kept[0].detach(), kept[0].grad


def _off_policy(trainer, batch, seed):
    inputs, g = _trl_inputs(batch, seed)
    with torch.no_grad():
        logp0 = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].size(1))[0]
    inputs["old_per_token_logps"] = logp0 + 0.4 * torch.randn(logp0.shape, generator=g)
    inputs["ref_per_token_logps"] = logp0 + 0.4 * torch.randn(logp0.shape, generator=g)
    return inputs, logp0


def _tolerances(inputs, logp, beta):
    """FALSIFY-GRPO-005 / -006's fp32 bounds with the batch's n counted tokens, dy = 1 and M the
    largest per-token term, for each side (TRL evaluates the same formula in fp32 in another
    order: exp(d) − d − 1, products with the mask), doubled: the two results are each within
    it of the exact value."""
    n = int(inputs["completion_mask"].sum())
    ratio = torch.exp(logp - inputs["old_per_token_logps"])
    d = inputs["ref_per_token_logps"] - logp
    M = float(inputs["advantages"].abs().max()) * float(ratio.max()) + \
        beta * float(torch.exp(d).max() + d.abs().max() + 1)
    return 2 * (8 * M + (n + 2) * M) * EPS32, 2 * (8 * M) * EPS32 / n


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_match_trl(trl_run, seed):
    trainer, batch = trl_run
    assert trainer.loss_type == "dapo" and not trainer.args.use_bias_correction_kl
    inputs, logp0 = _off_policy(trainer, batch, seed)
    loss_trl, logp, grad_trl = _trl_loss_and_logp_grad(trainer, inputs)
    assert torch.equal(logp, logp0)  # the same log-probs reach both losses
    mask = inputs["completion_mask"]
    beta, eps = trainer.beta, trainer.epsilon_low
    assert eps == trainer.epsilon_high == 0.2
    ratio = torch.exp(logp - inputs["old_per_token_logps"])
    counted = mask == 1  # both sides of the clip range occur among the counted tokens
    assert bool(((ratio > 1 + eps) & counted).any()) and bool(((ratio < 1 - eps) & counted).any())
    loss_tol, grad_tol = _tolerances(inputs, logp, beta)
    for mod in (T, X):
        x = logp.clone().requires_grad_(True)
        loss = mod.grpo_loss(x, inputs["old_per_token_logps"], inputs["ref_per_token_logps"],
                             inputs["advantages"], mask, clip_eps=eps, beta=beta)
        loss.backward()
        loss = loss.detach()
        assert abs(float(loss) - float(loss_trl)) <= loss_tol, (mod.__name__, loss, loss_trl)
        assert torch.allclose(x.grad, grad_trl, rtol=0, atol=grad_tol), mod.__name__
    # the comparison discriminates: the declared mutants miss TRL by more than the tolerance
    from falsify.mutants import grpo_loss as mutants

    for bug in (mutants.symmetric_clip, mutants.kl_wrong_sign, mutants.padding_counted):
        wrong = bug(logp, inputs["old_per_token_logps"], inputs["ref_per_token_logps"],
                    inputs["advantages"], mask, clip_eps=eps, beta=beta)
        assert abs(float(wrong) - float(loss_trl)) > loss_tol, bug.__name__


def test_trl_default_kl_correction_is_another_loss(trl_run):
    """With TRL's default use_bias_correction_kl=True the KL term is ρ·k3: off-policy (ρ ≠ 1)
    its loss is not the contract's, which is why the oracle above turns it off."""
    trainer, batch = trl_run
    inputs, logp = _off_policy(trainer, batch, 0)
    trainer.args.use_bias_correction_kl = True
    try:
        loss_default = trainer.compute_loss(trainer.model, inputs).detach()
    finally:
        trainer.args.use_bias_correction_kl = False
    ours = T.grpo_loss(logp, inputs["old_per_token_logps"], inputs["ref_per_token_logps"],
                       inputs["advantages"], inputs["completion_mask"], 0.2, trainer.beta)
    assert abs(float(ours) - float(loss_default)) > _tolerances(inputs, logp, trainer.beta)[0]
