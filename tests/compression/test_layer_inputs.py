"""Capturing what a model feeds its decoder layers."""

import pytest
import torch

from conftest import ARCH_CONFIGS, SAMPLE_TEXT, tiny_model
from svdmlp import arch
from svdmlp.compression import calibration, layer_inputs
from svdmlp.compression.heal.distill import token_kl


def test_capture_restores_the_layers_and_stops_after_the_last_one(tokenizer):
    model = tiny_model("gemma3_text", num_hidden_layers=3)
    spec = arch.resolve("gemma3_text")
    layers = list(arch.decoder_layers(model, spec))
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 3, 16, seed=0)
    batches = layer_inputs.capture(model, spec, windows, last=1, batch_size=2)
    assert list(arch.decoder_layers(model, spec)) == layers
    assert [tuple(b.hidden.shape) for b in batches] == [(2, 16, 64), (1, 16, 64)]
    assert all(len(b.kwargs) == 2 and "position_embeddings" in b.kwargs[1] for b in batches)


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_the_head_gradient_by_rows_is_the_whole_head_gradient(model_type, tokenizer):
    # Distillation takes the head's KL gradient a few rows at a time (its logits never whole in memory);
    # 37 positions of 2 windows: blocks of 16 rows, the last one short. Softcapping (Gemma) included.
    torch.manual_seed(0)
    model = tiny_model(model_type, num_hidden_layers=2)
    spec = arch.resolve(model.config.model_type)
    hidden = torch.randn(2, 37, model.config.hidden_size)
    ids = torch.randint(0, model.config.vocab_size, (2, 37))
    target = torch.randn(2, 37, model.config.vocab_size)
    whole, expected = layer_inputs.head_gradient(
        model, spec, ids, hidden, lambda logits: token_kl(logits, target)
    )
    by_rows, gradient = layer_inputs.head_gradient_by_rows(
        model, spec, hidden, lambda logits, rows: token_kl(logits, target[:, rows])
    )
    assert by_rows == pytest.approx(whole, rel=1e-5)
    torch.testing.assert_close(gradient, expected, rtol=1e-4, atol=1e-6)
