"""Predicted memory and time of a compression, from the model's shapes."""

import pytest

from conftest import tiny_config
from svdmlp import ranks
from svdmlp.compression import footprint
from svdmlp.config import CalibrationSpec, CompressConfig, LoraSpec

RATES = footprint.Rates(f32=50e9, f64=25e9)
LLAMA_1B = footprint.Shapes(
    hidden=2048, inter=8192, layers=16, vocab=128256, layer_params=60_821_504, tied=True
)


def _config(**changes) -> CompressConfig:
    values = dict(
        keep=0.8,
        method="fisher",
        calibration=CalibrationSpec("general", 16, 512),
        allocation="budget",
        sequential=True,
        heal="closed-form",
    )
    values.update(changes)
    return CompressConfig(**values)


def test_shapes_of_a_config_count_the_model():
    config = tiny_config("llama")
    shapes = footprint.Shapes.of_config(config)
    assert (shapes.hidden, shapes.inter, shapes.layers, shapes.vocab) == (64, 96, 2, 320)
    attention = 64 * 16 * (2 * 4 + 2 * 2)  # head_dim 16, 4 heads, 2 key-value heads
    assert shapes.layer_params == attention + 3 * 64 * 96 + 2 * 64


def test_a_compression_needs_a_layer_not_the_model():
    two = footprint.predict(LLAMA_1B, _config(), 2, RATES).peak[1]
    assert two < LLAMA_1B.params * 4  # less than the weights in float32
    four = footprint.predict(LLAMA_1B, _config(), 4, RATES).peak[1]
    assert four == pytest.approx(two, rel=0.01)  # memory does not grow with the layers compressed


LLAMA_8B = footprint.Shapes(
    hidden=4096, inter=14336, layers=32, vocab=128256, layer_params=218_112_000, tied=False
)


# svdmlp compress SHAPED --keep 0.8 --layers L --calib-samples 5 --heal closed-form (BENCHMARKS.md): the
# 8B-shaped layer peaked at 8.49 GB (session 13) in the SVD of a projection beside its root and in closed
# form's Grams, which the first line had left out (it said 6.6 GB); the 1B-shaped pair at 3.67 GB
# (session 14) in the sensitivity probes, whose factors, products and recorded outputs it had left out
# (it said 3.0 GB).
@pytest.mark.parametrize(("shapes", "layers", "measured"), [(LLAMA_8B, (0,), 8.49), (LLAMA_1B, (0, 1), 3.67)])
def test_the_shaped_runs_are_predicted_within_a_fifth_of_their_measured_peaks(shapes, layers, measured):
    config = _config(calibration=CalibrationSpec("general", 5, 512), layers=layers)
    peak = footprint.predict(shapes, config, len(layers), RATES).peak[1]
    assert 0.85 * measured * footprint.GB <= peak <= 1.2 * measured * footprint.GB


QWEN_05B = footprint.Shapes(
    hidden=896, inter=4864, layers=24, vocab=151936, layer_params=14_911_232, tied=False, heads=14
)


# svdmlp compress qwen2.5-coder-0.5b --keep 0.8 --calib-samples 5 --no-allocate --heal-steps 5 (BENCHMARKS.md,
# session 17), each step's measured peak: the first line had said 1.5, 1.3 and 2.1 GB, its base the
# process after its imports, not what the heap keeps once layers have run (HEAP_RETAINED).
@pytest.mark.parametrize(
    ("step", "measured"), [("calibration", 1.67), ("factorisation", 1.84), ("healing", 2.54)]
)
def test_each_step_of_the_default_recipe_on_disk_is_predicted_within_a_fifth(step, measured):
    config = _config(
        calibration=CalibrationSpec("general", 5, 512),
        allocation="uniform",
        heal="closed-form+lora",
        lora=LoraSpec(5, None, 512, relative_lr=3e-4),
    )
    predicted = footprint.predict(QWEN_05B, config, 24, RATES).memory[step]
    assert 0.85 * measured * footprint.GB <= predicted <= 1.2 * measured * footprint.GB


QWEN_15B = footprint.Shapes(
    hidden=1536, inter=8960, layers=28, vocab=151936, layer_params=46_795_776, tied=False, heads=12
)


# The calibration's peak, in its backward pass: Qwen2.5-Coder-1.5B on its default 224 windows at 5.02 GB,
# two copies of the windows' hidden states (0.7 GB each) beside a layer's Grams (BENCHMARKS.md, session
# 20, once a third copy was removed); the Llama-3.1-8B-shaped layer on 5 windows at 6.52 GB (session 18).
@pytest.mark.parametrize(
    ("shapes", "windows", "layers", "measured"), [(QWEN_15B, 224, 28, 5.02), (LLAMA_8B, 5, 1, 6.52)]
)
def test_the_calibration_is_predicted_within_a_fifth_of_its_measured_peak(shapes, windows, layers, measured):
    config = _config(calibration=CalibrationSpec("general", windows, 512))
    predicted = footprint.predict(shapes, config, layers, RATES).memory["calibration"]
    assert 0.85 * measured * footprint.GB <= predicted <= 1.2 * measured * footprint.GB


# The 1.5B sweep's measurement of its three keeps' sensitivities at once peaked at 4.84 GB, in the probes,
# once the dense walk held the windows' hidden states once and gave the heap's free pages back before each
# layer's decompositions (6.30 GB before; BENCHMARKS.md, session 21).
def test_a_sweeps_shared_allocation_is_predicted_within_a_fifth_of_its_measured_peak():
    config = _config(calibration=CalibrationSpec("general", 224, 512))
    keeps = (0.8, 0.9, 0.95)
    predicted = footprint.predict(QWEN_15B, config, 28, RATES, keeps_probed=keeps).memory["allocation"]
    assert 0.85 * 4.84 * footprint.GB <= predicted <= 1.2 * 4.84 * footprint.GB


def test_distillation_holds_the_whole_model_only_when_loaded_whole():
    config = _config(heal="closed-form+lora", lora=LoraSpec(16, 3e-5, 512))
    layered = footprint.predict(LLAMA_1B, config, 16, RATES)
    assert layered.memory["healing"] < LLAMA_1B.params * 4  # less than the model in float32
    resident = footprint.predict(LLAMA_1B, config, 16, RATES, resident_healing=True)
    assert resident.memory["healing"] > LLAMA_1B.params * 4


def test_time_grows_with_the_layers_and_the_line_says_it():
    two = footprint.predict(LLAMA_1B, _config(), 2, RATES)
    four = footprint.predict(LLAMA_1B, _config(), 4, RATES)
    assert sum(four.seconds.values()) > sum(two.seconds.values())
    line = two.line()
    assert line.startswith("predicted: peak memory ") and "GB" in line and "time" in line
    assert footprint.Rates(1.0, 2.0).root(10) == footprint.ROOT_FLOPS * 1000 / 2.0


def test_the_line_says_when_the_cores_were_busy_and_the_time_if_they_free_up():
    seconds = {"calibration": 3000.0, "factorisation": 600.0}
    alone = footprint.Footprint({}, seconds, RATES).line()
    assert "busy" not in alone and "time 60 min" in alone
    shared = footprint.Footprint({}, seconds, footprint.Rates(RATES.f32, RATES.f64, share=0.25)).line()
    assert shared.endswith(
        "from the model's shapes; the cores are busy (this process got 25% of them), so the time is at "
        "that pace: at most about 15 min if they free up"
    )


def test_the_rates_measured_here_say_what_share_of_the_cores_they_had():
    rates = footprint.Rates.measure()
    assert rates.f32 > 0 and rates.f64 > 0 and 0 < rates.share <= 1


def test_work_is_timed_at_the_achieved_fraction_of_the_measured_rates(monkeypatch):
    config = _config(heal="closed-form+lora", lora=LoraSpec(16, 3e-5, 512))
    predicted, achieved = footprint.predict(LLAMA_1B, config, 2, RATES), footprint.ACHIEVED
    monkeypatch.setattr(footprint, "ACHIEVED", 1.0)
    at_full_rate = footprint.predict(LLAMA_1B, config, 2, RATES)
    assert predicted.seconds == pytest.approx(
        {step: seconds / achieved for step, seconds in at_full_rate.seconds.items()}
    )
    assert predicted.to_dict()["rates_flops"] == {"float32": RATES.f32, "float64": RATES.f64}  # as measured


def test_the_pace_line_scales_the_steps_left_by_the_pace_so_far():
    prediction = footprint.Footprint(
        {}, {"calibration": 60.0, "allocation": 120.0, "factorisation": 60.0}, RATES
    )
    line = prediction.pace_line(["calibration"], 90.0)  # 1.5x slower than predicted
    assert (
        line
        == "calibration done at 90 s (predicted 60 s); about 4 min left at this pace (allocation, factorisation)"
    )
    assert prediction.pace_line(["calibration", "allocation", "factorisation"], 200.0) == (
        "factorisation done at 3 min (predicted 4 min)"
    )


def test_a_sweep_calibrates_once_and_peaks_as_its_largest_point():
    keeps = [_config(keep=k, heal="closed-form+lora", lora=LoraSpec(16, 3e-5, 512)) for k in (0.9, 0.8, 0.6)]
    points = [footprint.predict(LLAMA_1B, config, 16, RATES) for config in keeps]
    sweep = footprint.predict_sweep(LLAMA_1B, keeps, RATES, eval_tokens=8192, scores=4)
    assert sweep.seconds["calibration"] == points[0].seconds["calibration"]  # once, shared by every keep
    assert sweep.seconds["factorisation"] == pytest.approx(sum(p.seconds["factorisation"] for p in points))
    assert sweep.seconds["evaluation"] == pytest.approx(
        4 * 2 * LLAMA_1B.params * 8192 / RATES.f32
    )  # and dense
    # One point's model and Grams at a time; the first measures the three keeps' sensitivities.
    measuring = footprint.predict(LLAMA_1B, keeps[0], 16, RATES, keeps_probed=(0.9, 0.8, 0.6))
    assert sweep.peak[1] == max(p.peak[1] for p in [measuring, *points[1:]])


def test_a_sweep_measures_its_allocations_sensitivities_once_for_every_keep():
    keeps = [_config(keep=k) for k in (0.9, 0.8, 0.6)]
    alone = [footprint.predict(LLAMA_1B, config, 16, RATES) for config in keeps]
    sweep = footprint.predict_sweep(LLAMA_1B, keeps, RATES, eval_tokens=0, scores=4)
    measuring = footprint.predict(LLAMA_1B, keeps[0], 16, RATES, keeps_probed=(0.9, 0.8, 0.6))
    assert sweep.seconds["allocation"] == pytest.approx(measuring.seconds["allocation"])  # the others choose
    assert alone[0].seconds["allocation"] < sweep.seconds["allocation"]  # a probe per keep
    assert sweep.seconds["allocation"] < 0.6 * sum(p.seconds["allocation"] for p in alone)
    # Every keep's factors are held while the layer's probes run.
    assert sweep.memory["allocation"] > max(p.memory["allocation"] for p in alone)
    # At most three keeps at once: a fourth and fifth share another measurement.
    five = footprint.predict_sweep(LLAMA_1B, keeps + [_config(keep=0.5), _config(keep=0.4)], RATES, 0, 6)
    pair = footprint.predict(LLAMA_1B, keeps[0], 16, RATES, keeps_probed=(0.5, 0.4))
    assert five.seconds["allocation"] == pytest.approx(
        sweep.seconds["allocation"] + pair.seconds["allocation"]
    )


def test_the_allocation_carries_the_windows_through_the_layers_to_the_last_it_measures():
    # Qwen2.5-Coder-1.5B's three keeps measured 131-230 s a layer (BENCHMARKS.md, sessions 20-21),
    # 1.6x the first line's 123 s before it counted the dense walk's forward pass.
    config = _config()
    walk = 2 * 16 * LLAMA_1B.layer_params * 16 * 513 / (RATES.f32 * footprint.ACHIEVED)
    every = footprint.predict(LLAMA_1B, config, 16, RATES).seconds["allocation"]
    last = footprint.predict(LLAMA_1B, config, 16, RATES, measured=15).seconds["allocation"]
    assert last == pytest.approx(walk + (every - walk) / 16)  # from the first layer, also when continued
    assert footprint.predict(LLAMA_1B, config, 16, RATES, measured=16).seconds["allocation"] == 0


def test_the_factorisation_walks_up_to_its_last_layer_dense_and_sequentially_again_compressed():
    def seconds(**changes) -> float:
        config = _config(**changes)
        layers = len(config.layers) if config.layers else 16
        return footprint.predict(LLAMA_1B, config, layers, RATES).seconds["factorisation"]

    rate = RATES.f32 * footprint.ACHIEVED
    rank = ranks.rank_for_keep(2048, 8192, 0.8, CompressConfig().align)
    compressed_layer = LLAMA_1B.layer_params - 3 * 2048 * 8192 + 3 * (2048 + 8192) * rank
    again = 2 * 16 * compressed_layer * 16 * 513 / rate  # every layer run once more, compressed
    assert seconds(heal="none") - seconds(sequential=False, heal="none") == pytest.approx(again)
    further = 2 * 3 * LLAMA_1B.layer_params * 16 * 513 / rate  # three more dense layers to walk through
    assert seconds(layers=(3,), sequential=False, heal="none") - seconds(
        layers=(0,), sequential=False, heal="none"
    ) == pytest.approx(further)


def test_a_stopped_point_has_left_the_layers_its_allocation_chose_that_are_not_stored():
    assert footprint.Done().left(16) == 16 and footprint.Done(layers=10).left(16) == 6
    allocated = footprint.Done(("calibration", "allocation"), layers=3, chosen=5)
    assert allocated.left(16) == 2  # eleven layers left dense are not compressed
    healed = footprint.Done(("calibration", "allocation", "factorisation", "healing"), layers=5, chosen=5)
    sweep = footprint.predict_sweep(LLAMA_1B, [_config(keep=0.95)], RATES, 512, 1, [healed])
    assert set(sweep.seconds) == {"evaluation"}  # a point whose layers are healed is only scored


def test_a_continued_sweep_predicts_only_what_its_stopped_points_left():
    keeps = [_config(keep=k) for k in (0.9, 0.8)]
    stopped = footprint.Done(("calibration", "allocation"), layers=10)
    sweep = footprint.predict_sweep(LLAMA_1B, keeps, RATES, 0, 3, [stopped, footprint.Done(("calibration",))])
    left = footprint.predict(LLAMA_1B, keeps[0], 6, RATES)
    rest = footprint.predict(LLAMA_1B, keeps[1], 16, RATES)
    assert "calibration" not in sweep.seconds and "calibration" not in sweep.memory
    assert sweep.seconds["allocation"] == pytest.approx(
        rest.seconds["allocation"]
    )  # the first point's is done
    assert sweep.seconds["factorisation"] == pytest.approx(
        left.seconds["factorisation"] + rest.seconds["factorisation"]
    )


def test_scratch_disk_is_the_spilled_grams_and_compressed_layers():
    config = _config()
    predicted = footprint.predict(LLAMA_1B, config, 16, RATES)
    h, i = 2048, 8192
    grams = 16 * (2 * i * i + h * h) * 4  # float32, every layer's, as the backward sweep ends
    layers = 16 * (LLAMA_1B.layer_params - 3 * h * i + 3 * (h + i) * 1312) * 4  # keep 0.8's rank, float32
    hidden_states = (16 + 1) * 16 * 513 * h * 4  # every layer's inputs and the gradient reached
    assert predicted.disk == pytest.approx(grams + layers + hidden_states)
    assert "scratch disk" in predicted.line() and predicted.to_dict()["disk_bytes"] == predicted.disk
    whiten = footprint.predict(LLAMA_1B, _config(method="whiten", allocation="uniform"), 16, RATES)
    assert whiten.disk == pytest.approx(layers)  # no output-gradient Grams: the compressed layers alone


def test_calibration_with_fewer_tokens_than_the_mlp_is_wide_is_warned_of():
    # 8 windows of 513 tokens for Llama-3.2-1B's 8192-wide MLP: its Grams have rank at most 4,104.
    thin = footprint.thin_calibration(LLAMA_1B, _config(calibration=CalibrationSpec("general", 8, 512)))
    assert thin.startswith("warning: 8 calibration windows are 4,104 tokens, fewer than the MLP's 8,192-wide")
    assert thin.endswith("pass --calib-samples 16 or more")  # 16 × 513 = 8,208
    assert (
        footprint.thin_calibration(LLAMA_1B, _config(calibration=CalibrationSpec("general", 16, 512))) is None
    )
    eight = CalibrationSpec("general", 8, 512)
    plain = _config(method="svd", sequential=False, heal="none", allocation="uniform", calibration=eight)
    assert footprint.thin_calibration(LLAMA_1B, plain) is None  # plain SVD calibrates nothing
