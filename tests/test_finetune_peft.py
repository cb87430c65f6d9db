"""The exported adapter in the PEFT ecosystem, merge and generate:

* peft.PeftModel.from_pretrained loads adapter_model.safetensors onto transformers'
  LlamaForCausalLM built from the same base in the HF layout (falsify/llm/hf.py) and reproduces our
  logits within the derived fp32 tolerance — for QLoRA the base PEFT gets is the dequantized
  NF4 base the adapter was trained on, and, where bitsandbytes runs, the original fp32 base
  quantized by bitsandbytes itself (our NF4 is bit-compatible, so the logits agree too);
* `falsify merge` writes our and the HF layout, both reproduce base+adapter;
* `falsify generate` samples the same greedy text from base+adapter and the merged model.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path

import pytest
import torch

from falsify.llm import finetune as FT
from falsify.llm import hf
from falsify.llm import lora_model as LM
from falsify.llm.run_lock import LOCK_NAME
from tests.test_finetune import (
    CFG,
    logit_tolerance,
    make_tokenizer,
    shipped_records,
    tiny_model,
    write_base,
    write_jsonl,
)

logging.getLogger("transformers").setLevel(logging.ERROR)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Per method: a base dir, and an adapter trained on it through the CLI (B ≠ 0)."""
    from falsify.cli import main

    root = tmp_path_factory.mktemp("peft")
    tok = root / "tokenizer.json"
    make_tokenizer(tok)
    base = write_base(root / "base", tok)
    data = write_jsonl(root / "d.jsonl", shipped_records(24))
    out = {}
    for key, method, extra in (("qlora", "qlora", []), ("lora", "lora", []),
                               ("qlora-nodq", "qlora", ["double_quant=false"])):
        run = root / f"run-{key}"
        rc = main(["finetune", "--method", method, "--model", str(base), "--data", str(data),
                   "--out", str(run), "max_steps=4", "batch_size=4", "lora_r=4", "lr=3e-2",
                   "val_split=0", "sample_count=0", "progress=false", "backend=torch", *extra])
        assert rc == 0
        out[key] = (base, run / "adapter", tok)
    return out


def _ours(base, adapter):
    model = LM.load_adapter(FT.load_base(base, "torch").model, adapter).eval()
    return model


def _x(n=2, s=48, seed=3):
    return torch.randint(4, CFG.vocab_size, (n, s), generator=torch.Generator().manual_seed(seed))


def _peft_model(hf_dir, adapter, **kw):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = LlamaForCausalLM.from_pretrained(str(hf_dir), attn_implementation="eager", **kw)
        return PeftModel.from_pretrained(m, str(adapter)).eval()


@pytest.mark.parametrize("method", ["qlora", "lora"])
def test_peft_loads_the_adapter_and_reproduces_our_logits(trained, tmp_path, method):
    base, adapter, _ = trained[method]
    model = _ours(base, adapter)
    cfg = json.loads((adapter / LM.ADAPTER_CONFIG).read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 16.0
    from safetensors.torch import load_file

    names = sorted(load_file(str(adapter / LM.ADAPTER_WEIGHTS)))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert len(names) == 2 * 7 * CFG.num_layers
    # the HF base = the weights the adapter was trained against (dequantized NF4 for QLoRA)
    hf.export_hf(LM.merge_lora(model, merge=lambda w, a, b, s: w), tmp_path / "hf")
    pm = _peft_model(tmp_path / "hf", adapter, dtype=torch.float32)
    loaded = {k.replace(".default", ""): v for k, v in pm.state_dict().items() if "lora_" in k}
    ours = LM.peft_state(model)
    assert set(loaded) == set(ours) and all(torch.equal(loaded[k], ours[k]) for k in ours)
    x = _x()
    with torch.no_grad():
        a, p = model(x), pm(input_ids=x).logits
        with LM.adapters_disabled(model):
            b = model(x)
    tol = logit_tolerance(CFG, a)
    assert float((a - p).abs().max()) <= tol
    # the comparison can fail: the adapter moves the logits far more than the tolerance
    assert float((a - b).abs().max()) > 100 * tol


def test_bitsandbytes_quantizes_our_base_to_the_same_nf4_state(trained):
    """For every projection of the base, bitsandbytes' quantize_4bit (nf4, blocksize 64, fp32
    input, no double quantization) gives exactly our packed bytes and absmax, so a QLoRA adapter
    trained here sees the base a bitsandbytes QLoRA run would. (With double quantization
    bitsandbytes 0.50.2 on CPU rounds the absmax mean differently in some tensors — an ulp,
    then other 8-bit absmax codes — so only the nibbles agree there. And transformers 5 +
    bitsandbytes on CPU quantize a bf16 copy of the weights (quant_state.dtype == bfloat16),
    so a from_pretrained 4-bit model is not the fp32-quantized base: logits differ by ~1e-2.)"""
    import bitsandbytes.functional as BF  # installed by scripts/install.sh (interop extra)

    base, adapter, _ = trained["qlora-nodq"]
    model = _ours(base, adapter)
    original = FT.load_base(base, "torch", need_tokenizer=False).model.state_dict()
    n = 0
    for name, mod in LM.adapted_layers(model):
        packed, st = BF.quantize_4bit(original[f"{name}.weight"], blocksize=64,
                                      quant_type="nf4", compress_statistics=False)
        assert torch.equal(packed.reshape(-1), mod.weight_nf4.reshape(-1)), name
        assert torch.equal(st.absmax, mod.weight_absmax), name
        assert torch.equal(BF.dequantize_4bit(packed, st), mod.base_weight()), name
        n += 1
    assert n == 7 * CFG.num_layers


@pytest.mark.parametrize("method", ["qlora", "lora"])
def test_merge_cli_writes_both_layouts_that_match_base_plus_adapter(trained, tmp_path, method,
                                                                   capsys):
    from falsify.cli import main

    base, adapter, _ = trained[method]
    out = tmp_path / "merged"
    # the base comes from the adapter's record
    assert main(["merge", "--adapter", str(adapter), "--out", str(out)]) == 0
    assert "self-check" in capsys.readouterr().out
    model = _ours(base, adapter)
    x = _x(seed=11)
    with torch.no_grad():
        a = model(x)
        ours = FT.load_base(out / "ours", "torch").model.eval()(x)
        from transformers import LlamaForCausalLM

        hfm = LlamaForCausalLM.from_pretrained(str(out / "hf"), dtype=torch.float32,
                                               attn_implementation="eager").eval()
        theirs = hfm(input_ids=x).logits
    tol = logit_tolerance(CFG, a)
    assert float((a - ours).abs().max()) <= tol
    assert float((a - theirs).abs().max()) <= tol
    assert (out / "ours" / "tokenizer.json").is_file() and (out / "hf" / "tokenizer.json").is_file()


def test_merge_refuses_another_base(trained, tmp_path, capsys):
    from falsify.cli import main

    _, adapter, tok = trained["qlora"]
    other = write_base(tmp_path / "other", tok, seed=9)
    assert main(["merge", "--adapter", str(adapter), "--model", str(other), "--out",
                 str(tmp_path / "m")]) == 2
    assert "fingerprints differ" in capsys.readouterr().out
    assert not (tmp_path / "m").exists()


def test_generate_cli_adapter_and_merged_agree(trained, tmp_path, capsys):
    from falsify.cli import main

    base, adapter, _ = trained["qlora"]
    # as the README chains them: merge's output directory (ours/ and hf/) is what --merged takes
    main(["merge", "--adapter", str(adapter), "--out", str(tmp_path / "m")])
    capsys.readouterr()
    prompt = 'def f(x):\n    """Return x."""'
    rc = main(["generate", "--adapter", str(adapter), "--merged", str(tmp_path / "m"),
                   "--prompt", prompt, "--max-new-tokens", "12"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "base (" in text and "base + adapter" in text and "merged" in text
    from falsify.cli import build_parser
    from falsify.cli.generate import sample

    args = build_parser().parse_args(["generate", "--prompt", prompt, "--max-new-tokens", "12"])
    model = _ours(base, adapter)
    merged = FT.load_base(tmp_path / "m", "torch")
    assert Path(merged.path) == tmp_path / "m" / "ours"
    assert sample(model, merged.tokenizer, prompt, args) == \
        sample(merged.model, merged.tokenizer, prompt, args)


def test_adapter_dir_is_complete_and_atomic(trained):
    _, adapter, _ = trained["qlora"]
    files = sorted(p.name for p in Path(adapter).iterdir())
    assert files == sorted([LM.ADAPTER_CONFIG, LM.ADAPTER_WEIGHTS, LM.FALSIFY_META,
                            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"])
    # no temporary left behind; the run directory's lock file stays by design (llm/run_lock.py)
    assert not any(p.name.startswith(".") and p.name != LOCK_NAME
                   for p in Path(adapter).parent.iterdir())
    side = json.loads((adapter / LM.FALSIFY_META).read_text())
    assert side["lora_spec"]["method"] == "qlora" and side["lora_spec"]["double_quant"] is True
    assert side["base_fingerprint"] == FT.base_fingerprint(tiny_model())


# ------------------------------------------------------------------ loading without falsify
def _auto_peft(adapter):
    from peft import AutoPeftModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoPeftModelForCausalLM.from_pretrained(
            str(adapter), dtype=torch.float32, attn_implementation="eager").eval()


def _logits_agree(ours_model, theirs, seed=5):
    x = _x(seed=seed)
    with torch.no_grad():
        a, p = ours_model(x), theirs(input_ids=x).logits
        with LM.adapters_disabled(ours_model) if hasattr(ours_model, "lora_spec") else \
                torch.no_grad():
            b = ours_model(x)
    return float((a - p).abs().max()), logit_tolerance(CFG, a), float((a - b).abs().max())


@pytest.mark.parametrize("method", ["qlora", "lora"])
def test_auto_peft_loads_the_adapter_finetune_wrote(trained, method):
    """base_model_name_or_path names an HF-layout base holding the weights the adapter was
    trained against (our base here is in our layout, so the run wrote OUT/base-hf), and
    `AutoPeftModelForCausalLM.from_pretrained(adapter_dir)` alone reproduces our logits."""
    base, adapter, _ = trained[method]
    cfg = json.loads((adapter / LM.ADAPTER_CONFIG).read_text())
    assert cfg["base_model_name_or_path"] == str((adapter.parent / "base-hf").resolve())
    model = _ours(base, adapter)
    diff, tol, effect = _logits_agree(model, _auto_peft(adapter))
    assert diff <= tol and effect > 100 * tol  # the adapter matters far beyond the tolerance


def _check_tokenizer(d: Path, tok_path: Path):
    """AutoTokenizer reads the directory: eos/pad/bos are <|endoftext|> (id 0), the FIM
    sentinels are special, and it encodes and decodes exactly as our tokenizer does."""
    from transformers import AutoTokenizer, GenerationConfig

    from falsify.llm import data as data_mod

    at = AutoTokenizer.from_pretrained(str(d))
    assert (at.eos_token, at.eos_token_id, at.pad_token_id, at.bos_token_id) == \
        (data_mod.EOS, 0, 0, 0)
    assert set(at.all_special_tokens) == {data_mod.EOS, data_mod.FIM_PREFIX,
                                          data_mod.FIM_MIDDLE, data_mod.FIM_SUFFIX}
    ours = data_mod.load_tokenizer(tok_path)
    for text in ('def f(x):\n    """Return x."""\n    return x  # é ∑ 😀',
                 f"{data_mod.FIM_PREFIX}a = 1{data_mod.FIM_SUFFIX}{data_mod.EOS}b"):
        ids = at(text)["input_ids"]
        assert ids == data_mod.encode(ours, text)
        assert at.decode(ids) == data_mod.decode(ours, ids) == text
    return GenerationConfig.from_pretrained(str(d)) if (d / "generation_config.json").is_file() \
        else None


def test_export_cli_model_loads_in_transformers_with_its_tokenizer(trained, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    from falsify.cli import main

    base, _, tok = trained["lora"]
    out = tmp_path / "exported"
    assert main(["export", str(base), "--out", str(out)]) == 0
    assert "bit-identical" in capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                      attn_implementation="eager").eval()
    model = FT.load_base(base, "torch").model.eval()
    diff, tol, _ = _logits_agree(model, theirs)
    assert diff <= tol
    gen = _check_tokenizer(out, tok)
    assert (gen.eos_token_id, gen.pad_token_id) == (0, 0)
    # the comparison can fail: another base's logits are far outside the tolerance
    other = FT.load_base(write_base(tmp_path / "other", tok, seed=9), "torch").model.eval()
    assert _logits_agree(other, theirs)[0] > 100 * tol


@pytest.mark.parametrize("method", ["qlora", "lora"])
def test_export_cli_adapter_loads_with_auto_peft(trained, tmp_path, method, capsys):
    from falsify.cli import main

    base, adapter, tok = trained[method]
    out = tmp_path / "exported"
    assert main(["export", str(adapter), "--out", str(out)]) == 0
    assert "bit-identical" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["adapter", "base"]
    cfg = json.loads((out / "adapter" / LM.ADAPTER_CONFIG).read_text())
    assert cfg["base_model_name_or_path"] == str((out / "base").resolve())
    diff, tol, effect = _logits_agree(_ours(base, adapter), _auto_peft(out / "adapter"))
    assert diff <= tol and effect > 100 * tol
    _check_tokenizer(out / "adapter", tok)
    _check_tokenizer(out / "base", tok)


def test_export_cli_refuses_bad_input_in_one_line(trained, tmp_path, capsys):
    from falsify.cli import main

    base, adapter, _ = trained["lora"]
    hf_dir = tmp_path / "hf"
    assert main(["export", str(base), "--out", str(hf_dir)]) == 0
    capsys.readouterr()
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [([str(tmp_path / "nope"), "--out", str(tmp_path / "o")], "no such file"),
             ([str(hf_dir), "--out", str(tmp_path / "o")], "already in the HF layout"),
             ([str(base), "--out", str(base / "inner")], "lies inside SRC"),
             ([str(base), "--out", str(tmp_path / "o"), "--tokenizer", str(tmp_path / "t")],
              "no such file"),
             ([str(empty), "--out", str(tmp_path / "o")], "neither an HF LLaMA directory")]
    for argv, words in cases:
        assert main(["export", *argv]) == 2, argv
        err = capsys.readouterr()
        text = err.out + err.err
        assert words in text and "Traceback" not in text, (argv, text)
    assert not (tmp_path / "o").exists() and not (base / "inner").exists()


def test_eval_scores_an_adapter_and_an_hf_export(trained, tmp_path, capsys):
    """`falsify eval` takes what the other commands write: an adapter on its recorded base, and
    an HF-layout export; the perplexity of the same weights is the same through both routes."""
    from falsify.cli import main

    base, adapter, _ = trained["lora"]
    common = ["--limit", "2", "--samples", "1", "--k", "1", "--temperature", "0",
              "--max-new-tokens", "8", "--format", "json"]
    assert main(["eval", "--adapter", str(adapter), *common]) == 0
    with_adapter = json.loads(capsys.readouterr().out)
    assert with_adapter["model"].endswith(f"+ adapter {adapter}")
    assert main(["export", str(base), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert main(["eval", "--model", str(tmp_path / "hf"), *common]) == 0
    via_hf = json.loads(capsys.readouterr().out)
    assert main(["eval", "--model", str(base), *common]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert via_hf["perplexity"] == direct["perplexity"]  # bit-identical weights, same kernels
    assert with_adapter["perplexity"]["perplexity"] != direct["perplexity"]["perplexity"]
