"""Timers shared by the benchmarks and the backend's measured choice.

GPU work is asynchronous, so CUDA timings use device events around each call, after warm-up (which
also keeps Triton's compilation and cuBLAS's handle creation out of the numbers), and report the
median. Callers that want the kernels' own time capture the call in a CUDA graph and time the
replays (how a decoder runs them), or hold the stream (:func:`hold_stream`) so that the host queues
the call behind a spinning kernel and the events time the device, not the host's gaps between
launches; eagerly, a call whose host work outlasts its kernels is timed at the host's pace (the
first device run: 0.3-0.5 ms to queue one fused MLP whose kernels take 30-100 µs). On a CPU a median
of ``time.perf_counter`` intervals is enough.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

# Device cycles one hold spins for: 5 M cycles is 2.5 ms at the H200's 1980 MHz boost clock, longer
# than the host needs to queue one fused call with events around each launch (about 0.5 ms measured).
HOLD_CYCLES = 5_000_000


def hold_stream(cycles: int = HOLD_CYCLES) -> None:
    """Queue a kernel that spins for ``cycles`` on the current CUDA stream, so that the launches the
    host queues next start back to back once it ends."""
    torch.cuda._sleep(cycles)


def cpu_median(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def cuda_median(fn: Callable[[], object], repeats: int, warmup: int = 3, hold: bool = False) -> float:
    """Median time of ``fn()`` in seconds, one pair of CUDA events per call; with ``hold``, each call
    queued behind :func:`hold_stream` (the device's time, not the host's)."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        if hold:
            hold_stream()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)) / 1e3
