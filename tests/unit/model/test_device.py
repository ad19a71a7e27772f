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


@pytest.mark.parametrize(("value", "native"), [("0", False), ("1", True)])
def test_native_bf16_switch_overrides_the_cpu_probe(monkeypatch, value, native):
    monkeypatch.setenv(dev.NATIVE_BF16_ENV, value)
    dev.cpu_has_native_bf16.cache_clear()
    try:
        assert dev.cpu_has_native_bf16() is native
        assert dev.uses_bf16(torch.device("cpu"), "auto") is native
    finally:
        monkeypatch.delenv(dev.NATIVE_BF16_ENV)
        dev.cpu_has_native_bf16.cache_clear()


def test_native_bf16_switch_rejects_other_values(monkeypatch):
    from smiexlm.errors import ConfigError

    monkeypatch.setenv(dev.NATIVE_BF16_ENV, "yes")
    dev.cpu_has_native_bf16.cache_clear()
    try:
        with pytest.raises(ConfigError, match="SMIEXLM_NATIVE_BF16.*'yes'"):
            dev.cpu_has_native_bf16()
    finally:
        monkeypatch.delenv(dev.NATIVE_BF16_ENV)
        dev.cpu_has_native_bf16.cache_clear()
