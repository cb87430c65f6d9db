"""Hand-written edge tests for embedding (the contract covers the math; these cover the API)."""

import numpy as np
import pytest
import torch

from falsify.kernels.torch import embedding as emb_torch
from falsify.kernels.triton import embedding as emb_triton
from falsify.reference import embedding as emb_ref

BACKENDS = [emb_torch, emb_triton]
IDS = ["torch", "triton"]
TABLE = torch.randn(10, 6)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
@pytest.mark.parametrize("ids", [[0, 10], [-1], [3, 2 ** 40]])
def test_out_of_range_ids_raise_before_launch(mod, ids):
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        mod.embedding(torch.tensor(ids), TABLE)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
@pytest.mark.parametrize("ids, table", [
    (torch.tensor([0.0, 1.0]), TABLE),                       # float ids
    (torch.tensor([0, 1]), torch.randn(10)),                 # 1-D table
    (torch.tensor([0, 1]), torch.ones(10, 6, dtype=torch.int64)),
])
def test_bad_types_raise(mod, ids, table):
    with pytest.raises(TypeError):
        mod.embedding(ids, table)


def test_reference_rejects_out_of_range():
    with pytest.raises(ValueError):
        emb_ref.embedding(np.array([5]), np.zeros((5, 2)))


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_repeated_ids_accumulate_and_unused_rows_are_zero(mod):
    ids = torch.tensor([[3, 3, 3, 1]])
    table = TABLE.clone().requires_grad_()
    mod.embedding(ids, table).sum().backward()
    want = torch.zeros(10, 6)
    want[3], want[1] = 3.0, 1.0
    assert torch.equal(table.grad, want)


@pytest.mark.parametrize("mod", BACKENDS, ids=IDS)
def test_int32_ids_strided_table_and_out(mod):
    big = torch.randn(10, 9)
    table = big[:, 1:7]  # row stride 9
    ids = torch.tensor([[9, 0], [4, 4]], dtype=torch.int32)
    buf = torch.full((2, 2, 8), float("nan"))
    out = buf[..., 1:7]
    mod.embedding(ids, table, out=out)
    assert torch.equal(out, table[ids.long()])
    assert torch.isnan(buf[..., 0]).all() and torch.isnan(buf[..., 7]).all()
