"""Where backend tensors live: Triton on a GPU needs CUDA tensors, the interpreter and torch use
CPU tensors, and a GPU-configured Triton without CUDA is a clear error, never a silent CPU run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from falsify.harness import backends
from falsify.harness.cases import Case


def test_interpreter_and_torch_run_on_cpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert backends.device_for("triton") == "cpu"
    assert backends.device_for("torch") == "cpu"
    case = Case("float16", {"n": 3}, {"x": np.arange(3.0)}, {}, 0, "t")
    t = backends.args_for("triton", case, {})["x"]
    assert t.device.type == "cpu" and t.dtype == torch.float16


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the error path "
                    "only exists without it")
def test_gpu_configured_triton_without_cuda_is_an_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(backends.BindingError, match="no CUDA device"):
        backends.device_for("triton")
    assert backends.device_for("torch") == "cpu"


def test_poisoned_view_lives_on_the_tensors_device():
    t = torch.arange(6.0).reshape(2, 3)
    view, (buf, mask) = backends._poisoned_view(t)
    assert view.device == buf.device == mask.device == t.device
    assert torch.equal(view, t) and torch.isnan(buf[mask]).all()
