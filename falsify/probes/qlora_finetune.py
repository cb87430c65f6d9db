"""Run functions for falsify/contracts/qlora-finetune-v1.yaml (`training`-kind checks).

Every run function builds a tiny model (2 layers, hidden 64, vocab 512, seq 32) with weights far
from the near-zero init (so a convention error moves logits by O(1)), runs a few steps of the
real loop (falsify/llm/finetune.py), and compares against something the loop did not compute: a
snapshot of the base taken before training and the NF4 bytes recomputed by the numpy reference,
the un-adapted Transformer, float64 numpy losses (falsify/reference/finetune.py), per-sample
forwards,
the non-checkpointed gradients, ln 2, the PEFT library's own loading of the exported adapter.

The swappable pieces (loss, DPO loss, reward weights, LoRA init, freezing, merge, PEFT names)
are looked up through the harness at call time (`_bound`), so when `falsify mutants` swaps a
binding, the loop under test runs the mutant (falsify/mutants/qlora_finetune.py).
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np

from falsify.probes import watch_evaluation
from falsify.reference.finetune import (
    dpo_loss_reference,
    reward_weights_reference,
    sft_loss_reference,
)

CONTRACT = "qlora-finetune-v1"
U32 = 2.0**-24  # fp32 unit roundoff
TINY = dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
            intermediate_size=192, max_seq_len=32)


# ------------------------------------------------------------------------------ fixtures
def _bound(equation: str, backend: str):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract(CONTRACT), equation, backend)


def _objectives(backend: str):
    from falsify.llm.finetune import Objectives

    return Objectives(sft_loss=_bound("sft_loss", backend), dpo_loss=_bound("dpo_loss", backend),
                      reward_weights=_bound("reward_weights", backend),
                      lora_init=_bound("lora_init", backend),
                      freeze_base=_bound("frozen_base", backend),
                      reference_logps=_bound("reference_logps", backend),
                      evaluate_examples=_bound("evaluation", backend))


def tiny_base(seed: int = 0, scale: float = 0.08, **cfg):
    """The tiny Transformer (TINY, updated by `cfg`) with weights N(0, scale) and norm gains in
    [0.5, 1.5]."""
    import torch

    from falsify.llm.model import ModelConfig, build_model

    m = build_model(ModelConfig(**{**TINY, **cfg}), "torch", seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    return m


def synthetic_sft(n: int = 48, seed: int = 0, rewards: bool = False):
    """Prompt/response examples over ids 4..511: the response is a fixed function of the first
    prompt token (learnable in a few steps), lengths vary so padding and token weighting
    matter. Token 0 is the EOS separator, as in falsify/llm/sft_data.py."""
    from falsify.llm.sft_data import SFTExample

    rng = np.random.default_rng([seed, 17])
    out = []
    for i in range(n):
        p = rng.integers(4, 512, size=int(rng.integers(3, 12))).tolist()
        r = [int((p[0] * 5 + 3 * j) % 508 + 4) for j in range(int(rng.integers(2, 10)))]
        ids = [0] + p + r + [0]
        mask = [False] * (1 + len(p)) + [True] * (len(r) + 1)
        out.append(SFTExample(ids, mask, float(rng.uniform(-1.5, 1.5)) if rewards else None,
                              f"synthetic:{i}"))
    return out


def synthetic_pairs(n: int = 16, seed: int = 0):
    from falsify.llm.sft_data import PreferenceExample, SFTExample

    rng = np.random.default_rng([seed, 23])
    out = []
    for i in range(n):
        p = rng.integers(4, 512, size=int(rng.integers(3, 10))).tolist()
        good = [int((p[0] * 5 + 3 * j) % 508 + 4) for j in range(int(rng.integers(2, 8)))]
        bad = rng.integers(4, 512, size=int(rng.integers(2, 8))).tolist()
        def mk(r, p=p, i=i):
            return SFTExample([0] + p + r + [0], [False] * (1 + len(p)) + [True] * (len(r) + 1),
                              None, f"pair:{i}")

        out.append(PreferenceExample(mk(good), mk(bad), f"pair:{i}"))
    return out


def _cfg(**kw):
    from falsify.llm import finetune as FT

    d = dict(method="qlora", lora_r=4, lora_alpha=8.0, batch_size=4, grad_accum=2, epochs=50,
             max_steps=4, warmup_steps=0, lr=1e-2, lr_min=1e-3, val_split=0.0, progress=False,
             sample_count=0, backend="torch", device="cpu", out_dir="unused")
    d.update(kw)
    return FT.config_from_dict(d, source="contract check")


class Run:
    """The real loop's pieces on the tiny model: adapters applied with the bound init/freeze,
    a FinetuneTrainer with the bound objectives, batches from the example sampler."""

    def __init__(self, backend: str, examples: list, kind: str = "sft", seed: int = 0,
                 prune: float | None = None, **kw):
        import torch

        from falsify.llm import finetune as FT
        from falsify.llm import lora_model as LM
        from falsify.llm import sft_data as SD

        torch.manual_seed(seed)
        self.cfg = FT.resolve_steps(_cfg(seed=seed, **kw), len(examples))
        self.obj = _objectives(backend)
        self.examples, self.kind = examples, kind
        self.base = tiny_base(seed)
        self.original = {k: v.detach().clone() for k, v in self.base.state_dict().items()}
        self.model = tiny_base(seed)
        self.masks = None
        if prune is not None:  # magnitude-prune the base first and train with its masks kept
            from falsify.llm import prune as P

            self.masks = {}
            P.prune(self.model, P.parse_plan("magnitude", prune, None), None, self.masks)
        LM.apply_lora(self.model, FT.lora_spec(self.cfg), init=self.obj.lora_init,
                      freeze=self.obj.freeze_base)
        if self.masks is not None:
            LM.attach_masks(self.model, self.masks, "probe")
        self.model.activation_checkpointing = self.cfg.activation_checkpointing
        self.trainer = FT.FinetuneTrainer(self.model, self.cfg, torch.device("cpu"), None, kind,
                                          self.obj)
        self.weights = None
        if kind == "sft" and examples[0].reward is not None:
            rw = self.obj.reward_weights(torch.tensor([e.reward for e in examples],
                                                      dtype=torch.float64))
            self.weights = rw.numpy().astype(np.float32)
        self.sampler = SD.ExampleSampler(len(examples), self.cfg.batch_size,
                                         self.cfg.grad_accum, self.cfg.epochs, seed, True)

    def micro(self, idx_lists):
        from falsify.llm import finetune as FT

        return [FT.make_micro(self.examples, idx, self.kind, 0, self.weights)
                for idx in idx_lists]

    def step(self):
        return self.trainer.train_step(self.micro(self.sampler.next_step()))


def _max_abs(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max())


# ------------------------------------------------------------------------ run functions
def frozen_base_run(backend, dtype="float32", method="qlora", steps=3, seed=0):
    """QFT-FRZ-001. After `steps` optimizer steps: every base tensor (NF4 bytes and absmax
    states, fp32 projections, embedding, norms) is bit-identical to its pre-training snapshot;
    the NF4 bytes also equal the numpy reference's quantization of the original weights (an
    independent computation); no base tensor holds a gradient; every adapter did change."""
    import torch

    from falsify.llm import lora_model as LM
    from falsify.reference import nf4 as ref_nf4

    run = Run(backend, synthetic_sft(32, seed), seed=seed, method=method, max_steps=steps)
    before = {k: v.detach().clone() for k, v in LM.base_tensors(run.model).items()}
    adapters0 = {k: v.detach().clone() for k, v in LM.adapter_parameters(run.model).items()}
    for _ in range(steps):
        run.step()
    after = LM.base_tensors(run.model)
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    with_grad = sorted(k for k, p in run.model.named_parameters()
                       if not LM.is_adapter_param(k) and p.grad is not None)
    nf4_ref_mismatch = []
    for name, mod in LM.adapted_layers(run.model):
        if not mod.quantized:
            continue
        w = run.original[f"{name}.weight"].double().numpy()
        packed, absmax = ref_nf4.nf4_quantize(w, mod.blocksize)[:2]
        if not np.array_equal(np.asarray(packed), mod.weight_nf4.numpy()):
            nf4_ref_mismatch.append(name)
    adapters_moved = all(not torch.equal(adapters0[k], p)
                         for k, p in LM.adapter_parameters(run.model).items()
                         if ".lora_B." in k)
    n_opt = sum(p.numel() for g in run.trainer.optimizer.param_groups for p in g["params"])
    n_adapter = sum(p.numel() for p in LM.adapter_parameters(run.model).values())
    return {"changed": changed, "with_grad": with_grad, "nf4_ref_mismatch": nf4_ref_mismatch,
            "base_tensors": len(before), "adapters_moved": adapters_moved,
            "optimizer_params": n_opt, "adapter_params": n_adapter}


def plain_base(adapted, base):
    """`base` (the un-adapted Transformer the adapters were applied to, its weights unchanged)
    with each NF4-quantized projection of `adapted` replaced by the numpy reference's
    dequantization of its codes: the frozen base the adapters see, computed without the
    adapted model's layers, kernels or adapter switch."""
    import torch

    from falsify.llm import lora_model as LM
    from falsify.reference import nf4 as ref_nf4

    sd = base.state_dict()
    for name, mod in LM.adapted_layers(adapted):
        if not mod.quantized:
            continue
        st = {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in mod.nf4_state().items()}
        deq = ref_nf4.nf4_dequantize(st["packed"], st["absmax"], st["shape"], st["blocksize"],
                                     absmax2=st.get("absmax2"), offset=st.get("offset"))
        sd[f"{name}.weight"] = torch.from_numpy(np.asarray(deq, np.float64)).float()
    base.load_state_dict(sd)
    return base.eval()


def op_order_tol(logits) -> float:
    """fp32 tolerance between the adapted model's layers and the plain Transformer on the same
    weights (one GEMM per projection vs the concatenated q/k/v and gate/up GEMMs): the one
    tests/test_hf.py uses, 8·(2L+1)·√K·u·max|logits|, K = max(hidden, intermediate)."""
    k = max(TINY["hidden_size"], TINY["intermediate_size"])
    return 8 * (2 * TINY["num_layers"] + 1) * math.sqrt(k) * U32 * float(logits.abs().max())


def zero_init_run(backend, dtype="float32", method="qlora", seed=0):
    """QFT-INI-001. The adapted model before any step vs the un-adapted Transformer on the
    same base (for QLoRA: the base's weights replaced by the numpy reference's dequantization
    of their NF4 codes). The two differ only in op order (one GEMM per projection vs the base's
    concatenated q/k/v and gate/up GEMMs), so the derived fp32 tolerance is `op_order_tol`."""
    import torch

    from falsify.llm import lora_model as LM

    run = Run(backend, synthetic_sft(8, seed), seed=seed, method=method)
    base = plain_base(run.model, run.base)
    x = torch.randint(4, TINY["vocab_size"], (3, TINY["max_seq_len"]),
                      generator=torch.Generator().manual_seed(seed))
    run.model.eval()
    with torch.no_grad():
        got, want = run.model(x), base(x)
    tol = op_order_tol(want)
    b_max = max(float(p.detach().abs().max()) for n, p in LM.adapter_parameters(run.model).items()
                if ".lora_B." in n)
    return {"max_diff": _max_abs(got, want), "tol": tol, "logit_max": float(want.abs().max()),
            "b_max": b_max}


def sft_loss_mask_run(backend, dtype="float32", seed=0):
    """QFT-RSP-001 in the loop. For a causal LM the prompt's *inputs* condition the response,
    so "perturb the prompt, the loss is unchanged" cannot hold for the prompt tokens fed to the
    model (the seed's FT-003 wording); what response-only loss means is that the prompt
    positions' *targets* (the tokens the prompt positions would be trained to predict) do not
    enter the loss: replace every one of them by another id, and loss and adapter gradients are
    bit-identical, while replacing one response target changes the loss (the check can fail).
    The loop's loss is also compared with the float64 numpy loss of the same logits."""
    import torch

    from falsify.llm import lora_model as LM

    run = Run(backend, synthetic_sft(16, seed), seed=seed, batch_size=8, grad_accum=1)
    run.step()  # B != 0: gradients reach A as well
    idx = [np.arange(8)]
    micro = run.micro(idx)
    b = micro[0]

    def loss_and_grads(batch):
        loss, _, _ = run.trainer.forward_backward([batch])
        return loss, {k: p.grad.detach().clone()
                      for k, p in LM.adapter_parameters(run.model).items()}

    l0, g0 = loss_and_grads(b)
    prompt_pos = (~b.mask) & (b.labels != -100)
    perturbed = b.labels.masked_fill(prompt_pos, 0) + prompt_pos.long() * (
        (b.labels + 101) % 508 + 4)
    bp = type(b)(b.x, perturbed, b.mask, b.weights, b.index)
    l1, g1 = loss_and_grads(bp)
    resp = b.mask.nonzero()[0]
    lab2 = b.labels.clone()
    lab2[resp[0], resp[1]] = (lab2[resp[0], resp[1]] + 1) % 508 + 4
    l2, g2 = loss_and_grads(type(b)(b.x, lab2, b.mask, b.weights, b.index))
    with torch.no_grad():
        run.model.train()
        logits = run.model(b.x)
    ref_sum, ref_n = sft_loss_reference(logits.numpy(), b.labels.numpy(), b.mask.numpy(),
                                        b.weights.numpy())
    v = TINY["vocab_size"]
    zmax = float(logits.abs().max())
    # per token: the fp32 log-sum-exp over V terms (V·u relative on the sum -> V·u absolute
    # on its log) and the subtraction at magnitude zmax; the mean adds nothing larger.
    tol = (v + 4 * zmax + 8) * U32 * 4
    return {"prompt_targets": int(prompt_pos.sum()), "loss": l0,
            "prompt_perturbed_diff": abs(l1 - l0),
            "grad_diff": max(_max_abs(g0[k], g1[k]) for k in g0),
            "response_perturbed_diff": abs(l2 - l0),
            # relative change of the adapter gradients when ONE response target moves: the
            # one-hot of one of ~50 positions moves, O(1/50) of the gradient
            "response_grad_change": max(_max_abs(g0[k], g2[k]) for k in g0)
            / max(float(g0[k].abs().max()) for k in g0),
            "ref_diff": abs(l0 - ref_sum / ref_n), "tol": tol}


def loss_decreases_run(backend, dtype="float32", method="qlora", steps=40, seed=0):
    """QFT-DEC-001 / QFT-NNG-001 in the loop: a fixed 16-example dataset, every loss ≥ 0 and
    the mean of the last 5 losses below 80 % of the first (it falls to a fraction of it)."""
    run = Run(backend, synthetic_sft(16, seed), seed=seed, method=method, max_steps=steps,
              lr=2e-2, lr_min=2e-3, warmup_steps=2)
    losses = [run.step().loss for _ in range(steps)]
    return {"first": losses[0], "last5": float(np.mean(losses[-5:])), "min": min(losses),
            "losses": losses}


def gradient_flow_run(backend, dtype="float32", method="qlora", seed=0):
    """QFT-GRD-001. Step 1 (B = 0): ∂L/∂B ≠ 0 for every adapter and ∂L/∂A = 0 exactly (the
    LoRA backward dA = s·(g·B)ᵀ·x); after it ‖B‖ > 0; step 2: ∂L/∂A ≠ 0 for every adapter."""
    from falsify.llm import lora_model as LM

    run = Run(backend, synthetic_sft(32, seed), seed=seed, method=method)
    run.step()
    ad = LM.adapter_parameters(run.model)
    g1 = {k: (float(p.grad.abs().max()) if p.grad is not None else 0.0) for k, p in ad.items()}
    b_norm = min(float(p.detach().norm()) for k, p in ad.items() if ".lora_B." in k)
    run.step()
    g2 = {k: (float(p.grad.abs().max()) if p.grad is not None else 0.0) for k, p in ad.items()}
    return {"n_adapters": sum(".lora_A." in k for k in ad),
            "step1_dB_min": min(v for k, v in g1.items() if ".lora_B." in k),
            "step1_dA_max": max(v for k, v in g1.items() if ".lora_A." in k),
            "B_norm_min_after_step1": b_norm,
            "step2_dA_min": min(v for k, v in g2.items() if ".lora_A." in k),
            "step2_dB_min": min(v for k, v in g2.items() if ".lora_B." in k)}


def batch_loss_run(backend, dtype="float32", seed=0):
    """QFT-BAT-001. The step loss over grad_accum=2 right-padded micro-batches of examples of
    different lengths equals Σ_i CE_i / Σ_i n_i computed from one forward per example alone
    (no padding, batch 1): token-weighted, not a mean of per-sample (or per-micro) means."""
    import torch

    from falsify.llm import sft_data as SD

    run = Run(backend, synthetic_sft(16, seed), seed=seed, batch_size=3, grad_accum=2)
    run.step()
    idx = run.sampler.next_step()
    loss, n, _ = run.trainer.forward_backward(run.micro(idx))
    tot, cnt, means, zmax = 0.0, 0, [], 0.0
    run.model.eval()  # no dropout in this config; eval only to skip autograd bookkeeping
    with torch.no_grad():
        for i in np.concatenate(idx):
            e = run.examples[int(i)]
            b = SD.collate([e], 0)
            lg = run.model(b.x)
            zmax = max(zmax, float(lg.abs().max()))
            s, c = sft_loss_reference(lg.numpy(), b.labels.numpy(), b.mask.numpy(), [1.0])
            tot, cnt = tot + s, cnt + c
            means.append(s / c)
    ref = tot / cnt
    # batched (padded) and single-example forwards differ in op order only: logits within
    # the HF-parity bound 8·(2L+1)·√K·u·max|z| each; a CE moves by at most twice that, plus
    # the fp32 log-sum-exp error (V + 4·max|z|)·u per token.
    k = max(TINY["hidden_size"], TINY["intermediate_size"])
    tol = (2 * 8 * (2 * TINY["num_layers"] + 1) * math.sqrt(k) * zmax
           + TINY["vocab_size"] + 4 * zmax) * U32
    return {"loss": loss, "ref": ref, "mean_of_means": float(np.mean(means)),
            "diff": abs(loss - ref), "tol": tol, "tokens": n, "ref_tokens": cnt}


def checkpointing_run(backend, dtype="float32", method="qlora", seed=0):
    """QFT-CKP-001. Adapter gradients of one step with activation checkpointing (each block
    recomputed in backward) equal those without it: the recompute runs the same ops on the
    same inputs, so they are bit-identical on CPU; the tolerance allows a few ulps anyway."""
    from falsify.llm import lora_model as LM

    runs = {}
    for ckpt in (False, True):
        run = Run(backend, synthetic_sft(16, seed), seed=seed, method=method,
                  activation_checkpointing=ckpt)
        run.step()
        micro = run.micro(run.sampler.next_step())
        loss, _, _ = run.trainer.forward_backward(micro)
        runs[ckpt] = (loss, {k: p.grad.detach().clone()
                             for k, p in LM.adapter_parameters(run.model).items()},
                      run.model.activation_checkpointing)
    g0, g1 = runs[False][1], runs[True][1]
    gmax = max(float(v.abs().max()) for v in g0.values())
    return {"loss_diff": abs(runs[False][0] - runs[True][0]),
            "grad_diff": max(_max_abs(g0[k], g1[k]) for k in g0), "grad_max": gmax,
            "tol": 8 * U32 * gmax, "checkpointing_on": runs[True][2]}


def reward_run(backend, dtype="float32", seed=0):
    """QFT-RWD-001. In the loop, with reward weights w: (a) a sample with w = 0 contributes
    nothing — replacing all its response targets changes neither loss nor gradients; (b) with
    w ≡ 1 the loss equals plain SFT's (float64 numpy), so reward 1 is plain SFT; (c) the loss
    equals the numpy Σ w_i·CE_i / Σ n_i for mixed weights."""
    import torch

    from falsify.llm import lora_model as LM

    ex = synthetic_sft(16, seed, rewards=True)
    run = Run(backend, ex, seed=seed, batch_size=8, grad_accum=1)
    run.step()
    idx = [np.arange(8)]
    b = run.micro(idx)[0]
    w = torch.tensor([0.0, 1.0, 0.25, 1.0, 0.5, 0.0, 0.75, 1.0])

    def lg(batch):
        loss, _, _ = run.trainer.forward_backward([batch])
        return loss, {k: p.grad.detach().clone()
                      for k, p in LM.adapter_parameters(run.model).items()}

    bw = type(b)(b.x, b.labels, b.mask, w, b.index)
    l0, g0 = lg(bw)
    zero = (w == 0)[:, None] & b.mask
    lab = b.labels.masked_fill(zero, 0) + zero.long() * ((b.labels + 77) % 508 + 4)
    l1, g1 = lg(type(b)(b.x, lab, b.mask, w, b.index))
    ones = torch.ones(8)
    l_one, _ = lg(type(b)(b.x, b.labels, b.mask, ones, b.index))
    with torch.no_grad():
        logits = run.model(b.x).numpy()
    s1, n1 = sft_loss_reference(logits, b.labels.numpy(), b.mask.numpy(), np.ones(8))
    sw, nw = sft_loss_reference(logits, b.labels.numpy(), b.mask.numpy(), w.numpy())
    tol = (TINY["vocab_size"] + 64) * U32 * 8
    return {"zero_weight_loss_diff": abs(l1 - l0),
            "zero_weight_grad_diff": max(_max_abs(g0[k], g1[k]) for k in g0),
            "ones_vs_plain": abs(l_one - s1 / n1), "weighted_vs_ref": abs(l0 - sw / nw),
            "weighted_minus_plain": abs(l0 - l_one), "tol": tol}


def reward_weights_run(backend, dtype="float32"):
    """QFT-RWD-002. The normalisation on fixed vectors (clipping matters in each): matches the
    numpy clip-then-min-max, the minimum maps to 0 and the maximum to 1, values stay in [0, 1],
    and constant rewards are an error rather than a silent guess."""
    import torch

    fn = _bound("reward_weights", backend)
    cases = [[-5.0, -1.0, 0.0, 0.5, 1.0, 3.0], [0.2, 0.4, 2.5], [-0.3, 0.1, 0.1, 0.9, -7.0],
             [0.0, 1.0]]
    err = 0.0
    in_range = True
    for c in cases:
        got = fn(torch.tensor(c, dtype=torch.float64)).double().numpy()
        want = reward_weights_reference(c)
        err = max(err, float(np.abs(got - want).max()))
        in_range &= bool((got >= 0).all() and (got <= 1).all())
    try:
        fn(torch.tensor([0.3, 0.3, 0.3], dtype=torch.float64))
        constant_raises = False
    except ValueError:
        constant_raises = True
    return {"max_err": err, "in_range": in_range, "constant_raises": constant_raises,
            "tol": 4 * 2.0**-52}


def dpo_run(backend, dtype="float32", method="qlora", steps=12, seed=0):
    """QFT-DPO-001/002. Step 0: policy = reference (B = 0), so the loss is ln 2 up to the
    fp32 rounding of the log-probabilities; the loss matches the float64 numpy DPO on the
    same log-probabilities; over `steps` steps the chosen log-ratio log π(y_c) − log π_ref(y_c)
    rises (mean of the last 3 steps above step 1's) and the margin grows."""
    run = Run(backend, synthetic_pairs(16, seed), kind="preference", seed=seed, method=method,
              max_steps=steps, lr=2e-2, lr_min=2e-3, batch_size=4, grad_accum=1)
    idx = run.sampler.next_step()
    micro = run.micro(idx)
    ch, rj = micro[0]
    pc, pr = run.trainer._policy_logps(ch, rj)
    rc, rr = run.trainer.reference_logps(ch, rj)
    ref_losses, _, _ = dpo_loss_reference(pc.detach().numpy(), pr.detach().numpy(),
                                          rc.numpy(), rr.numpy(), run.cfg.dpo_beta)
    first = run.trainer.train_step(micro)
    logratios, margins, losses = [first.extra["chosen_logratio"] / first.extra["pairs"]], [], \
        [first.loss]
    margins.append((first.extra["chosen_reward"] - first.extra["rejected_reward"])
                   / first.extra["pairs"])
    for _ in range(steps - 1):
        st = run.step()
        p = st.extra["pairs"]
        logratios.append(st.extra["chosen_logratio"] / p)
        margins.append((st.extra["chosen_reward"] - st.extra["rejected_reward"]) / p)
        losses.append(st.loss)
    lp_mag = float(max(abs(rc).max(), abs(rr).max()))
    return {"loss0": first.loss, "ln2": math.log(2.0),
            "loss0_vs_ref": abs(first.loss - float(ref_losses.mean())),
            # log-probs are sums of ≤ 32 fp32 log-softmax values: |err| ≤ 32·(V+8)·u each,
            # ×β in the loss; reference and policy forwards can differ by that much at step 0
            "tol0": run.cfg.dpo_beta * 4 * 32 * (TINY["vocab_size"] + 8) * U32 + 16 * U32,
            "logratio_first": logratios[0], "logratio_last3": float(np.mean(logratios[-3:])),
            "margin_first": margins[0], "margin_last3": float(np.mean(margins[-3:])),
            "loss_last3": float(np.mean(losses[-3:])), "logp_magnitude": lp_mag}


def dpo_reference_run(backend, dtype="float32", method="qlora", steps=4, seed=0):
    """QFT-DPO-004. DPO for `steps` steps, so the adapters have moved (B ≠ 0), then pairs the
    run has never seen (no entry in the trainer's reference cache): the trainer's reference
    log-probs of their chosen and rejected responses equal those of the frozen base computed
    without the adapted model (`plain_base`: the un-adapted Transformer on the same weights,
    NF4 dequantized by the numpy reference), within the op-order bound below, while the
    policy's own log-probs of the same responses differ from the base's by far more.

    Bound: the two models' logits differ by δ ≤ `op_order_tol`; a log-softmax value
    z_y − logsumexp(z) moves by ≤ 2δ when every logit moves by ≤ δ, and each side rounds its
    log-softmax over V terms to ≤ (V + 8)·u; a response's log-prob sums n ≤ 32 such tokens,
    and that fp32 sum adds n·u·|log p|: tol = n·(2δ + 2·(V + 8)·u) + n·u·max|log p|."""
    import torch

    from falsify.llm import finetune as FT
    from falsify.llm import lora_model as LM

    run = Run(backend, synthetic_pairs(16, seed), kind="preference", seed=seed, method=method,
              max_steps=steps, lr=2e-2, lr_min=2e-3, batch_size=4, grad_accum=1)
    for _ in range(steps):
        run.step()
    fresh = synthetic_pairs(4, seed + 1)
    ch, rj = FT.make_micro(fresh, range(len(fresh)), "preference", 0, None,
                           key_offset=len(run.examples))
    unseen = all(int(i) not in run.trainer.ref_cache for i in ch.index)
    rc, rr = run.trainer.reference_logps(ch, rj)
    with torch.no_grad():
        run.model.eval()
        pc, pr = run.trainer._policy_logps(ch, rj)
        base = plain_base(run.model, run.base)
        logits = {k: base(b.x) for k, b in (("chosen", ch), ("rejected", rj))}
        bc = FT.sequence_logps(logits["chosen"], ch.labels, ch.mask)
        br = FT.sequence_logps(logits["rejected"], rj.labels, rj.mask)
    run.model.train()
    n = max(int(b.mask.sum(1).max()) for b in (ch, rj))
    delta = max(op_order_tol(v) for v in logits.values())
    lp_max = float(torch.cat([bc, br]).abs().max())
    tol = n * (2 * delta + 2 * (TINY["vocab_size"] + 8) * U32) + n * U32 * lp_max
    b_max = max(float(p.detach().abs().max()) for k, p in LM.adapter_parameters(run.model).items()
                if ".lora_B." in k)
    return {"unseen": unseen, "pairs": len(ch.x), "b_max": b_max,
            "ref_vs_base": max(_max_abs(rc, bc), _max_abs(rr, br)),
            "policy_vs_base": max(_max_abs(pc, bc), _max_abs(pr, br)), "tol": tol,
            "response_tokens_max": n}


def evaluation_run(backend, dtype="float32", method="qlora", seed=0, dropout=0.1):
    """QFT-EVL-001. The bound validation (FinetuneTrainer.evaluate_examples) of an SFT run with
    lora_dropout > 0, after 2 steps (B ≠ 0: before that the dropout on the adapter's input
    changes nothing), called with the model in train mode as the loop calls it: (a) two calls
    give the same loss, exactly the response-token CE of the probe's own eval-mode, no_grad
    forward of the same batches (the same operations in the same order), which a train-mode
    forward misses; (b) a forward hook sees every forward of the validation run with autograd
    off, with no module in train mode, and its output outside any graph; (c) every module's
    mode afterwards is the one it had, from train mode and from eval mode. Global RNG state is
    left as it was."""
    import torch

    from falsify.llm import finetune as FT

    run = Run(backend, synthetic_sft(24, seed), seed=seed, method=method, lora_dropout=dropout,
              batch_size=4, grad_accum=1, max_steps=4)
    for _ in range(2):
        run.step()
    model = run.model
    batches = run.micro([list(range(16, 20)), list(range(20, 24))])

    def explicit(train: bool) -> float:
        model.train(train)
        total, n = 0.0, 0
        with torch.no_grad():
            for b in batches:
                logits, labels, mask = FT.counted_logits(model, b)
                s, c = FT.sft_loss(logits, labels, mask, torch.ones_like(b.weights))
                total, n = total + float(s), n + int(c)
        return total / n

    # counted_logits runs model.hidden and model.head, not model.forward: hook the last
    # norm (every hidden-state computation ends there)
    return watch_evaluation(model, model.norm,
                            lambda: run.trainer.evaluate_examples(batches)["val_loss"],
                            explicit, len(batches), seed)


def dpo_reference_parity_run(backend, dtype="float32", seed=0):
    """QFT-DPO-003. The bound DPO loss vs the float64 numpy one on fixed log-probabilities
    (both signs, large margins where a naive log(sigmoid) underflows)."""
    import torch

    fn = _bound("dpo_loss", backend)
    rng = np.random.default_rng(seed)
    pc, pr, rc, rr = (rng.uniform(-300, -5, size=64) for _ in range(4))
    pc[:4] = [-10.0, -1000.0, -5.0, -20.0]
    rc[:4] = [-900.0, -10.0, -5.0, -20.0]
    out = []
    for beta in (0.1, 0.5):
        got = fn(*(torch.tensor(v, dtype=torch.float32) for v in (pc, pr, rc, rr)), beta)
        want = dpo_loss_reference(*(np.float32(v).astype(np.float64)
                                    for v in (pc, pr, rc, rr)), beta)
        for g, w in zip(got, want):
            g = g.detach().double().numpy()
            out.append(float((np.abs(g - w) / (1.0 + np.abs(w))).max()))
    # inputs up to 1000 in fp32: differences carry ≤ 2·ulp(1000) ≈ 1.2e-4 absolute, × β;
    # log σ is 1-Lipschitz, so the loss error is bounded by the same.
    return {"max_rel_err": max(out), "tol": 0.5 * 4 * 1000 * U32 * 2 + 8 * U32}


def export_import_run(backend, dtype="float32", method="qlora", steps=3, seed=0):
    """QFT-EXP-001. Train a few steps, export the adapter (PEFT format) and the base (HF
    layout, falsify/llm/hf.py), then: the safetensors hold exactly our adapter tensors under PEFT's
    names, bit for bit; our `load_adapter` round trip reproduces them bit for bit; and
    peft.PeftModel.from_pretrained on transformers' LlamaForCausalLM loads the same values and
    reproduces our logits within the HF-parity tolerance of tests/test_hf.py (the HF base gets
    the weights the adapter was trained against: dequantized NF4 for QLoRA)."""
    import torch
    from safetensors.torch import load_file

    from falsify.llm import hf
    from falsify.llm import lora_model as LM

    run = Run(backend, synthetic_sft(32, seed), seed=seed, method=method, max_steps=steps)
    for _ in range(steps):
        run.step()
    model = run.model.eval()
    ours = {k: v.detach().clone() for k, v in LM.adapter_parameters(model).items()}
    x = torch.randint(4, TINY["vocab_size"], (2, TINY["max_seq_len"]),
                      generator=torch.Generator().manual_seed(seed + 5))
    with torch.no_grad():
        logits = model(x)
    peft_names = {LM.PEFT_PREFIX + k: v for k, v in ours.items()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        LM.export_peft(model, tmp / "adapter", "base", meta={"test": True})
        # the binding under test decides the names written (a mutant may write others)
        from falsify.llm.checkpoint import save_file

        save_file(_bound("peft_state", backend)(model), str(tmp / "adapter" /
                                                          LM.ADAPTER_WEIGHTS))
        saved = load_file(str(tmp / "adapter" / LM.ADAPTER_WEIGHTS))
        names_ok = set(saved) == set(peft_names)
        bitwise = names_ok and all(torch.equal(saved[k], peft_names[k]) for k in saved)
        try:
            back = LM.load_adapter(tiny_base(seed), tmp / "adapter")
            ours_back = LM.adapter_parameters(back)
            roundtrip = set(ours_back) == set(ours) and all(torch.equal(ours_back[k], ours[k])
                                                            for k in ours)
        except LM.LoraConfigError:  # our loader is strict about names; PEFT's is not
            roundtrip = False
        # the HF base: merged with B = 0 is exactly base_weight() of every projection
        plain = LM.merge_lora(model, merge=lambda w, a, b, s: w)
        hf.export_hf(plain, tmp / "hf")
        peft_logits, peft_equal, loaded = _peft_logits(tmp / "hf", tmp / "adapter", x, ours)
    k = max(TINY["hidden_size"], TINY["intermediate_size"])
    tol = 8 * (2 * TINY["num_layers"] + 1) * math.sqrt(k) * U32 * float(logits.abs().max())
    with torch.no_grad():
        delta = float((logits - plain.eval()(x)).abs().max())
    return {"names_ok": names_ok, "bitwise": bitwise, "roundtrip": roundtrip,
            "peft_loaded": loaded, "peft_weights_equal": peft_equal,
            "peft_logit_diff": float((peft_logits - logits).abs().max()), "tol": tol,
            "adapter_effect": delta}


def _peft_logits(hf_dir, adapter_dir, x, ours):
    import logging
    import warnings

    import torch

    logging.getLogger("transformers").setLevel(logging.ERROR)
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hfm = LlamaForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32,
                                               attn_implementation="eager")
        pm = PeftModel.from_pretrained(hfm, str(adapter_dir)).eval()
    sd = {k.replace(".default", ""): v for k, v in pm.state_dict().items() if "lora_" in k}
    from falsify.llm.lora_model import PEFT_PREFIX

    loaded = len(sd)
    equal = loaded == len(ours) and all(
        torch.equal(sd.get(PEFT_PREFIX + k, torch.empty(0)), v) for k, v in ours.items())
    with torch.no_grad():
        out = pm(input_ids=x).logits
    return out, equal, loaded


def merge_run(backend, dtype="float32", method="qlora", steps=4, seed=0):
    """QFT-MRG-001. After training (B ≠ 0), the merged plain Transformer's logits equal the
    adapted model's within the fp32 op-order tolerance, and the adapter moved the logits by far
    more than that (so a merge that dropped or mis-scaled the adapter cannot pass)."""
    import torch

    from falsify.llm import lora_model as LM

    run = Run(backend, synthetic_sft(32, seed), seed=seed, method=method, max_steps=steps,
              lr=3e-2)
    for _ in range(steps):
        run.step()
    model = run.model.eval()
    merged = LM.merge_lora(model, merge=_bound("merge", backend)).eval()
    x = torch.randint(4, TINY["vocab_size"], (2, TINY["max_seq_len"]),
                      generator=torch.Generator().manual_seed(seed + 9))
    with torch.no_grad():
        a, m = model(x), merged(x)
        with LM.adapters_disabled(model):
            b = model(x)
    k = max(TINY["hidden_size"], TINY["intermediate_size"])
    tol = 8 * (2 * TINY["num_layers"] + 1) * math.sqrt(k) * U32 * float(a.abs().max())
    return {"merged_diff": float((a - m).abs().max()), "tol": tol,
            "adapter_effect": float((a - b).abs().max())}


def masked_merge_run(backend, dtype="float32", method="qlora", steps=4, seed=0):
    """QFT-MSK-001. A 50 % magnitude-pruned base fine-tuned with its masks kept (the masked
    delta M ⊙ s·B·A) and merged with the bound masked merge: every pruned weight of the merged
    model is exactly 0.0, its logits equal the adapted model's within the fp32 op-order
    tolerance, and the dense delta s·B·A is non-zero on pruned positions (a merge that drops
    the mask refills them)."""
    import torch

    from falsify.llm import lora_model as LM
    from falsify.llm import prune as P

    run = Run(backend, synthetic_sft(32, seed), seed=seed, method=method, max_steps=steps,
              lr=3e-2, prune=0.5)
    for _ in range(steps):
        run.step()
    model = run.model.eval()
    merged = LM.merge_lora(model, merge=_bound("merge", backend),
                           merge_masked=_bound("merge_masked", backend)).eval()
    weights = P.projection_weights(merged)
    pruned_nonzero = dense_on_pruned = pruned = 0
    for name, m in LM.adapted_layers(model):
        off = ~run.masks[name]
        pruned += int(off.sum())
        pruned_nonzero += int((weights[name].detach()[off] != 0).sum())
        dense = m.scale() * (m.lora_B.weight @ m.lora_A.weight).detach()
        dense_on_pruned += int((dense[off] != 0).sum())
    x = torch.randint(4, TINY["vocab_size"], (2, TINY["max_seq_len"]),
                      generator=torch.Generator().manual_seed(seed + 9))
    with torch.no_grad():
        a, mo = model(x), merged(x)
        with LM.adapters_disabled(model):
            b = model(x)
    k = max(TINY["hidden_size"], TINY["intermediate_size"])
    tol = 8 * (2 * TINY["num_layers"] + 1) * math.sqrt(k) * U32 * float(a.abs().max())
    return {"pruned": pruned, "pruned_nonzero": pruned_nonzero,
            "dense_on_pruned": dense_on_pruned, "merged_diff": float((a - mo).abs().max()),
            "tol": tol, "adapter_effect": float((a - b).abs().max())}


def memory_run(backend, dtype="float32", double_quant=True):
    """QFT-MEM-001. Bytes of the NF4 base projections equal the closed form: n/2 packed bytes
    + 4·n/64 absmax bytes (fp32), or with double quantization n/64 uint8 codes + 4·⌈n/64/256⌉
    second-level absmax + 4 offset bytes; per weight 4.5 (≈4.127) bits, i.e. ≈ 1/7.1 (≈ 1/7.75)
    of fp32."""
    from falsify.llm import finetune as FT
    from falsify.llm import lora_model as LM

    m = tiny_base(0)
    cfg = _cfg(double_quant=double_quant)
    LM.apply_lora(m, FT.lora_spec(cfg), init=_bound("lora_init", backend),
                  freeze=_bound("frozen_base", backend))
    want = 0
    for _, mod in LM.adapted_layers(m):
        n = mod.in_features * mod.out_features
        nb = -(-n // 64)
        want += -(-n // 2) + (nb + 4 * -(-nb // 256) + 4 if double_quant else 4 * nb)
    mem = LM.memory_bytes(m)
    return {"stored": mem["projections_stored"], "formula": want,
            "ratio": mem["projections_ratio"], "fp32": mem["projections_fp32"]}
