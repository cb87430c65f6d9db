"""The dataset `falsify finetune` ships and trains on by default: small, valid, one format. The
run on it (the built-in base trained into a fresh cache, then QLoRA on this set; the losses
fall; later commands reuse the base) is tests/test_defaults.py's, with the other defaults."""

from __future__ import annotations

from falsify.llm import sft_data as SD


def test_shipped_dataset_is_small_and_valid():
    assert SD.SHIPPED_DATASET.stat().st_size <= 1_000_000
    recs = SD.read_jsonl(SD.SHIPPED_DATASET)
    assert len(recs) > 1000 and {r.kind for r in recs} == {"prompt_response"}
    # the cut is after the docstring's closing quotes; the response opens with the newline
    assert all(r.fields["response"].startswith("\n") for r in recs)
