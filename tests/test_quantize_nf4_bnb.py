"""`falsify quantize --method nf4` writes OUT/hf-bnb-nf4, a pre-quantized bitsandbytes 4-bit
checkpoint (falsify/llm/quantize_model.py: export_hf_bnb). With bitsandbytes as the oracle:
transformers loads it with no missing or unexpected key, every projection becomes a Linear4bit
whose dequantized weight is exactly our dequantized weight, our packed bytes are
bitsandbytes.functional.quantize_4bit's byte for byte, the tensors and quant_state bytes are
what transformers' own save_pretrained writes for a bnb-quantized model, and the logits match
our dequantized model within the derived fp32 tolerance."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
import torch
from safetensors.torch import load_file

from falsify.bench.finetune import bnb_cpu_ok
from falsify.llm import hf
from falsify.llm import quantize_model as Q
from falsify.llm.prune import projection_weights
from tests.test_finetune import CFG, base_with_tokenizer, logit_tolerance, tiny_model

transformers = pytest.importorskip("transformers")
bnb = pytest.importorskip("bitsandbytes")
_OK, _WHY = bnb_cpu_ok()
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)

# words transformers and bitsandbytes use when a checkpoint does not fit the model
_KEY_WORDS = ("missing", "unexpected", "not used", "newly initialized", "mismatch",
              "not initialized")


def _quantized(tmp_path, double_quant: bool):
    model = tiny_model().eval()
    q = Q.quantize_model(model, Q.QuantSpec("nf4", double_quant=double_quant), tmp_path / "q")
    return model, q, Q.export_hf_bnb(q, tmp_path / Q.BNB_DIR)


def _load(path, caplog):
    """from_pretrained with every warning and log record of the load kept."""
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        m, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, output_loading_info=True, dtype=torch.float32)
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    return m.eval(), info, said


@pytest.mark.parametrize("double_quant", [False, True], ids=["nf4", "nf4-double-quant"])
def test_bitsandbytes_loads_the_export_and_decodes_our_weights(tmp_path, caplog, double_quant):
    model, q, path = _quantized(tmp_path, double_quant)
    hf_model, info, said = _load(path, caplog)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    noisy = [s for s in said if any(w in s.lower() for w in _KEY_WORDS)]
    assert not noisy, noisy
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert cfg["bnb_4bit_use_double_quant"] is double_quant

    ours = Q.dequantize_model(q).eval()
    want = {k: v.detach() for k, v in projection_weights(ours).items()}
    linears = {n.removeprefix("model."): m for n, m in hf_model.named_modules()
               if isinstance(m, bnb.nn.Linear4bit)}
    assert set(linears) == set(want)  # every projection, and nothing else, is 4-bit
    worst = 0.0
    for name, lin in linears.items():
        qs = lin.weight.quant_state
        assert (qs.quant_type, qs.blocksize, qs.nested) == ("nf4", Q.NF4_BLOCK, double_quant)
        got = bnb.functional.dequantize_4bit(lin.weight.data, qs).detach()
        worst = max(worst, float((got - want[name]).abs().max()))
        assert got.dtype == torch.float32 and torch.equal(got, want[name]), name
    print(f"max |bnb dequantize_4bit - ours| over {len(linears)} projections "
          f"(double_quant={double_quant}): {worst}")
    # the non-quantized tensors are ours unchanged
    theirs = {k.removeprefix("model."): v for k, v in hf_model.state_dict().items()}
    for k, v in ours.state_dict().items():
        if k.removesuffix(".weight") not in want:
            assert torch.equal(theirs[k], v), k

    # Logits: the same weights through two fp32 forward passes with different op orders.
    # bitsandbytes' Linear4bit takes a bfloat16 path on CPUs with AVX512-BF16 in eval mode
    # without grad (it repacks the weight, rounds absmax and the activations to bf16:
    # Linear4bit.forward / _convert_weight_packed_for_cpu); in train mode it dequantizes to the
    # compute dtype (float32 here) and runs F.linear on every CPU. The LLaMA model has no
    # dropout (attention_dropout 0.0), so train mode computes the same function.
    ids = torch.randint(0, CFG.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = ours(ids).float()
        b = hf_model.train()(ids).logits.float()
        c = hf_model.eval()(ids).logits.float()  # whichever path this CPU takes: reported
    tol = logit_tolerance(CFG, a)
    diff = float((a - b).abs().max())
    print(f"logits max |HF+bnb (fp32 path) - ours| = {diff:.3g} (tol {tol:.3g}, max|logit| "
          f"{float(a.abs().max()):.3g}); eval-mode path (bf16 where the CPU has AVX512-BF16): "
          f"{float((a - c).abs().max()):.3g}")
    assert float(a.abs().max()) > 1.0 and diff <= tol


def test_packed_bytes_are_bitsandbytes_quantize_4bit(tmp_path):
    """Our packed bytes and absmax vs bitsandbytes' quantizer on the same fp32 weights, and the
    quant_state we serialize vs QuantState.as_dict(packed=True), byte for byte."""
    model, q, path = _quantized(tmp_path, False)
    saved = load_file(str(path / "model.safetensors"))
    for name, w in projection_weights(model).items():
        key = f"model.{name}.weight"
        packed, qs = bnb.functional.quantize_4bit(w.detach().float().contiguous(),
                                                  blocksize=Q.NF4_BLOCK, quant_type="nf4")
        assert torch.equal(saved[key], packed.reshape(-1, 1)), name
        for k, v in qs.as_dict(packed=True).items():
            assert torch.equal(saved[f"{key}.{k}"], v.reshape(saved[f"{key}.{k}"].shape)), \
                (name, k)
    # double quantization: the packed bytes still match (the statistics may not; the load
    # test above shows bitsandbytes decodes what we store exactly)
    _, q2, path2 = _quantized(tmp_path / "dq", True)
    saved2 = load_file(str(path2 / "model.safetensors"))
    for name, w in projection_weights(model).items():
        packed, _ = bnb.functional.quantize_4bit(w.detach().float().contiguous(),
                                                 blocksize=Q.NF4_BLOCK, quant_type="nf4",
                                                 compress_statistics=True)
        assert torch.equal(saved2[f"model.{name}.weight"], packed.reshape(-1, 1)), name


@pytest.mark.parametrize("double_quant", [False, True], ids=["nf4", "nf4-double-quant"])
def test_layout_is_what_transformers_saves(tmp_path, double_quant):
    """The oracle's own checkpoint: the fp32 model exported to HF, quantized by transformers +
    bitsandbytes on load, written by save_pretrained. Same tensor names, dtypes and shapes, the
    same quantization_config, and the same quant_state fields."""
    model, _, path = _quantized(tmp_path, double_quant)
    hf.export_hf(model, tmp_path / "fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / "fp32", local_files_only=True, dtype=torch.float32,
            quantization_config=transformers.BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=double_quant,
                bnb_4bit_compute_dtype=torch.float32))
        theirs.save_pretrained(tmp_path / "theirs")
    a = load_file(str(path / "model.safetensors"))
    b = load_file(str(tmp_path / "theirs" / "model.safetensors"))
    assert {k: (v.dtype, tuple(v.shape)) for k, v in a.items() if "quant_state" not in k} == \
        {k: (v.dtype, tuple(v.shape)) for k, v in b.items() if "quant_state" not in k}
    for k in (k for k in a if "quant_state" in k):
        ours_qs, their_qs = (json.loads(bytes(t[k].numpy()).decode()) for t in (a, b))
        assert list(ours_qs) == list(their_qs), k
        assert {f: v for f, v in ours_qs.items() if f != "nested_offset"} == \
            {f: v for f, v in their_qs.items() if f != "nested_offset"}, k
    qa = json.loads((path / "config.json").read_text())["quantization_config"]
    qb = json.loads((tmp_path / "theirs" / "config.json").read_text())["quantization_config"]
    assert qa == qb


def test_quantize_cli_writes_the_bnb_checkpoint_with_its_tokenizer(tmp_path, capsys,
                                                                  monkeypatch):
    from falsify.cli import main

    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal's width (80 under xdist)

    base = base_with_tokenizer(tmp_path)
    out = tmp_path / "out"
    assert main(["quantize", "--model", str(base), "--out", str(out), "--method", "nf4",
                 "--double-quant"]) == 0
    said = capsys.readouterr().out
    assert "decodes bit for bit" in said and Q.BNB_DIR in said
    tok = transformers.AutoTokenizer.from_pretrained(out / Q.BNB_DIR, local_files_only=True)
    assert tok.eos_token == "<|endoftext|>"
    # our decoder of the export agrees with OUT/ours tensor for tensor
    from falsify.llm import finetune as FT

    ours = FT.load_base(out / "ours", "torch").model.state_dict()
    back = Q.read_hf_bnb(out / Q.BNB_DIR)
    assert set(back) == set(ours) and all(torch.equal(back[k], ours[k]) for k in ours)


def test_export_refuses_a_non_nf4_directory(tmp_path):
    Q.quantize_model(tiny_model(), Q.QuantSpec("int8"), tmp_path / "q")
    with pytest.raises(Q.QuantizeError, match="needs nf4"):
        Q.export_hf_bnb(tmp_path / "q", tmp_path / "o")
    with pytest.raises(Q.QuantizeError, match="--double-quant goes with --method nf4"):
        Q.QuantSpec("int4", double_quant=True).validate()
