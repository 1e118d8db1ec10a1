"""Sequential calibration: each layer's Grams come from the already-compressed layers' outputs."""

import gc
import weakref

import pytest
import torch

from conftest import ARCH_CONFIGS, SAMPLE_TEXT, tiny_model
from svdmlp import arch, checkpoint, runtime
from svdmlp.cli import main
from svdmlp.compression import calibration, factorise, pipeline, sequential
from svdmlp.compression import gram as gram_module
from svdmlp.config import CalibrationSpec, CompressConfig

CALIB = CalibrationSpec("unused: text passed directly", num_samples=4, seq_len=32)
IDS = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))


def _config(**kwargs) -> CompressConfig:
    return CompressConfig(**{"keep": 0.5, "align": 8, "calibration": CALIB, **kwargs})


def _compress(model, tokenizer, **kwargs):
    return pipeline.compress(
        model, tokenizer, _config(**kwargs), calibration_text=SAMPLE_TEXT, progress=False
    )


def _assert_grams_close(actual: calibration.LayerGrams, expected: calibration.LayerGrams) -> None:
    for name in ("gate_up", "down"):
        a, e = getattr(actual, name), getattr(expected, name)
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6 * float(e.abs().max()))
    assert actual.tokens == expected.tokens


def _compress_each(model, spec, windows, keep_inputs=False) -> dict:
    """Drive :func:`sequential.calibrated_layers` over layers 0 and 1, compressing each at rank 16 as
    the pipeline does; what each layer was handed, by index."""
    seen = {}
    layers = sequential.calibrated_layers(
        model, spec, windows, [0, 1], keep_inputs=keep_inputs, progress=False
    )
    for index, grams, inputs in layers:
        seen[index] = (grams, inputs)
        factorise.layer(model, spec, index, {"gate": 16, "up": 16, "down": 16}, grams)
    return seen


def test_layer_grams_match_hooks_on_a_manually_compressed_model(tokenizer):
    """Layer 1's Grams are those of the model whose layer 0 alone is compressed (computed by hooks)."""
    spec = arch.resolve("llama")
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 4, 32, seed=0)
    model = tiny_model("llama")
    seen = _compress_each(model, spec, windows)

    reference = tiny_model("llama")
    _assert_grams_close(
        seen[0][0], calibration.collect_grams(reference, spec, windows, [0], progress=False)[0]
    )
    _compress(reference, tokenizer, layers=(0,))  # one-shot on the dense model: layer 0 only
    _assert_grams_close(
        seen[1][0], calibration.collect_grams(reference, spec, windows, [1], progress=False)[1]
    )


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_sequential_equals_compressing_one_layer_at_a_time(model_type, tokenizer):
    """Per-layer kwargs (local/global attention masks and rotary tables) reach the right layers."""
    model = tiny_model(model_type)
    report = _compress(model, tokenizer, sequential=True)
    reference = tiny_model(model_type)
    for index in (0, 1):
        _compress(reference, tokenizer, layers=(index,))
    windows = 4 * (32 + arch.resolve(model_type).bos)  # after the BOS token where the family wants one
    assert report.calibration["sequential"] is True and report.calibration["tokens"] == windows
    assert [layer.status for layer in report.layers] == ["compressed", "compressed"]
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, reference(IDS).logits, rtol=1e-4, atol=1e-4)


def test_dense_walk_gives_the_dense_grams_running_each_layer_once(tokenizer):
    """With ``dense`` every layer gets the dense model's Grams whatever the caller does to the layers
    before it, and each layer runs once per batch (its calibration run carries the hidden states)."""
    spec = arch.resolve("llama")
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 4, 32, seed=0)
    model = tiny_model("llama", num_hidden_layers=3)
    expected = calibration.collect_grams(
        tiny_model("llama", num_hidden_layers=3), spec, windows, [0, 1, 2], progress=False
    )
    runs = [0, 0, 0]
    for index, layer in enumerate(arch.decoder_layers(model, spec)):
        layer.register_forward_pre_hook(
            lambda module, args, index=index: runs.__setitem__(index, runs[index] + 1)
        )
    walk = sequential.calibrated_layers(
        model, spec, windows, [0, 1, 2], progress=False, batch_size=2, dense=True
    )
    for index, grams, _ in walk:
        _assert_grams_close(grams, expected[index])
        factorise.layer(model, spec, index, {"gate": 16, "up": 16, "down": 16}, grams)
    assert runs == [2, 2, 2]  # two batches of two windows, each layer once


def test_the_dense_walk_holds_the_windows_hidden_states_once(tokenizer, monkeypatch):
    """While the caller works on a layer of a dense walk, the hidden states that entered it are gone:
    its outputs replaced them batch by batch (0.7 GB each for the 1.5B model's calibration windows)."""
    spec = arch.resolve("llama")
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 4, 32, seed=0)
    entered = []
    run = sequential.run_layer

    def watched(layer, hidden, kwargs):
        entered.append(weakref.ref(hidden))
        return run(layer, hidden, kwargs)

    monkeypatch.setattr(sequential, "run_layer", watched)
    walk = sequential.calibrated_layers(
        tiny_model("llama", num_hidden_layers=3),
        spec,
        windows,
        [0, 1, 2],
        progress=False,
        batch_size=2,
        dense=True,
    )
    alive = []
    for _index, _grams, _ in walk:
        gc.collect()
        alive.append(sum(ref() is not None for ref in entered))
    assert len(entered) == 6  # each layer ran once per batch
    assert alive == [0, 0, 2]  # the last layer's inputs stay: nothing runs after it


def test_the_heap_is_trimmed_before_each_layer_is_handed_over(tokenizer, monkeypatch):
    """What running the layer freed goes back before the caller's decompositions and probes."""
    trims = []
    monkeypatch.setattr(runtime, "trim_heap", lambda: trims.append(True))
    spec = arch.resolve("llama")
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 4, 32, seed=0)
    walk = sequential.calibrated_layers(
        tiny_model("llama", num_hidden_layers=3), spec, windows, [0, 2], progress=False
    )
    assert [len(trims) for _ in walk] == [1, 2]


def test_inputs_are_handed_over_for_closed_form_healing(tokenizer):
    """With keep_inputs each layer comes with the MLP's input batches; their Gram is the gate/up Gram."""
    spec = arch.resolve("qwen2")
    windows = calibration.token_windows(tokenizer, SAMPLE_TEXT, 4, 32, seed=0)
    seen = _compress_each(tiny_model("qwen2"), spec, windows, keep_inputs=True)
    for grams, inputs in seen.values():
        assert sum(x.numel() // x.shape[-1] for x in inputs) == 4 * 32
        gram = torch.zeros_like(grams.gate_up)
        for x in inputs:
            gram_module.accumulate_gram(gram, x)
        torch.testing.assert_close(gram, grams.gate_up)


def test_skipped_layers_carry_the_hidden_states(tokenizer):
    model = tiny_model("mistral", num_hidden_layers=3)
    report = _compress(model, tokenizer, layers=(0, 2), sequential=True)
    assert [layer.status for layer in report.layers] == ["compressed", "skipped", "compressed"]
    reference = tiny_model("mistral", num_hidden_layers=3)
    for index in (0, 2):
        _compress(reference, tokenizer, layers=(index,))
    with torch.no_grad():
        torch.testing.assert_close(model(IDS).logits, reference(IDS).logits, rtol=1e-4, atol=1e-4)


def test_config_round_trip_and_validation():
    config = CompressConfig(sequential=True, heal="closed-form", allocation="budget")
    assert CompressConfig.from_dict(config.to_dict()) == config
    old = {k: v for k, v in CompressConfig().to_dict().items() if k not in ("sequential", "heal")}
    assert CompressConfig.from_dict(old) == CompressConfig()  # checkpoints from before these fields
    with pytest.raises(ValueError, match="sequential must be true or false, got 'yes'"):
        CompressConfig(sequential="yes")
    with pytest.raises(ValueError, match="unknown heal 'gradient'"):
        CompressConfig(heal="gradient")
    with pytest.raises(ValueError, match="needs method 'whiten' or 'fisher', got method 'svd'"):
        CompressConfig(method="svd", sequential=True)


def test_cli_flags_reach_the_checkpoint(model_dir, text_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["compress", model_dir, "--calib", text_file, "--out", out, "--align", "8", "--effort", "fast"]
    argv += ["--calib-samples", "4", "--calib-seq-len", "32", "--sequential", "--heal", "closed-form"]
    assert main([str(a) for a in argv]) == 0
    printed = capsys.readouterr().out
    assert "healing (closed-form): mean error of down against the dense MLP output" in printed
    metadata = checkpoint.read_metadata(out)
    assert metadata["config"]["sequential"] is True and metadata["config"]["heal"] == "closed-form"
    with pytest.raises(SystemExit):
        main(["compress", "--heal", "gradient", "--out", str(tmp_path / "x")])
    assert "invalid choice: 'gradient'" in capsys.readouterr().err
