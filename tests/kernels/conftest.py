"""Kernel tests run on a CUDA GPU when there is one, else in the Triton interpreter on CPU.

TRITON_INTERPRET must be set before the kernels are *defined* (``@triton.jit`` reads it then), so it
is set here, at collection time, before any kernel test module imports ``svdmlp.kernels``.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"


def _redefine_kernels_if_compiled_for_a_gpu() -> None:
    """If something imported svdmlp.kernels before this file set TRITON_INTERPRET (a test module
    collected earlier), its kernels were defined for a GPU; redefine them, in import order."""
    if HAS_CUDA or "svdmlp.kernels.matmul" not in sys.modules:
        return
    from svdmlp.kernels.common import is_interpreted

    if is_interpreted(sys.modules["svdmlp.kernels.matmul"]._matmul_kernel):
        return
    modules = ("common", "configs", "dequantize", "matmul", "quantized_matmul", "gated_expand")
    modules += ("quantized_gated_expand", "lowrank_linear", "gated_mlp", "quantized_gated_mlp", "")
    for name in modules:
        module = sys.modules.get(f"svdmlp.kernels.{name}".rstrip("."))
        if module is not None:
            importlib.reload(module)


_redefine_kernels_if_compiled_for_a_gpu()

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")

# Tolerances, elementwise |y - ref| <= tol * (1 + |ref|), against a float64 evaluation of torch_ref
# on the same (already rounded) inputs; outputs are O(1) by construction (factors scaled by
# 1/sqrt(fan-in)). Each number is the unit roundoff u of the dtype times the rounding steps a result
# passes through (strip, intermediate h, down strip, output: <= 4, each adding <= u relative, plus
# fp32 accumulation), with room for the error to sum over the rank, then checked against the worst
# case of all kernel tests (fuzz included): at most half of each 16-bit tolerance is used, 5% of fp32's.
TOLERANCE = {
    # u = 2^-24 = 6e-8; K <= 256 fp32 accumulations bound the error by ~K·u = 1.5e-5 (typically
    # sqrt(K)·u). On a GPU the kernels use IEEE fp32 dots, not TF32, so this holds there too.
    torch.float32: 1e-5,
    # u = 2^-11 = 4.9e-4; 4 roundings and accumulation: 8u.
    torch.float16: 4e-3,
    # u = 2^-8 = 3.9e-3, but the interpreter's fp32->bf16 casts truncate (2^-7 per rounding, always
    # toward zero, so the errors do not cancel): 4 roundings of 2^-7 ~ 3e-2, rounded up to 4e-2.
    # On a GPU bf16 rounds to nearest and uses about half of this.
    torch.bfloat16: 4e-2,
}


def tolerance_ratio(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / (tol · (1 + |expected|)): <= 1 passes. NaN anywhere gives inf."""
    tol = TOLERANCE[actual.dtype]
    error = (actual.double() - expected.double()).abs()
    ratio = (error / (tol * (1.0 + expected.double().abs()))).max().item() if error.numel() else 0.0
    return math.inf if math.isnan(ratio) else ratio


def assert_close_to_reference(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values in the output (masked store missed?)"
    ratio = tolerance_ratio(actual, expected)
    worst = (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0
    assert ratio <= 1.0, f"{what}: max abs error {worst:.3e} is {ratio:.2f}x the {actual.dtype} tolerance"


@pytest.fixture(autouse=True)
def poison_buffers(monkeypatch):
    """Every buffer a launcher allocates starts as NaN, so an element a kernel fails to write (or an
    accumulator it fails to zero) shows up as NaN in the output instead of passing by luck."""
    from svdmlp.kernels import common

    def nan_empty(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(common, "new_empty", nan_empty)


@pytest.fixture
def cuda_only():
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")


def random_factor(generator: torch.Generator, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A (rows, cols) factor scaled by 1/sqrt(rows), so that products keep O(1) entries."""
    values = torch.randn(rows, cols, generator=generator) / math.sqrt(max(rows, 1))
    return values.to(dtype).to(DEVICE)


def random_input(generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(dtype).to(DEVICE)


def in_float64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.double() for t in tensors]


@pytest.fixture
def kh():
    """The kernel-test helpers above (``--import-mode=importlib`` forbids importing conftest)."""
    return SimpleNamespace(
        device=DEVICE,
        tolerance=TOLERANCE,
        random_factor=random_factor,
        random_input=random_input,
        in_float64=in_float64,
        assert_close_to_reference=assert_close_to_reference,
        tolerance_ratio=tolerance_ratio,
    )
