"""Timers and the two ceilings every benchmark row is judged against.

GPU work is asynchronous, so CUDA timings use device events around each call, after warm-up (which
also keeps Triton's compilation and cuBLAS's handle creation out of the numbers), and report the
median. Callers that want the kernels' own time capture the call in a CUDA graph and time the
replays (how a decoder runs them); eagerly, a call whose host work outlasts its kernels is timed at
the host's pace. :func:`hold_stream` keeps the device busy while the host queues work behind it, so
that events around single launches time the launch, not the host's gap before it. On a CPU a median
of ``time.perf_counter`` intervals is enough.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


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


def cuda_median(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median device time of ``fn()`` in seconds, one pair of CUDA events per call."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends, strict=True)) / 1e3


# Device cycles one hold spins for: 5 M cycles is 2.5 ms at the H200's 1980 MHz boost clock, longer
# than the host needs to queue one fused call with events around each launch (about 0.3 ms measured).
HOLD_CYCLES = 5_000_000


def hold_stream(cycles: int = HOLD_CYCLES) -> None:
    """Queue a kernel that spins for ``cycles`` on the current CUDA stream, so that the launches the
    host queues next start back to back once it ends."""
    torch.cuda._sleep(cycles)


@dataclass(frozen=True)
class Ceilings:
    """Measured device-copy bandwidth (bytes read + written per second) and matmul FLOP/s."""

    bandwidth: float
    matmul_flops: float
    copy_bytes: int
    matmul_size: int
    dtype: str

    def to_dict(self) -> dict:
        return {
            "copy_bandwidth": self.bandwidth,
            "matmul_flops": self.matmul_flops,
            "copy_bytes": self.copy_bytes,
            "matmul_size": self.matmul_size,
            "dtype": self.dtype,
        }


def measure_ceilings(device: torch.device, dtype: torch.dtype, copy_bytes: int, matmul_size: int) -> Ceilings:
    """Copy a ``copy_bytes`` tensor and multiply two ``matmul_size``² matrices, on random data.

    Random, not zeros: a bf16 product ran 13% faster on zeros on this project's H200.
    """
    src = torch.randn(copy_bytes // dtype.itemsize, device=device).to(dtype)
    dst = torch.empty_like(src)
    a = torch.randn(matmul_size, matmul_size, device=device).to(dtype)
    b = torch.randn(matmul_size, matmul_size, device=device).to(dtype)
    if device.type == "cuda":
        copy_s = cuda_median(lambda: dst.copy_(src), repeats=10)
        matmul_s = cuda_median(lambda: a @ b, repeats=10)
    else:
        copy_s = cpu_median(lambda: dst.copy_(src), repeats=7)
        matmul_s = cpu_median(lambda: a @ b, repeats=5)
    nbytes = src.numel() * dtype.itemsize
    return Ceilings(
        bandwidth=2 * nbytes / copy_s,
        matmul_flops=2 * matmul_size**3 / matmul_s,
        copy_bytes=nbytes,
        matmul_size=matmul_size,
        dtype=str(dtype).removeprefix("torch."),
    )
