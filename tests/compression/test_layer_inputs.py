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


def _whole_head_gradient(model, spec, ids, hidden, loss):
    """The head's loss and gradient with all the logits at once (the model's own forward)."""
    given = hidden.detach().requires_grad_(True)
    with layer_inputs.head_only(model, spec, given), torch.enable_grad():
        value = loss(model(input_ids=ids, use_cache=False).logits)
        value.backward()
    return float(value.detach()), given.grad


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_the_head_gradient_by_rows_is_the_whole_head_gradient(model_type, tokenizer, monkeypatch):
    # The head's gradient is taken a block of rows at a time (its logits never whole in memory); 37
    # positions of 2 windows: blocks of 16 rows, the last one short. Softcapping (Gemma) included.
    torch.manual_seed(0)
    model = tiny_model(model_type, num_hidden_layers=2)
    monkeypatch.setattr(layer_inputs, "LOGIT_BLOCK_BYTES", 16 * model.config.vocab_size * 4 * 2)
    spec = arch.resolve(model.config.model_type)
    hidden = torch.randn(2, 37, model.config.hidden_size)
    ids = torch.randint(0, model.config.vocab_size, (2, 37))
    target = torch.randn(2, 37, model.config.vocab_size)
    whole, expected = _whole_head_gradient(model, spec, ids, hidden, lambda logits: token_kl(logits, target))
    by_rows, gradient = layer_inputs.head_gradient(
        model, spec, hidden, lambda logits, rows: token_kl(logits, target[:, rows]) * (len(rows) / 37)
    )
    assert by_rows == pytest.approx(whole, rel=1e-5)
    torch.testing.assert_close(gradient, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("loss", ["sampled", "labels"])
def test_the_fisher_loss_by_rows_is_the_whole_windows_loss(loss, monkeypatch):
    """The calibration's cross-entropy, block by block, draws and sums what one pass over the whole
    logits would (the draws made for the whole batch first)."""
    from svdmlp.compression import output_grams

    torch.manual_seed(0)
    model = tiny_model("qwen2", num_hidden_layers=2)
    monkeypatch.setattr(layer_inputs, "LOGIT_BLOCK_BYTES", 16 * model.config.vocab_size * 4 * 2)
    spec = arch.resolve("qwen2")
    hidden = torch.randn(2, 37, model.config.hidden_size)
    ids = torch.randint(0, model.config.vocab_size, (2, 37))

    def whole_loss(logits):
        generator = torch.Generator().manual_seed(5)
        uniform = torch.rand(ids.numel(), 1, generator=generator)
        flat = logits.float().reshape(-1, logits.shape[-1])
        if loss == "labels":
            flat = logits[:, :-1].float().reshape(-1, logits.shape[-1])
            return torch.nn.functional.cross_entropy(flat, ids[:, 1:].reshape(-1), reduction="sum")
        targets = output_grams.sample(flat.softmax(-1).detach(), uniform)
        return torch.nn.functional.cross_entropy(flat, targets, reduction="sum")

    whole, expected = _whole_head_gradient(model, spec, ids, hidden, whole_loss)
    by_rows, gradient = layer_inputs.head_gradient(
        model, spec, hidden, output_grams._loss(ids, loss, torch.Generator().manual_seed(5))
    )
    assert by_rows == pytest.approx(whole, rel=1e-5)
    torch.testing.assert_close(gradient, expected, rtol=1e-4, atol=1e-6)


def test_a_block_of_logits_is_a_few_rows_of_a_large_vocabulary():
    assert layer_inputs.block_rows(151936) == 131
    assert layer_inputs.block_rows(151936, batch=4) == 32
    assert layer_inputs.block_rows(10**9) == 1
