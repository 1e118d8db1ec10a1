"""Energy per token from NVML (a fake NVML on CPU) and cost per million tokens."""

from __future__ import annotations

import sys
import time
import types

import pytest
import torch

from svdmlp.bench import energy

CUDA = torch.device("cuda", 0)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A fake NVML whose counter advances 0.5 J per generation call, on a pretend CUDA device."""
    state = {"mj": 1000, "counter": True}
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda index: ("gpu", index),
        nvmlDeviceGetPowerUsage=lambda handle: 100_000,  # 100 W in mW
    )

    def counter(handle):
        if not state["counter"]:
            raise RuntimeError("not supported")
        return state["mj"]

    nvml.nvmlDeviceGetTotalEnergyConsumption = counter
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(energy, "MIN_SECONDS", 0.0)

    def generate():
        state["mj"] += 500

    return state, generate


def test_the_energy_counter_gives_joules_per_token(fake_gpu):
    _, generate = fake_gpu
    joules, why = energy.joules_per_token(generate, tokens_per_call=10, device=CUDA)
    assert why is None and joules == pytest.approx(0.05)  # 0.5 J over 10 tokens, one call


def test_without_a_counter_sampled_power_is_integrated(fake_gpu, monkeypatch):
    state, _ = fake_gpu
    state["counter"] = False
    monkeypatch.setattr(energy, "MIN_SECONDS", 0.2)
    joules, why = energy.joules_per_token(lambda: time.sleep(0.01), tokens_per_call=1, device=CUDA)
    assert why is None
    assert joules == pytest.approx(100 * 0.01, rel=0.5)  # 100 W for each call of about 10 ms


def test_no_energy_off_cuda_or_without_nvml(monkeypatch):
    assert energy.joules_per_token(lambda: None, 1, torch.device("cpu")) == (
        None,
        "energy is measured on CUDA GPUs (NVML)",
    )
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    joules, why = energy.joules_per_token(lambda: None, 1, CUDA)
    assert joules is None and "nvidia-ml-py" in why


def test_dollars_per_million_tokens():
    # 1 ms per step at batch 1 is 1000 tokens/s; a million tokens take 1000 s = 1/3.6 h.
    assert energy.dollars_per_million_tokens(1e-3, 1, 3.6) == pytest.approx(1.0)
    assert energy.dollars_per_million_tokens(1e-3, 4, 3.6) == pytest.approx(0.25)
