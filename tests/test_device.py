"""The precision policy that goes with a device."""

from __future__ import annotations

import pytest
import torch

from smiexlm import device as dev


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_is_bf16_on_gpu_and_on_cpus_with_native_bf16(monkeypatch, native):
    monkeypatch.setattr(dev, "cpu_has_native_bf16", lambda: native)
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert dev.uses_bf16(cpu, "auto") is native
    assert dev.uses_bf16(gpu, "auto") is True
    assert dev.uses_bf16(cpu, "bf16") is True and dev.uses_bf16(gpu, "fp32") is False
    with dev.autocast(cpu, "auto"):
        y = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert y.dtype == (torch.bfloat16 if native else torch.float32)
