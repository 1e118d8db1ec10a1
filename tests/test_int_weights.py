"""Integer weights: the error bound of the schemes, packing, the stored matrix and its kernels against a
float64 reference of the dequantized values, on awkward shapes."""

from __future__ import annotations

import pytest
import torch

from svdmlp.int_weights import (
    SCHEMES,
    QuantizedMatrix,
    dequantize,
    factor_scheme,
    gptq,
    pack_int4,
    quantize,
    scheme,
    unpack_int4,
)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("shape", [(7, 300), (33, 128), (1, 5)])
def test_every_weight_is_within_half_a_scale(name, shape):
    how = SCHEMES[name]
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(shape[1])) * 0.02
    q, scales = quantize(weight, how)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= how.qmax
    restored = dequantize(q, scales, shape)
    group = shape[1] if how.group is None else how.group
    per_weight = scales.float().expand(-1, -1, group).reshape(shape[0], -1)[:, : shape[1]]
    assert ((restored - weight).abs() <= per_weight / 2 * (1 + 1e-3)).all()


def test_values_on_the_grid_round_trip_exactly():
    how = SCHEMES["int4"]
    q = torch.randint(-7, 8, (3, 256), generator=torch.Generator().manual_seed(0)).float()
    q[:, 0], q[:, 128] = 7, 7  # each group's largest magnitude sets its scale to 1/8 exactly
    weight = q / 8
    restored = dequantize(*quantize(weight, how), tuple(weight.shape))
    assert torch.equal(restored, weight)


def test_packed_bytes_count_values_and_scales():
    assert SCHEMES["int8"].nbytes(4096, 14336) == 4096 * 14336 + 4096 * 2
    assert SCHEMES["int4"].nbytes(4096, 14336) == 4096 * 14336 // 2 + 4096 * 112 * 2
    assert SCHEMES["int4"].nbytes(3, 130) == -(-3 * 130 // 2) + 3 * 2 * 2


def test_int4_packing_round_trips_every_value():
    q = torch.arange(-7, 8, dtype=torch.int8).repeat(4, 2)[:, :30]
    packed = pack_int4(q)
    assert packed.dtype == torch.uint8 and packed.shape == (4, 15)
    assert torch.equal(unpack_int4(packed), q)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unknown quantization 'int1'"):
        scheme("int1")
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantize(torch.tensor([[1.0, float("nan")]]), SCHEMES["int8"])
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.ones(3), SCHEMES["int8"])
    with pytest.raises(ValueError, match=r"factor bits must be one of \[4, 8, 16\], got 3"):
        factor_scheme(3)
    assert factor_scheme(16) is None and factor_scheme(8) is SCHEMES["int8"]


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("k", "n", "m"), [(96, 33, 1), (100, 7, 5), (17, 40, 3), (320, 64, 130)])
def test_products_match_float64_of_the_dequantized_matrix(name, dtype, k, n, m):
    """In 16 bits, int8 with K = 96 and 320 takes torch's int8 kernel, K = 100 and 17 (not multiples of
    16) the dequantized fallback; int4 always takes torch's int4 kernel (inputs padded to whole groups,
    outputs to 16)."""
    generator = torch.Generator().manual_seed(k * n + m)
    matrix = torch.randn(k, n, generator=generator) * 0.05
    quantized = QuantizedMatrix.of(matrix, SCHEMES[name])
    assert (
        quantized.values.shape == (n, k if name == "int8" else -(-k // 2))
        and quantized.scales.dtype == torch.int16
    )
    assert quantized.nbytes() == SCHEMES[name].nbytes(n, k + k % 2 if name == "int4" else k)
    x = torch.randn(m, k + 3, generator=generator).to(dtype)[:, 3:]  # rows not contiguous
    out = torch.full((m, n), float("nan"), dtype=dtype)  # poisoned: every element must be written
    out.copy_(quantized.matmul(x))
    reference = x.double() @ quantized.dequantized(torch.float64).T
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    assert torch.isfinite(out).all()
    assert (out.double() - reference).abs().max() <= tolerance * reference.abs().max()


def test_a_cast_of_the_model_never_rounds_the_scales():
    quantized = QuantizedMatrix.of(torch.randn(64, 8) * 0.01, SCHEMES["int8"])
    before = quantized.dequantized()
    quantized.to(torch.bfloat16)
    assert quantized.scales.dtype == torch.int16 and quantized.values.dtype == torch.int8
    assert torch.equal(quantized.dequantized(), before)


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_gptq_with_uncorrelated_inputs_is_round_to_nearest(name):
    weight = torch.randn(24, 300, generator=torch.Generator().manual_seed(1))
    q, scales = gptq(weight, torch.eye(300, dtype=torch.float64), SCHEMES[name])
    expected_q, expected_scales = quantize(weight, SCHEMES[name])
    assert torch.equal(q, expected_q) and torch.equal(scales, expected_scales)


@pytest.mark.parametrize("name", ["int8", "int4", "int3g64-asym", "int2g32-asym"])
def test_gptq_lowers_the_error_the_inputs_see(name):
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(40, 260, generator=generator)
    inputs = torch.randn(2000, 260, generator=generator) @ torch.randn(260, 260, generator=generator) / 16
    hessian = (inputs.T @ inputs).double()
    how = scheme(name)

    def seen_error(q, scales):
        error = (dequantize(q, scales, (40, 260)) - weight).double()
        return float(torch.trace(error @ hessian @ error.T))

    q, scales = gptq(weight, hessian, how)
    assert int(q.abs().max()) <= how.qmax
    assert seen_error(q, scales) < 0.8 * seen_error(*quantize(weight, how))
    if how.zero_point:  # GPTQ's levels are those of the grid round to nearest would use
        assert all(len(row.unique()) <= 2**how.bits for row in q.reshape(-1, how.group))


def test_gptq_refuses_bad_input():
    with pytest.raises(ValueError, match=r"\(K, K\) Hessian"):
        gptq(torch.zeros(4, 8), torch.eye(7), SCHEMES["int8"])
    with pytest.raises(ValueError, match="NaN or infinite"):
        gptq(torch.full((4, 8), float("nan")), torch.eye(8), SCHEMES["int8"])


def test_schemes_by_name_any_width_from_2_to_8_bits_and_any_group():
    assert scheme("int8") is SCHEMES["int8"]
    assert scheme("int4") is SCHEMES["int4"]
    three = scheme("int3")
    assert (three.bits, three.group, three.qmax) == (3, 128, 3)
    assert scheme("int8g64").group == 64 and scheme("int6").group == 128
    assert scheme("int2g32").qmax == 1  # symmetric: -1, 0, 1
    # packed bytes: 3 bits a weight, one fp16 scale per 128 inputs of each row
    assert three.nbytes(4, 256) == 4 * 256 * 3 // 8 + 4 * 2 * 2
    for bad in ("int1", "int9", "int4g0", "int4g12", "fp8", "int4g", "INT4"):
        with pytest.raises(ValueError, match="quantization"):
            scheme(bad)


@pytest.mark.parametrize("name", ["int2-asym", "int3g32-asym", "int4g64-asym", "int8-asym"])
@pytest.mark.parametrize("shape", [(7, 300), (5, 64), (1, 5)])
def test_an_asymmetric_grid_spans_each_group_within_a_scale(name, shape):
    how = scheme(name)
    generator = torch.Generator().manual_seed(shape[1])
    weight = torch.randn(shape, generator=generator) * 0.02 + 0.01  # off-centre, as real rows can be
    weight[0, 0] = 0.0
    q, scales = quantize(weight, how)
    assert q.dtype == torch.int16
    restored = dequantize(q, scales, shape)
    assert restored[0, 0] == 0.0  # zero is a level of every group
    group = shape[1] if how.group is None else how.group
    step = scales.float().repeat_interleave(group, dim=-1).reshape(shape[0], -1)[:, : shape[1]]
    # half a scale inside the range; at its ends up to a whole one (the zero point is rounded, which
    # shifts the grid by up to half a step)
    assert ((restored - weight).abs() <= step + 1e-6).all()
    for row in q.reshape(-1, q.shape[-1]):  # at most 2^bits levels a group, the zero point taken off
        assert int(row.max()) - int(row.min()) <= 2**how.bits - 1
    symmetric = scheme(name.removesuffix("-asym"))
    assert (restored - weight).norm() < (dequantize(*quantize(weight, symmetric), shape) - weight).norm()


def test_an_asymmetric_scheme_counts_its_zero_points():
    how = scheme("int3g64-asym")
    assert how.zero_point and how.qmax == 7
    # 3 bits a weight, per group of 64 an fp16 scale and a 3-bit zero point (packed)
    assert how.nbytes(4, 256) == 4 * 256 * 3 // 8 + 16 * 2 + -(-16 * 3 // 8)
