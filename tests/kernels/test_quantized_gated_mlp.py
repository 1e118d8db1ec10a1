"""The gated MLP on quantized factors against float64 of the dequantized factors, on awkward shapes, every
buffer poisoned first (in the interpreter on CPU, natively on a GPU); and the backend's wiring to it."""

from __future__ import annotations

import pytest
import torch

from svdmlp.backends import torch_ref
from svdmlp.int_weights import SCHEMES, QuantizedMatrix
from svdmlp.kernels import configs, quantized_gated_mlp
from svdmlp.kernels.quantized_gated_expand import _quantized_gated_expand_kernel
from svdmlp.kernels.quantized_matmul import _quantized_matmul_kernel

ACTIVATIONS = ("silu", "gelu_tanh")


def quantized_mlp(kh, generator, hidden, inter, ranks, name):
    """The factors of a random low-rank gated MLP, each quantized by the scheme ``name``."""
    r_gate, r_up, r_down = ranks
    shapes = ((hidden, r_gate + r_up), (r_gate, inter), (r_up, inter), (inter, r_down), (r_down, hidden))
    return [
        QuantizedMatrix.of(kh.random_factor(generator, *shape, torch.float32), SCHEMES[name]).to(kh.device)
        for shape in shapes
    ]


def reference(x, factors, activation):
    """float64 of torch_ref on the factors the quantized ones stand for."""
    dequantized = [factor.dequantized(torch.float64).T for factor in factors]
    return torch_ref.lowrank_gated_mlp(x.double(), *dequantized, activation)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("ranks", [(137, 137, 41), (24, 41, 72)], ids=["equal", "unequal"])
@pytest.mark.parametrize("tokens", [1, 3, 16])
def test_matches_float64_of_the_dequantized_factors(kh, tokens, ranks, activation, dtype, name):
    # hidden 131 and inter 150: odd (a half-filled last int4 byte) and past one group of 128; rank 137
    # spans two groups; unequal ranks make the shorter factor's steps run past its end.
    generator = torch.Generator().manual_seed(tokens + ranks[0])
    factors = quantized_mlp(kh, generator, 131, 150, ranks, name)
    x = kh.random_input(generator, (tokens, 131), dtype)
    y = quantized_gated_mlp(x, *factors, activation)
    assert y.dtype == dtype
    kh.assert_close_to_reference(y, reference(x, factors, activation), f"{name} M={tokens} {ranks}")


def test_batch_dims_and_a_strided_x(kh):
    generator = torch.Generator().manual_seed(5)
    factors = quantized_mlp(kh, generator, 96, 70, (40, 40, 24), "int4")
    batch = kh.random_input(generator, (2, 4, 96), torch.bfloat16)
    for what, x in (("(B, T, in)", batch), ("(T, B, in) view", batch.transpose(0, 1))):
        y = quantized_gated_mlp(x, *factors, "silu")
        assert y.shape == x.shape
        kh.assert_close_to_reference(y, reference(x, factors, "silu"), what)


def test_tolerance_is_tight_enough_to_catch_a_swapped_activation(kh):
    generator = torch.Generator().manual_seed(6)
    factors = quantized_mlp(kh, generator, 131, 150, (24, 41, 72), "int8")
    x = kh.random_input(generator, (3, 131), torch.float32)
    y = quantized_gated_mlp(x, *factors, "silu")
    assert kh.tolerance_ratio(y, reference(x, factors, "silu")) <= 1.0
    assert kh.tolerance_ratio(y, reference(x, factors, "gelu_tanh")) > 1.0


def test_rejects_what_it_cannot_run(kh):
    generator = torch.Generator().manual_seed(7)
    factors = quantized_mlp(kh, generator, 32, 40, (8, 8, 8), "int8")
    int4 = quantized_mlp(kh, generator, 32, 40, (8, 8, 8), "int4")
    wide = quantized_mlp(kh, generator, 33, 40, (8, 8, 8), "int8")
    x = kh.random_input(generator, (2, 32), torch.float32)
    with pytest.raises(ValueError, match="one scheme"):
        quantized_gated_mlp(x, *factors[:4], int4[4], "silu")
    with pytest.raises(ValueError, match=r"down_v_t.shape\[1\] \(33\) must equal hidden"):
        quantized_gated_mlp(x, *factors[:4], wide[4], "silu")
    with pytest.raises(ValueError, match="decode sizes"):
        quantized_gated_mlp(kh.random_input(generator, (17, 32), torch.float32), *factors, "silu")


def count_launches(monkeypatch) -> list[str]:
    launches = []
    for kernel in (_quantized_matmul_kernel, _quantized_gated_expand_kernel):

        def counted_run(*args, _run=kernel.run, _name=kernel.fn.__name__, **kwargs):
            launches.append(_name)
            return _run(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted_run)
    return launches


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("tokens", [2, configs.DECODE_MAX_TOKENS + 1])
def test_a_quantized_module_on_the_triton_backend_runs_the_fused_kernels_at_decode(
    kh, monkeypatch, name, tokens
):
    """Decode: the three launches of the quantized schedule; above: each factor by itself (torch_ref)."""
    from svdmlp.lowrank import LowRankGatedMLP, set_backend

    generator = torch.Generator().manual_seed(tokens)
    ranks = {"gate": 24, "up": 24, "down": 40}
    module = LowRankGatedMLP(64, 96, ranks, "gelu_tanh").to(kh.device)
    for parameter in module.parameters():
        parameter.data = kh.random_factor(generator, *parameter.shape, torch.float32)
    module.quantize_factors(SCHEMES[name])
    assert set_backend(torch.nn.Sequential(torch.nn.Linear(1, 1).to(kh.device), module), "triton") == "triton"
    assert module.backend == "triton"
    launches = count_launches(monkeypatch)
    x = kh.random_input(generator, (tokens, 64), torch.bfloat16)
    with torch.no_grad():
        y = module(x)
    if tokens <= configs.DECODE_MAX_TOKENS:
        assert launches == [
            "_quantized_matmul_kernel",
            "_quantized_gated_expand_kernel",
            "_quantized_matmul_kernel",
        ]
    elif kh.device.type == "cpu":
        assert launches == []  # on a GPU, above decode: the dequantized factors through cuBLAS
    factors = [getattr(module, factor) for factor in module.FACTORS]
    kh.assert_close_to_reference(y, reference(x, factors, "gelu_tanh"), f"{name} M={tokens}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_gpu_realistic_shapes(kh, cuda_only, name):
    """Native dots and atomics, the H200 tiles, Llama-3.2-1B's MLP at keep ≈ 0.6 (ranks of 984: rows of
    the quantized values not a multiple of 16 bytes)."""
    generator = torch.Generator().manual_seed(1)
    factors = quantized_mlp(kh, generator, 2048, 8192, (984, 984, 984), name)
    for tokens in (1, 16):
        x = kh.random_input(generator, (tokens, 2048), torch.bfloat16)
        y = quantized_gated_mlp(x, *factors, "silu")
        kh.assert_close_to_reference(y, reference(x, factors, "silu"), f"{name} M={tokens}")
