import pytest

from conftest import ARCH_CONFIGS, tiny_config, tiny_model
from svdmlp import arch
from svdmlp.arch import of_model as arch_of


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_every_supported_architecture_resolves_to_its_mlps(model_type):
    model = tiny_model(model_type)
    spec = arch_of(model)
    layers = arch.decoder_layers(model, spec)
    mlp = getattr(layers[0], spec.mlp)
    for name in ("gate", "up", "down"):
        assert hasattr(mlp, spec.projection(name))
    expected = "gelu_tanh" if model_type.startswith("gemma") else "silu"
    assert spec.activation == expected


def test_unsupported_type_names_it_and_lists_the_supported():
    with pytest.raises(ValueError, match="unsupported model type 'gpt2'; svdmlp supports: gemma, .*llama"):
        arch.resolve("gpt2")


def test_mismatched_activation_is_refused():
    config = tiny_config("llama", hidden_act="gelu")
    with pytest.raises(ValueError, match="activation 'gelu' is not supported"):
        arch.for_config(config)


def test_bos_follows_the_family_then_the_tokenizer(tokenizer):
    bos = tokenizer.bos_token_id
    assert [
        arch.bos_token_id(arch.resolve(t), tokenizer) for t in ("gemma", "gemma2", "gemma3", "gemma3_text")
    ] == [bos] * 4
    assert arch.bos_token_id(arch.resolve("llama"), tokenizer) is None  # its tokenizer adds none

    class Llama3Tokenizer:
        add_bos_token, bos_token_id = True, 128000

    assert arch.bos_token_id(arch.resolve("llama"), Llama3Tokenizer()) == 128000

    class NoBos:
        bos_token_id = None

    with pytest.raises(ValueError, match="expects a BOS token first, but its tokenizer defines none"):
        arch.bos_token_id(arch.resolve("gemma2"), NoBos())
