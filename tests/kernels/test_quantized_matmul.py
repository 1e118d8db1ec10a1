"""The Triton GEMM on quantized factors against float64 of the dequantized factor, on awkward shapes,
its output poisoned first (in the interpreter on CPU, natively on a GPU)."""

from __future__ import annotations

import pytest
import torch

from svdmlp.int_weights import STORED, QuantizedMatrix


@pytest.mark.parametrize("name", sorted(STORED))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 17, 7), (5, 300, 33), (17, 130, 64), (3, 256, 130)])
def test_quantized_gemm_matches_float64_of_the_dequantized_factor(kh, name, dtype, m, k, n):
    from svdmlp.kernels.quantized_matmul import quantized_matmul

    generator = torch.Generator().manual_seed(m * k + n)
    matrix = torch.randn(k, n, generator=generator) / k**0.5 + 0.05  # off centre: zero points matter
    quantized = QuantizedMatrix.of(matrix, STORED[name]).to(kh.device)
    a = torch.randn(m, k + 5, generator=generator)[:, 5:].to(kh.device, dtype)  # rows not contiguous
    out = torch.full((m, n), float("nan"), dtype=dtype, device=kh.device)
    how = quantized.scheme
    zeros = quantized.zeros if how.zero_point else None
    quantized_matmul(a, quantized.values, quantized.scales, how.bits, how.group, out, zero_points=zeros)
    reference = a.double() @ quantized.dequantized(torch.float64).T
    kh.assert_close_to_reference(out, reference, f"{name} {dtype} {m}x{k}x{n}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(STORED))
@pytest.mark.parametrize("tokens", [1, 16, 40])
def test_a_quantized_factor_on_the_gpu_reads_its_packed_values_at_decode(kh, cuda_only, name, tokens):
    """M <= 16 runs the Triton kernel, M = 40 the dequantized factor through cuBLAS: both against float64."""
    generator = torch.Generator().manual_seed(tokens)
    matrix = torch.randn(576, 200, generator=generator) / 24
    quantized = QuantizedMatrix.of(matrix, STORED[name]).to(kh.device)
    x = torch.randn(tokens, 576, generator=generator).to(kh.device, torch.bfloat16)
    with torch.no_grad():
        out = quantized.matmul(x)
    kh.assert_close_to_reference(
        out, x.double() @ quantized.dequantized(torch.float64).T, f"{name} M={tokens}"
    )
