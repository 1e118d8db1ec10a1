"""Capturing what a model feeds its decoder layers."""

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp import arch
from svdmlp.compression import calibration, layer_inputs


def test_capture_restores_the_layers_and_stops_after_the_last_one(tokenizer):
    model = tiny_model("gemma3_text", num_hidden_layers=3)
    spec = arch.resolve("gemma3_text")
    layers = list(arch.decoder_layers(model, spec))
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 3, 16, seed=0)
    batches = layer_inputs.capture(model, spec, windows, last=1, batch_size=2)
    assert list(arch.decoder_layers(model, spec)) == layers
    assert [tuple(b.hidden.shape) for b in batches] == [(2, 16, 64), (1, 16, 64)]
    assert all(len(b.kwargs) == 2 and "position_embeddings" in b.kwargs[1] for b in batches)
