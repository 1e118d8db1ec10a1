"""A projection stored quantized with a low-rank correction: its product against float64, its bytes, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from svdmlp.decompose import Factors
from svdmlp.int_weights import STORED, QuantizedMatrix, dequantize, quantize, scheme
from svdmlp.quantized_linear import QuantizedLinear


def _stored(factor) -> torch.Tensor:
    """A correction factor ``(in, out)`` as the float64 values it stands for, stored quantized or not."""
    if isinstance(factor, QuantizedMatrix):
        return factor.dequantized(torch.float64).T
    return factor.double()


def _reference(module: QuantizedLinear, x: torch.Tensor) -> torch.Tensor:
    """``x·Q(W)ᵀ + (x·U)·V`` in float64, from the stored integers, scales and factors."""
    y = x.double() @ module.quantized.dequantized(torch.float64).T
    if module.rank:
        y += (x.double() @ _stored(module.u_t)) @ _stored(module.v_t)
    return y


@pytest.mark.parametrize("name", ["int8", "int4", "int4-asym"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank", [0, 5])
def test_the_product_is_the_stored_weight_plus_the_correction(name, dtype, rank):
    torch.manual_seed(0)
    linear = nn.Linear(144, 40, bias=False)  # 144 inputs: a whole group of 128 and a padded one
    correction = Factors(u=torch.randn(rank, 144), v=torch.randn(40, rank) * 0.01) if rank else None
    module = QuantizedLinear.of(linear, scheme(name), correction=correction, dtype=dtype)
    x = torch.randn(3, 7, 144).to(dtype)
    with torch.no_grad():  # the CPU weight-only kernels run only without autograd
        y = module(x)
    assert y.shape == (3, 7, 40) and y.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.double(), _reference(module, x), rtol=tolerance, atol=tolerance)
    relative = (module.quantized.dequantized() - linear.weight).norm() / linear.weight.norm()
    assert relative < (0.01 if name == "int8" else 0.15)
    if name == "int4-asym":  # the same integers and zero points as fake quantization
        restored = dequantize(*quantize(linear.weight.detach(), scheme(name)), (40, 144))
        torch.testing.assert_close(module.quantized.dequantized(), restored, rtol=0, atol=0)


@pytest.mark.parametrize("bits", ["int8", "int4"])
def test_a_correction_stored_quantized_multiplies_as_its_values(bits):
    torch.manual_seed(1)
    linear = nn.Linear(144, 40, bias=False)
    correction = Factors(u=torch.randn(6, 144), v=torch.randn(40, 6) * 0.01)
    module = QuantizedLinear.of(linear, scheme("int4-asym"), correction=correction, factors_how=scheme(bits))
    assert isinstance(module.u_t, QuantizedMatrix) and module.u_t.scheme.name == bits
    x = torch.randn(5, 144).to(torch.bfloat16)
    x[0] = float("nan")  # a poisoned row stays its own
    with torch.no_grad():
        y = module(x)
    assert y[0].isnan().all() and not y[1:].isnan().any()
    torch.testing.assert_close(y[1:].double(), _reference(module, x[1:]), rtol=3e-2, atol=3e-2)
    # each factor rounded along the dimension it sums over, as fake quantization rounds it
    u = dequantize(*quantize(correction.u, scheme(bits)), (6, 144))
    torch.testing.assert_close(_stored(module.u_t).T.float(), u, rtol=0, atol=0)
    expected = scheme("int4-asym").nbytes(40, 144) + scheme(bits).nbytes(6, 144) + scheme(bits).nbytes(40, 6)
    assert module.nbytes() == expected


def test_the_stored_schemes_are_named_alike_everywhere():
    from svdmlp.config import STORED_SCHEMES
    from svdmlp.serving import quant_config

    assert set(STORED_SCHEMES) == set(STORED) == set(quant_config._WEIGHTS)


def test_its_bytes_are_the_packed_weight_and_the_correction():
    linear = nn.Linear(144, 40, bias=False)
    correction = Factors(u=torch.randn(8, 144), v=torch.randn(40, 8))
    module = QuantizedLinear.of(linear, scheme("int4"), correction=correction, dtype=torch.bfloat16)
    assert module.nbytes() == scheme("int4").nbytes(40, 144) + 2 * 8 * (144 + 40)
    assert QuantizedLinear.of(linear, scheme("int8")).nbytes() == scheme("int8").nbytes(40, 144)
    assert QuantizedLinear.of(linear, scheme("int4-asym")).nbytes() == scheme("int4-asym").nbytes(40, 144)


def test_a_biased_layer_and_an_unstored_scheme_are_refused():
    with pytest.raises(ValueError, match="bias-free linear layer only"):
        QuantizedLinear.of(nn.Linear(16, 8), scheme("int4"))
    with pytest.raises(ValueError, match="int3-asym is evaluated by fake quantization only"):
        QuantizedMatrix(16, 8, scheme("int3-asym"))
