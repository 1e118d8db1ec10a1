"""The median timers: wall time on a CPU; on CUDA, held streams time the device and not the host."""

from __future__ import annotations

import time

import pytest
import torch

from svdmlp import timing


def test_cpu_median_is_the_median_wall_time():
    sleeps = iter([0.03, 0.0, 0.01, 0.02])  # the first call is the warm-up

    def fn():
        time.sleep(next(sleeps))

    assert timing.cpu_median(fn, repeats=3) == pytest.approx(0.01, abs=0.004)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_held_stream_times_the_device_not_the_host():
    x = torch.ones(16, device="cuda")

    def slow_host():  # two tiny kernels with 2 ms of host work between them
        x.add_(1)
        time.sleep(0.002)
        x.add_(1)

    assert timing.cuda_median(slow_host, repeats=5) > 1.5e-3
    assert timing.cuda_median(slow_host, repeats=5, hold=True) < 0.5e-3
