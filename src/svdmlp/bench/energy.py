"""Energy and cost per generated token: the argument for compression that a data-centre bill makes.

Energy comes from NVML (``nvidia-ml-py``, imported as ``pynvml``) on CUDA: the GPU's energy counter
read before and after repeated generation calls, or, where a GPU has no counter, its power sampled
every few milliseconds on a thread and integrated. One generation call is far shorter than NVML's
update period, so calls repeat until ``MIN_SECONDS`` have passed. The count includes each call's
prefill (a 128-token prompt costs about one decode step's worth of weight reads at batch 1).
Cost is the decode time at a price per device-hour (``--price``); it needs no NVML.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from itertools import pairwise

import torch

MIN_SECONDS = 2.0  # generation repeated at least this long per measurement
SAMPLE_S = 0.005  # power sampling period where the GPU has no energy counter


def _nvml():
    """``pynvml``, initialised, or None and why not."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - missing package, driver or library: all mean "no energy"
        return None, f"NVML unavailable ({type(err).__name__}: {err}); pip install nvidia-ml-py"
    return nvml, None


def _repeat(generate: Callable[[], object], device: torch.device) -> int:
    """Call ``generate`` until MIN_SECONDS have passed (at least once); the number of calls."""
    calls, started = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - started < MIN_SECONDS:
        generate()
        torch.cuda.synchronize(device)
        calls += 1
    return calls


def _sampled_joules(nvml, handle, run: Callable[[], int]) -> tuple[float, int]:
    """``run()`` with the power sampled on a thread; the energy integrated over the samples."""
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append((time.perf_counter(), nvml.nvmlDeviceGetPowerUsage(handle) / 1e3))  # mW to W
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        calls = run()
    finally:
        done.set()
        sampler.join()
    return sum((t1 - t0) * watts for (t0, watts), (t1, _) in pairwise(samples)), calls


def joules_per_token(
    generate: Callable[[], object], tokens_per_call: int, device: torch.device
) -> tuple[float | None, str | None]:
    """Energy per generated token of ``generate()`` on ``device``, or None and why it was not measured."""
    if device.type != "cuda":
        return None, "energy is measured on CUDA GPUs (NVML)"
    nvml, why = _nvml()
    if nvml is None:
        return None, why
    index = device.index if device.index is not None else torch.cuda.current_device()
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    torch.cuda.synchronize(device)
    try:
        before = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # mJ since the driver loaded
    except Exception:  # noqa: BLE001 - no energy counter on this GPU: integrate sampled power
        joules, calls = _sampled_joules(nvml, handle, lambda: _repeat(generate, device))
    else:
        calls = _repeat(generate, device)
        joules = (nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - before) / 1e3
    return joules / (calls * tokens_per_call), None


def dollars_per_million_tokens(seconds_per_step: float, batch: int, price_per_hour: float) -> float:
    """What a million generated tokens cost at ``price_per_hour`` for the device, at this decode speed."""
    return price_per_hour / 3600 * seconds_per_step / batch * 1e6
