"""`falsify merge --method`: whole models merged tensor by tensor with the merging kernels.
Each method is checked on a case whose answer is known exactly from another route (endpoints,
a task vector no other model disputes, an average), and bad requests are refused.

The same over adapters (--models naming adapter directories): task vectors ΔW_i = s_i·B_i·A_i
on the shared base, through the same kernels; linear (1, 0) is merging adapter 1 alone,
(0.5, 0.5) is base + mean of deltas, TIES and DARE keep their sparsity and seed properties, and
adapters of different bases, slerp, or a mix of models and adapters are refused."""

from __future__ import annotations

import pytest
import torch

from falsify.llm import finetune as FT
from falsify.llm import lora_model as LM
from falsify.llm import model_merge as MM
from falsify.reference.merging import dare_keep, n_kept
from tests.test_finetune import make_tokenizer, shipped_records, write_base, write_jsonl

U = 2.0**-24  # fp32 unit roundoff: a rounding to fp32 errs by at most U·|value|


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("mm")
    tok = root / "tokenizer.json"
    make_tokenizer(tok)
    return [write_base(root / f"m{i}", tok, seed=s) for i, s in enumerate((0, 9, 17))]


def _state(path):
    return FT.load_base(path, "torch", need_tokenizer=False).model.state_dict()


def _merge(tmp_path, *argv):
    from falsify.cli import main

    out = tmp_path / "out"
    rc = main(["merge", "--out", str(out), "--layout", "ours", *argv]
              + ["--no-perplexity"] * ("--method" in argv and "--weights" not in argv))
    return rc, out / "ours"


def test_linear_is_the_weighted_average(models, tmp_path, capsys):
    rc, out = _merge(tmp_path, "--method", "linear", "--models", str(models[0]), str(models[1]),
                     "--weights", "1,3")
    assert rc == 0
    assert "perplexity on held-out code" in capsys.readouterr().out
    a, b, m = _state(models[0]), _state(models[1]), _state(out)
    for k in m:
        want = (a[k].double() + 3 * b[k].double()) / 4
        # FALSIFY-MRG-001's bound for k = 2 models of values ≤ 2 (tiny_model: gains < 1.5,
        # weights 0.08·N(0, 1)): 2(k + 1)·eps
        assert torch.allclose(m[k].double(), want, atol=6 * 2.0**-23, rtol=0), k


def test_slerp_endpoints_are_the_models(models, tmp_path):
    for t, i in ((0.0, 0), (1.0, 1)):
        rc, out = _merge(tmp_path, "--method", "slerp", "--models", str(models[0]),
                         str(models[1]), "--t", str(t))
        assert rc == 0
        want, got = _state(models[i]), _state(out)
        assert all(torch.equal(got[k], want[k]) for k in got)


def test_ties_with_one_task_vector_moves_base_to_that_model(models, tmp_path):
    """Base = model 0, models = [model 0, model 1], density 1: τ_0 = 0 never agrees, so the
    disjoint mean is τ_1 and the result is base + (θ_1 − base) = θ_1 up to two roundings."""
    rc, out = _merge(tmp_path, "--method", "ties", "--base", str(models[0]), "--models",
                     str(models[0]), str(models[1]), "--density", "1")
    assert rc == 0
    want, got = _state(models[1]), _state(out)
    for k in got:  # θ_1 − base and base + δ each rounded once: ½eps of ≤ 4, twice
        assert torch.allclose(got[k], want[k], atol=4 * 2.0**-23, rtol=0), k


def test_dare_is_seeded_and_p0_is_task_arithmetic(models, tmp_path):
    args = ["--method", "dare", "--base", str(models[0]), "--models", str(models[1]),
            str(models[2])]
    rc, out = _merge(tmp_path, *args, "--drop", "0.5", "--seed", "3")
    first = _state(out)
    rc2, out = _merge(tmp_path, *args, "--drop", "0.5", "--seed", "3")
    again = _state(out)
    assert rc == rc2 == 0 and all(torch.equal(first[k], again[k]) for k in first)
    rc, out = _merge(tmp_path, *args, "--drop", "0.5", "--seed", "4")
    assert any(not torch.equal(first[k], _state(out)[k]) for k in first)
    rc, out = _merge(tmp_path, *args, "--drop", "0")
    p0, lin_dir = _state(out), _merge(tmp_path, "--method", "linear", "--models",
                                      str(models[1]), str(models[2]))[1]
    lin = _state(lin_dir)
    for k in p0:  # base + mean(θ_i − base) = mean θ_i: each side within FALSIFY-MRG-001's
        # 6·eps of the exact mean, plus τ = θ − base and base + δ rounded (½eps of ≤ 4 each)
        assert torch.allclose(p0[k], lin[k], atol=(12 + 4) * 2.0**-23, rtol=0), k


def test_tensor_seeds_do_not_depend_on_order():
    assert MM.tensor_seed(3, "layers.0.mlp.up_proj.weight") == \
        MM.tensor_seed(3, "layers.0.mlp.up_proj.weight")
    assert MM.tensor_seed(3, "a") != MM.tensor_seed(3, "b") != MM.tensor_seed(4, "b")


@pytest.mark.parametrize("argv, words", [
    (["--method", "ties", "--models", "M0", "M1"], "give --base"),
    (["--method", "slerp", "--models", "M0", "M1", "M2"], "slerp interpolates two models"),
    (["--method", "linear", "--models", "M0", "M1", "--weights", "1"], "one positive weight"),
    (["--method", "linear", "--models", "M0", "M1", "--weights", "a,b"], "comma-separated"),
    (["--method", "dare", "--base", "M0", "--models", "M1", "--drop", "1"], "--drop 1.0"),
    (["--adapter", "X", "--models", "M0"], "go with --method"),
])
def test_bad_merge_requests_are_one_line_exit_2(models, tmp_path, argv, words, capsys):
    argv = [str(models[int(a[1])]) if a in ("M0", "M1", "M2") else a for a in argv]
    rc, out = _merge(tmp_path, *argv)
    text = "".join(capsys.readouterr())
    assert rc == 2 and words in text and "Traceback" not in text, text
    assert not out.exists()


def test_models_of_another_architecture_are_refused(models, tmp_path, capsys):
    from falsify.cli.merge import write_ours
    from falsify.llm.model import build_model

    cfg = FT.load_base(models[0], "torch", need_tokenizer=False).model.cfg
    other = build_model(type(cfg)(**{**cfg.to_dict(), "num_layers": 1}), "torch", seed=0)
    odd = write_ours(other, tmp_path / "odd", None, {})
    rc, _ = _merge(tmp_path, "--method", "linear", "--models", str(models[0]), str(odd))
    assert rc == 2 and "num_layers = 1" in capsys.readouterr().out


# --------------------------------------------------------------------------- adapters
@pytest.fixture(scope="module")
def adapters(models, tmp_path_factory):
    """Two LoRA adapters on models[0] (different seeds, a few steps: B ≠ 0) and one on
    models[1], trained through the CLI."""
    from falsify.cli import main

    root = tmp_path_factory.mktemp("mma")
    data = write_jsonl(root / "d.jsonl", shipped_records(16))
    out = []
    for i, (base, seed) in enumerate(((models[0], 1), (models[0], 2), (models[1], 1))):
        run = root / f"run{i}"
        assert main(["finetune", "--method", "lora", "--model", str(base), "--data", str(data),
                     "--out", str(run), "max_steps=2", "batch_size=4", "lora_r=4", "lr=3e-2",
                     f"seed={seed}", "val_split=0", "sample_count=0", "progress=false",
                     "backend=torch"]) == 0
        out.append(run / "adapter")
    return out


def _deltas(base, adapter):
    """ΔW = s·B·A per projection weight, float64, from the adapter as loaded."""
    model = LM.load_adapter(FT.load_base(base, "torch", need_tokenizer=False).model, adapter)
    return {f"{n}.weight": m.scale() * (m.lora_B.weight.double() @ m.lora_A.weight.double())
            for n, m in LM.adapted_layers(model) if m.has_adapter}


@pytest.mark.heavy
def test_adapters_linear_1_0_is_merging_adapter_1_alone(models, adapters, tmp_path, capsys):
    from falsify.cli import main

    rc, out = _merge(tmp_path, "--method", "linear", "--models", str(adapters[0]),
                     str(adapters[1]), "--weights", "1,0")
    assert rc == 0
    text = capsys.readouterr().out
    assert "task vectors" in text and text.count("perplexity on held-out code") == 4
    assert main(["merge", "--adapter", str(adapters[0]), "--out", str(tmp_path / "one"),
                 "--layout", "ours"]) == 0
    got, want = _state(out), _state(tmp_path / "one" / "ours")
    d = _deltas(models[0], adapters[0])
    assert set(d) and set(got) == set(want)
    for k in got:
        if k not in d:  # embedding, norms: the base's own tensors
            assert torch.equal(got[k], want[k]), k
            continue
        # 1·ΔW_1 + 0·ΔW_2 is exact, so the only difference: ΔW_1 rounded to fp32 before the
        # sum (≤ U·|ΔW_1|), and the sum rounded once on each side (≤ U·|W'| each)
        tol = U * (d[k].abs() + 2 * want[k].double().abs())
        assert torch.all((got[k].double() - want[k].double()).abs() <= tol), k


def test_adapters_linear_half_half_is_base_plus_mean_delta(models, adapters, tmp_path):
    rc, out = _merge(tmp_path, "--method", "linear", "--models", str(adapters[0]),
                     str(adapters[1]), "--weights", "0.5,0.5", "--no-perplexity")
    assert rc == 0
    got, base = _state(out), _state(models[0])
    d1, d2 = _deltas(models[0], adapters[0]), _deltas(models[0], adapters[1])
    for k in got:
        if k not in d1:
            assert torch.equal(got[k], base[k]), k
            continue
        mean = (d1[k] + d2[k]) / 2
        want = base[k].double() + mean
        # ΔW_i rounded to fp32 (halving is exact): ≤ U·|ΔW_i|/2 each; their sum and W + mean
        # rounded once each: ≤ U·|mean|, U·|W'|
        tol = U * (d1[k].abs() / 2 + d2[k].abs() / 2 + mean.abs() + want.abs()) * (1 + 1e-6)
        assert torch.all((got[k].double() - want).abs() <= tol), k
        assert not torch.equal(got[k], base[k]), k  # the deltas did move it


def test_adapters_ties_keeps_only_the_top_density_of_each_task_vector(models, adapters,
                                                                      tmp_path):
    rc, out = _merge(tmp_path, "--method", "ties", "--models", str(adapters[0]),
                     "--density", "0.2", "--no-perplexity")
    assert rc == 0
    got, base = _state(out), _state(models[0])
    d = _deltas(models[0], adapters[0])
    for k, dk in d.items():
        k_kept = n_kept(0.2, dk.numel())
        top = torch.zeros(dk.numel(), dtype=torch.bool)
        top[torch.argsort(-dk.float().abs().reshape(-1), stable=True)[:k_kept]] = True
        top = top.reshape(dk.shape)
        changed = got[k] != base[k]
        assert torch.all(top | ~changed), k  # nothing outside the kept 20 % moved
        assert int(changed.sum()) > k_kept // 2, k
        want = base[k].double() + dk
        tol = U * (dk.abs() + 2 * want.abs())
        assert torch.all(((got[k].double() - want).abs() <= tol) | ~top), k


def test_adapters_dare_is_seeded_and_drops_what_its_mask_drops(models, adapters, tmp_path):
    args = ["--method", "dare", "--models", str(adapters[0]), "--drop", "0.5",
            "--no-perplexity"]
    rc, out = _merge(tmp_path, *args, "--seed", "3")
    first = _state(out)
    rc2, out = _merge(tmp_path, *args, "--seed", "3")
    assert rc == rc2 == 0 and all(torch.equal(first[k], _state(out)[k]) for k in first)
    rc, out = _merge(tmp_path, *args, "--seed", "4")
    assert any(not torch.equal(first[k], _state(out)[k]) for k in first)
    base, d = _state(models[0]), _deltas(models[0], adapters[0])
    for k, dk in d.items():
        keep = torch.from_numpy(dare_keep(MM.tensor_seed(3, k), (1, *dk.shape), 0.5)[0])
        assert torch.equal(first[k][~keep], base[k][~keep]), k  # dropped: the base, exactly
        want = base[k].double() + dk * 2  # kept: rescaled by 1/(1 − p)
        tol = U * (2 * dk.abs() + 2 * want.abs())
        assert torch.all((first[k].double() - want).abs()[keep] <= tol[keep]), k


@pytest.mark.parametrize("which, words", [
    ("other-base", "trained on different bases"),
    ("model", "mixes adapters"),
    ("slerp", "not task vectors"),
])
def test_bad_adapter_merges_are_refused(models, adapters, tmp_path, which, words, capsys,
                                        monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal's width (80 under xdist)
    argv = {"other-base": ["--method", "linear", "--models", str(adapters[0]),
                           str(adapters[2])],
            "model": ["--method", "linear", "--models", str(adapters[0]), str(models[0])],
            "slerp": ["--method", "slerp", "--models", str(adapters[0]), str(adapters[1])],
            }[which]
    rc, out = _merge(tmp_path, *argv, "--no-perplexity")
    text = "".join(capsys.readouterr())
    assert rc == 2 and words in text and "Traceback" not in text, text
    assert not out.exists()
