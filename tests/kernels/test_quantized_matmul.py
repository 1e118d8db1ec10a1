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


def _values(factor) -> torch.Tensor:
    """A correction factor ``(in, out)`` as the float64 values it stands for."""
    if isinstance(factor, QuantizedMatrix):
        return factor.dequantized(torch.float64).T
    return factor.double()


@pytest.mark.parametrize("name", sorted(STORED))
@pytest.mark.parametrize("factors", ["float", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("m", "k", "n", "rank"), [(1, 17, 7, 5), (5, 300, 33, 16), (16, 130, 64, 33)])
def test_a_correction_in_the_same_pass_matches_float64(kh, name, factors, dtype, m, k, n, rank):
    from svdmlp.kernels.quantized_matmul import quantized_matmul

    generator = torch.Generator().manual_seed(m + k + n + rank)
    matrix = torch.randn(k, n, generator=generator) / k**0.5 + 0.05
    quantized = QuantizedMatrix.of(matrix, STORED[name]).to(kh.device)
    u_t = torch.randn(k, rank, generator=generator) / k**0.5
    v_t = torch.randn(rank, n, generator=generator) / rank**0.5
    if factors == "int8":
        u_t, v_t = (QuantizedMatrix.of(f, STORED["int8"]).to(kh.device) for f in (u_t, v_t))
    else:
        u_t, v_t = u_t.to(kh.device, dtype), v_t.to(kh.device, dtype)
    a = torch.randn(m, k + 3, generator=generator)[:, 3:].to(kh.device, dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=kh.device)
    how = quantized.scheme
    zeros = quantized.zeros if how.zero_point else None
    quantized_matmul(
        a,
        quantized.values,
        quantized.scales,
        how.bits,
        how.group,
        out,
        zero_points=zeros,
        correction=(u_t, v_t),
    )
    reference = a.double() @ quantized.dequantized(torch.float64).T + (a.double() @ _values(u_t)) @ _values(
        v_t
    )
    kh.assert_close_to_reference(out, reference, f"{name} + {factors} rank {rank} {dtype} {m}x{k}x{n}")


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


@pytest.mark.gpu
@pytest.mark.parametrize("factors", ["bf16", "int8"])
@pytest.mark.parametrize("tokens", [1, 16, 40])
def test_a_corrected_projection_on_the_gpu_matches_float64(kh, cuda_only, factors, tokens):
    """M <= 16: the weight and its correction in one Triton pass; M = 40: cuBLAS and two products."""
    from torch import nn

    from svdmlp.decompose import Factors
    from svdmlp.quantized_linear import QuantizedLinear

    generator = torch.Generator().manual_seed(tokens)
    linear = nn.Linear(576, 200, bias=False)
    correction = Factors(
        u=torch.randn(16, 576, generator=generator) / 24, v=torch.randn(200, 16, generator=generator) / 4
    )
    factors_how = STORED["int8"] if factors == "int8" else None
    module = QuantizedLinear.of(
        linear, STORED["int4-asym"], correction=correction, dtype=torch.bfloat16, factors_how=factors_how
    ).to(kh.device)
    x = torch.randn(tokens, 576, generator=generator).to(kh.device, torch.bfloat16)
    with torch.no_grad():
        out = module(x)
    reference = x.double() @ module.quantized.dequantized(torch.float64).T
    reference += (x.double() @ _values(module.u_t)) @ _values(module.v_t)
    kh.assert_close_to_reference(out, reference, f"int4-asym + {factors} M={tokens}")
