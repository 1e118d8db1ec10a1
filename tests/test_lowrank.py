import pytest
import torch

from conftest import tiny_model
from svdmlp import arch, decompose
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear, set_backend


def _factors(weight, rank):
    return decompose.plain_svd(weight, rank)


def test_lowrank_linear_layout_and_forward():
    g = torch.Generator().manual_seed(0)
    factors = decompose.Factors(u=torch.randn(5, 9, generator=g), v=torch.randn(7, 5, generator=g))
    module = LowRankLinear(9, 7, 5)
    module.load_factors(factors)
    assert module.u_t.shape == (9, 5) and module.v_t.shape == (5, 7)
    assert module.u_t.is_contiguous() and module.v_t.is_contiguous()
    x = torch.randn(3, 9, generator=g)
    torch.testing.assert_close(module(x), x @ (factors.v @ factors.u).T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["llama", "gemma2"])
def test_gated_mlp_matches_the_hf_mlp_with_reconstructed_weights(model_type):
    """With weights set to V·U, the HF MLP and our module must compute the same function."""
    model = tiny_model(model_type)
    spec = arch.resolve(model.config.model_type)
    mlp = getattr(arch.decoder_layers(model, spec)[0], spec.mlp)
    ranks = {"gate": 24, "up": 16, "down": 40}
    factors = {}
    for name, rank in ranks.items():
        linear = getattr(mlp, spec.projection(name))
        factors[name] = _factors(linear.weight, rank)
        with torch.no_grad():
            linear.weight.copy_(factors[name].v @ factors[name].u)
    module = LowRankGatedMLP(64, 96, ranks, spec.activation)
    module.load_factors(factors)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(module(x), mlp(x), rtol=1e-4, atol=1e-5)
    assert module.gate_up_u_t.shape == (64, 40)


def test_set_backend_reaches_every_lowrank_module():
    model = torch.nn.Sequential(
        LowRankLinear(4, 4, 2), LowRankGatedMLP(4, 6, {"gate": 2, "up": 2, "down": 2}, "silu")
    )
    assert set_backend(model, "auto") == "torch"
    assert {m.backend for m in model} == {"torch"}


def test_compressed_layers_are_the_decoder_layers_holding_low_rank_modules(tokenizer):
    from conftest import SAMPLE_TEXT
    from svdmlp.compression import pipeline
    from svdmlp.config import CalibrationSpec, CompressConfig
    from svdmlp.lowrank import compressed_layers

    model = tiny_model("llama")
    config = CompressConfig(keep=0.5, align=8, layers=(1,), calibration=CalibrationSpec("text", 2, 16))
    pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    assert compressed_layers(model) == [arch.decoder_layers(model, arch.of_model(model))[1]]


@pytest.mark.parametrize("name", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_gated_mlp_with_quantized_factors_computes_with_its_dequantized_factors(name, dtype):
    from svdmlp.activations import activate
    from svdmlp.int_weights import SCHEMES, QuantizedMatrix

    generator = torch.Generator().manual_seed(5)
    ranks = {"gate": 24, "up": 16, "down": 40}  # gate and up of different ranks: the strip is split
    module = LowRankGatedMLP(64, 112, ranks, "gelu_tanh")
    for factor in module.parameters():
        factor.data = torch.randn(factor.shape, generator=generator) * 0.1
    errors = module.quantize_factors(SCHEMES[name])
    assert set(errors) == set(module.FACTORS) and all(0 < e < 0.2 for e in errors.values())
    assert not list(module.parameters()) and all(
        isinstance(getattr(module, f), QuantizedMatrix) for f in module.FACTORS
    )
    module.to(dtype)
    f = {n: getattr(module, n).dequantized(torch.float64).T for n in module.FACTORS}  # (in, out) each
    x = torch.randn(3, 7, 64, generator=generator).to(dtype)
    strip = x.double() @ f["gate_up_u_t"]
    hidden = activate(strip[..., :24] @ f["gate_v_t"], "gelu_tanh") * (strip[..., 24:] @ f["up_v_t"])
    reference = hidden @ f["down_u_t"] @ f["down_v_t"]
    with torch.no_grad():
        out = module(x)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype
    assert (out.double() - reference).abs().max() <= tolerance * reference.abs().max()
    bytes_expected = sum(getattr(module, n).nbytes() for n in module.FACTORS)
    assert module.factor_bytes() == bytes_expected < sum(64 * r + r * 112 for r in ranks.values()) * 2 / 1.9


def test_quantized_factors_take_the_backend_set_and_are_quantized_once():
    from svdmlp.int_weights import SCHEMES

    module = LowRankLinear(32, 16, 8)
    torch.nn.init.normal_(module.u_t)
    torch.nn.init.normal_(module.v_t)
    module.quantize_factors(SCHEMES["int8"])
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), module)
    set_backend(model, "torch")
    assert module.backend == "torch"
    with pytest.raises(ValueError, match="already quantized"):
        module.quantize_factors(SCHEMES["int4"])
