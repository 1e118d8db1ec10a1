import pytest
import torch

from conftest import ARCH_CONFIGS, SAMPLE_TEXT, count_calls, tiny_model
from svdmlp import arch, decompose, runtime
from svdmlp.compression import pipeline
from svdmlp.compression.calibration import collect_grams, mixture_windows, token_windows, tokens_hash
from svdmlp.compression.sensitivity import probe_shape
from svdmlp.compression.steps.calibration import collect_shared
from svdmlp.compression.steps.context import Run
from svdmlp.config import CalibrationSpec, CompressConfig, LoraSpec
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear

CALIB = CalibrationSpec("unused: text passed directly", num_samples=4, seq_len=32)


def _compress(model, tokenizer, **kwargs):
    config = CompressConfig(**{"keep": 0.5, "align": 8, "calibration": CALIB, **kwargs})
    return pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)


def _mlps(model):
    spec = arch.resolve(model.config.model_type)
    return [getattr(layer, spec.mlp) for layer in arch.decoder_layers(model, spec)]


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_every_architecture_compresses_every_layer(model_type, tokenizer):
    model = tiny_model(model_type)
    ids = torch.randint(0, 300, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense_logits = model(ids).logits
    report = _compress(model, tokenizer)
    assert [layer.status for layer in report.layers] == ["compressed", "compressed"]
    assert all(isinstance(mlp, LowRankGatedMLP) for mlp in _mlps(model))
    for layer in report.layers:
        assert [p.name for p in layer.projections] == ["gate", "up", "down"]
        assert all(p.rank % 8 == 0 and 0 < p.error < 1 for p in layer.projections)
    # keep 0.5 of 64x96: round(0.5·6144/(160·8)) = 2 blocks -> rank 16, achieved keep 16·160/6144
    assert report.achieved_keep == pytest.approx(16 * 160 / 6144)
    assert report.params_after["mlp"] == 2 * 3 * 16 * 160
    assert report.params_before["total"] - report.params_after["total"] == 2 * 3 * (6144 - 16 * 160)
    # Each window of 32 tokens comes after the BOS token where the family expects one (Gemma).
    bos = arch.resolve(model_type).bos
    assert len(report.calibration["sha256"]) == 64 and report.calibration["tokens"] == 4 * (32 + bos)
    with torch.no_grad():
        compressed_logits = model(ids).logits
    assert torch.isfinite(compressed_logits).all()
    assert not torch.allclose(compressed_logits, dense_logits)


def test_whitened_errors_beat_plain_svd_on_the_same_activations(tokenizer):
    dense = tiny_model("llama")
    spec = arch.resolve("llama")
    windows = token_windows(tokenizer, SAMPLE_TEXT, 4, 32, seed=0)
    grams = collect_grams(dense, spec, windows, [0, 1], progress=False)
    whitened = _compress(tiny_model("llama"), tokenizer)
    for layer in whitened.layers:
        for record in layer.projections:
            mlp = _mlps(dense)[layer.index]
            weight = getattr(mlp, spec.projection(record.name)).weight
            gram = grams[layer.index].down if record.name == "down" else grams[layer.index].gate_up
            plain = decompose.weighted_relative_error(weight, decompose.plain_svd(weight, record.rank), gram)
            assert record.error <= plain + 1e-6


def test_plain_svd_needs_no_calibration(tokenizer):
    report = _compress(tiny_model("qwen2"), tokenizer, method="svd")
    assert report.calibration == {} and report.error_metric == "weight-frobenius"


def test_unselected_and_biased_layers_are_reported_as_skipped(tokenizer):
    model = tiny_model("llama", mlp_bias=True)
    report = _compress(model, tokenizer, layers=(1,))
    assert report.layers[0].status == "skipped" and "not selected" in report.layers[0].reason
    assert report.layers[1].status == "skipped" and "has a bias" in report.layers[1].reason
    assert not any(isinstance(m, LowRankGatedMLP) for m in _mlps(model))


def test_partial_targets_swap_single_projections(tokenizer):
    model = tiny_model("mistral")
    report = _compress(model, tokenizer, targets=("down",))
    mlp = _mlps(model)[0]
    assert isinstance(mlp.down_proj, LowRankLinear) and isinstance(mlp.gate_proj, torch.nn.Linear)
    assert report.layers[0].ranks == {"down": 16}


def _untouched(model) -> bool:
    return all(
        isinstance(m.gate_proj, torch.nn.Linear) and isinstance(m.down_proj, torch.nn.Linear)
        for m in _mlps(model)
    )


def test_nan_weights_are_an_error_and_leave_the_model_untouched(tokenizer):
    model = tiny_model("llama")
    with torch.no_grad():
        _mlps(model)[1].up_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj has NaN or inf weights"):
        _compress(model, tokenizer)
    assert _untouched(model)


def test_impossible_rank_fails_before_any_work(tokenizer):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="no room for a rank"):
        _compress(model, tokenizer, align=64)
    assert _untouched(model)


def test_layers_out_of_range(tokenizer):
    with pytest.raises(ValueError, match=r"layers \[5\] do not exist: the model has 2 decoder layers"):
        _compress(tiny_model("llama"), tokenizer, layers=(0, 5))


def test_empty_calibration_text_is_an_error(tokenizer):
    config = CompressConfig(keep=0.5, align=8, calibration=CALIB)
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="calibration text is empty"):
        pipeline.compress(model, tokenizer, config, calibration_text="", progress=False)
    assert _untouched(model)


@pytest.mark.parametrize("method", ["whiten", "svd"])
def test_budget_allocation_meets_the_budget_from_measured_divergences(tokenizer, method, monkeypatch):
    uniform = _compress(tiny_model("qwen3"), tokenizer, method=method, keep=0.5)
    params = uniform.params_after["mlp"]
    keep = params / uniform.params_before["mlp"]  # the same parameter count as the uniform ranks
    factorisations = count_calls(monkeypatch, decompose.Whitening, "from_gram")
    allocated = _compress(tiny_model("qwen3"), tokenizer, method=method, keep=keep, allocation="budget")
    # Each Gram is factorised once, for the probe, and its whitening reused by the compression.
    assert len(factorisations) == (2 * 2 if method == "whiten" else 0)
    assert allocated.params_after["mlp"] <= params
    assert params - allocated.params_after["mlp"] < 3 * 8 * 160  # within one layer block of align 8
    info = allocated.allocation
    assert info["method"] == "measured-sensitivity" and info["tokens"] == 2 * 32  # windows of calib seq_len
    assert allocated.timings["allocation"] >= info["seconds"] > 0  # the step: measuring, then choosing
    for layer, chosen in zip(allocated.layers, info["layers"], strict=True):
        assert set(layer.ranks.values()) == {chosen["rank"]} and chosen["rank"] % 8 == 0  # one rank per layer
        assert chosen["kl"] > 0 and chosen["reference_rank"] == uniform.layers[layer.index].ranks["gate"]
    # The uniform ranks are one feasible choice, so the allocation is never predicted worse.
    assert sum(c["predicted_kl"] for c in info["layers"]) <= sum(c["kl"] for c in info["layers"]) + 1e-12
    assert uniform.allocation == {} and "allocation" not in uniform.timings


def test_the_allocation_leaves_a_layer_dense_rather_than_factorise_it_past_break_even(tokenizer, tmp_path):
    """hidden 64, inter 96: factors stop saving parameters above rank 38 (32 at align 8). At keep 0.95
    both layers reach 32 and the budget then buys one of them its dense matrices back."""
    from svdmlp import checkpoint, lowrank

    model = tiny_model("llama")
    config = CompressConfig(keep=0.95, align=8, calibration=CALIB, allocation="budget")
    report = pipeline.compress(model, tokenizer, config, calibration_text=SAMPLE_TEXT, progress=False)
    dense = [layer for layer in report.layers if layer.status != "compressed"]
    assert len(dense) == 1 and dense[0].reason.startswith("left dense by the allocation")
    compressed = next(layer for layer in report.layers if layer.status == "compressed")
    assert set(compressed.ranks.values()) == {32}
    assert {c["index"]: c["rank"] for c in report.allocation["layers"]}[dense[0].index] is None
    assert isinstance(_mlps(model)[dense[0].index].gate_proj, torch.nn.Linear)
    assert report.params_after["mlp"] <= 0.95 * report.params_before["mlp"]
    checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    loaded, _ = checkpoint.load(tmp_path / "ckpt")
    assert len(lowrank.lowrank_modules(loaded)) == len(lowrank.lowrank_modules(model)) > 0


def test_calibration_mixture_draws_each_text_by_weight(tokenizer, tmp_path):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(SAMPLE_TEXT, encoding="utf-8")
    second.write_text(" ".join(["numbers one two three four five six seven"] * 60), encoding="utf-8")
    calibration = CalibrationSpec(f"{first}:3,{second}:1", num_samples=8, seq_len=16)
    config = CompressConfig(keep=0.5, align=8, calibration=calibration)
    report = pipeline.compress(tiny_model("llama"), tokenizer, config, progress=False)
    expected = mixture_windows(
        tokenizer, [(first.read_text(), 0.75), (second.read_text(), 0.25)], 8, 16, seed=0
    )
    assert report.calibration == {
        "tokens": 8 * 16,
        "sha256": tokens_hash(expected),
        "sources": [[str(first), 0.75], [str(second), 0.25]],
    }


def test_allocation_and_healing_work_with_any_mixture(tokenizer, tmp_path):
    """A three-text mixture used to be refused after calibration ("2 windows cannot cover 3 texts")."""
    sources = []
    for i in range(3):
        sources.append(tmp_path / f"{i}.txt")
        sources[-1].write_text(
            " ".join(f"text {i} line {j * 7919 % 10007}" for j in range(400)), encoding="utf-8"
        )
    calibration = CalibrationSpec(",".join(str(p) for p in sources), num_samples=6, seq_len=32)
    config = CompressConfig(
        keep=0.5,
        align=8,
        calibration=calibration,
        allocation="budget",
        heal="lora",
        lora=LoraSpec(3, 1e-3, 16),
    )
    report = pipeline.compress(tiny_model("llama"), tokenizer, config, progress=False)
    assert sorted(report.healing["kl_by_source"]) == sorted(str(p) for p in sources)
    assert report.allocation
    assert probe_shape(3, 512) == (3, 170) and probe_shape(1, 512) == (2, 256)
    assert probe_shape(12, 512) == (12, 64) and probe_shape(2, 32) == (2, 32)


@pytest.mark.parametrize(
    "options",
    [{}, {"sequential": True, "heal": "closed-form"}, {"allocation": "budget", "sequential": True}],
)
def test_fisher_weights_every_factorisation_by_the_dense_output_gradients(tokenizer, options, monkeypatch):
    from svdmlp.compression import calibration

    collected = count_calls(monkeypatch, calibration, "collect_output_grams")
    whitened = tiny_model("llama")
    _compress(whitened, tokenizer, method="whiten", **options)
    assert collected == []
    fisher = tiny_model("llama")
    report = _compress(fisher, tokenizer, method="fisher", **options)
    assert len(collected) == 1  # the dense model's, once, whatever the recipe
    assert report.error_metric == "activation-weighted" and all(
        layer.status == "compressed" for layer in report.layers
    )
    for a, b in zip(_mlps(whitened), _mlps(fisher), strict=True):
        assert not torch.allclose(a.gate_v_t, b.gate_v_t)  # other factors: the loss weighs the outputs


def test_a_shared_calibration_without_output_grams_is_refused_for_fisher(tokenizer):
    config = CompressConfig(align=8, calibration=CALIB)
    calibration = collect_shared(Run(tiny_model("llama"), tokenizer, config, SAMPLE_TEXT, progress=False))
    assert calibration.outputs == {}
    config = CompressConfig(keep=0.5, align=8, method="fisher", calibration=CALIB)
    with pytest.raises(ValueError, match="no output-gradient Grams, which method 'fisher' needs"):
        pipeline.compress(tiny_model("llama"), tokenizer, config, progress=False, calibration=calibration)


@pytest.mark.parametrize(
    "recipe, steps",
    [
        ({"method": "whiten"}, ["factorisation"]),
        (
            {
                "method": "fisher",
                "allocation": "budget",
                "sequential": True,
                "heal": "closed-form+lora",
                "lora": LoraSpec(2, 3e-5, 32),
            },
            ["calibration", "allocation", "factorisation", "healing"],
        ),
    ],
)
def test_each_step_that_runs_is_announced_as_it_ends(tokenizer, recipe, steps, monkeypatch):
    """After the heap is trimmed: what a step freed goes back to the operating system before the next."""
    events = []
    monkeypatch.setattr(runtime, "trim_heap", lambda: events.append("trim"))
    config = CompressConfig(**{"keep": 0.5, "align": 8, "calibration": CALIB, **recipe})
    pipeline.compress(
        tiny_model("llama"),
        tokenizer,
        config,
        calibration_text=SAMPLE_TEXT,
        progress=False,
        on_step=events.append,
    )
    announced = [k for k, event in enumerate(events) if event != "trim"]
    assert [events[k] for k in announced] == steps
    assert all(k > 0 and events[k - 1] == "trim" for k in announced)
