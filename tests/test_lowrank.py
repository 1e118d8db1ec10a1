import pytest
import torch

from conftest import tiny_model
from svdmlp import arch
from svdmlp.compression import decompose
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
