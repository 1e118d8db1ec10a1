"""Where and in what dtype commands run: one rule for every command."""

from __future__ import annotations

import pytest
import torch

from svdmlp import runtime


@pytest.mark.parametrize("device", [None, "", "auto"])
def test_default_is_cpu_and_float32_without_a_gpu(monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.resolve(device) == (torch.device("cpu"), torch.float32)


def test_default_is_cuda_and_bfloat16_with_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.resolve() == (torch.device("cuda"), torch.bfloat16)
    assert runtime.resolve("cpu") == (torch.device("cpu"), torch.float32)  # the dtype follows the device
    assert runtime.resolve("cuda:1", "float16") == (torch.device("cuda:1"), torch.float16)


def test_asked_dtype_wins():
    assert runtime.resolve("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)


def test_cuda_without_a_gpu_and_unknown_devices_are_errors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--device cuda:0 was asked for but no CUDA GPU is available"):
        runtime.resolve("cuda:0")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        runtime.resolve("tpu")


def test_freed_memory_goes_back_to_the_system_where_glibc_allows():
    """glibc's mallopt takes the fixed threshold; elsewhere nothing changes and the answer says so (what
    it saves is measured in BENCHMARKS.md, not here)."""
    import platform

    from svdmlp.runtime import return_freed_memory

    changed = return_freed_memory()
    assert changed == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_the_heap_gives_its_free_pages_back_where_glibc_allows():
    import platform

    from svdmlp.runtime import trim_heap

    assert trim_heap() == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")


def test_peak_memory_is_the_processes_high_water_mark(monkeypatch):
    from pathlib import Path

    from svdmlp.runtime import peak_memory

    held = torch.ones(64 * 2**20 // 4)  # 64 MiB touched: the mark is at least the live set
    status = Path("/proc/self/status").read_text()
    high_water = (
        next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) * 1024
    )
    peaks = peak_memory(torch.device("cpu"))
    assert peaks.keys() == {"host"} and peaks["host"] >= held.numel() * 4
    assert abs(peaks["host"] - high_water) < 16 * 2**20  # what /usr/bin/time -v would say
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 123)
    assert peak_memory(torch.device("cuda"))["cuda"] == 123


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("shape", [(37, 53), (5, 7, 11), (101,)])
def test_all_finite_finds_a_bad_entry_in_any_strip(monkeypatch, bad, shape):
    monkeypatch.setattr(runtime, "FINITE_CHECK_BYTES", 3 * 8 * 53)  # strips of a few rows
    generator = torch.Generator().manual_seed(0)
    tensor = torch.randn(shape, dtype=torch.float64, generator=generator)
    assert runtime.all_finite(tensor)
    for flat in (0, tensor.numel() // 2, tensor.numel() - 1):  # the first strip, a middle one, the last
        spoiled = tensor.clone()
        spoiled.view(-1)[flat] = bad
        assert not runtime.all_finite(spoiled)
    assert runtime.all_finite(torch.tensor(1.0)) and not runtime.all_finite(torch.tensor(bad))
    assert runtime.all_finite(torch.empty(0, 4))
