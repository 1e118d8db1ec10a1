"""The two ceilings every benchmark row is judged against (the timers are :mod:`svdmlp.timing`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from svdmlp.timing import cpu_median, cuda_median


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
