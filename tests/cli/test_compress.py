"""``svdmlp compress``: the table and summary it prints, what it saves, and bad input refused with one
line and exit 2, touching no file."""

from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, GPT2Config

from conftest import assert_cli_error, run_cli, snapshot
from svdmlp import checkpoint

TINY = ["--effort", "fast", "--align", "8", "--calib-samples", "4", "--calib-seq-len", "32"]


def test_compress_prints_layer_table_and_summary(compressed, tmp_path, capsys):
    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    code, out, err = run_cli(
        capsys, "compress", model_dir, "--keep", "0.5", "--calib", text, *TINY, "--out", out_dir
    )
    assert code == 0
    assert err.startswith("svdmlp: predicted: peak memory ")  # before any work
    assert "svdmlp: calibration done at " in err and "left at this pace (factorisation)" in err
    lines = out.splitlines()
    assert lines[0].split() == [
        "layer",
        "status",
        "rank",
        "gate/up/down",
        "keep",
        "error",
        "(activation-weighted)",
    ]
    assert lines[2].split()[:4] == ["0", "compressed", "16/16/16", "0.417/0.417/0.417"]
    assert lines[3].split()[:4] == ["1", "compressed", "16/16/16", "0.417/0.417/0.417"]
    assert "MLP parameters 36,864 -> 15,360 (achieved keep 0.4167); model 102,720 -> 81,216 (0.7907)" in out
    assert f"saved {out_dir.resolve()}" in out
    peak = next(line for line in lines if line.startswith("peak memory "))
    assert 0.1 < float(peak.split()[2]) < 64 and "(predicted " in peak and "GPU" not in peak  # GB, the host's
    metadata = checkpoint.read_metadata(out_dir)
    assert metadata["dtype"] == "bfloat16"  # --save-dtype default
    assert metadata["base_model"] == str(model_dir)
    assert metadata["config"]["calibration"] == {"source": str(text), "num_samples": 4, "seq_len": 32}


def test_compress_allocate_says_why_each_layer_got_its_rank(compressed, tmp_path, capsys):
    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    code, out, _ = run_cli(
        capsys, "compress", model_dir, "--keep", "0.5", "--allocate", "--calib", text, *TINY, "--out", out_dir
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith("KL alone (nats/token) -> predicted")
    assert " at rank 16 -> " in lines[2] and " at rank 16 -> " in lines[3]  # the rank rule at 0.5
    wall_time = next(line for line in lines if line.startswith("compress wall time "))
    assert "allocation " in wall_time  # its own phase
    report = checkpoint.read_metadata(out_dir)["report"]
    assert [layer["index"] for layer in report["allocation"]["layers"]] == [0, 1]


def test_compress_overwrite(compressed, tmp_path, capsys):
    model_dir, text, ckpt = compressed
    out_dir = tmp_path / "ckpt"
    shutil.copytree(ckpt, out_dir)
    before = snapshot(out_dir)
    argv = ["compress", model_dir, "--keep", "0.25", "--calib", text, *TINY, "--out", out_dir]
    assert_cli_error(capsys, "compress", argv, "already holds an svdmlp checkpoint", "--overwrite")
    assert snapshot(out_dir) == before
    code, _, _ = run_cli(capsys, *argv, "--overwrite")
    assert code == 0
    assert checkpoint.read_metadata(out_dir)["config"]["keep"] == 0.25
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--keep", "1.5"], "argument --keep: keep must be in"),
        (["--keep", "0"], "argument --keep: keep must be in"),
        (["--keep", "1e-9"], "argument --keep: keep 1e-09 is below 0.01"),  # once silently 0.076
        (["--align", "0"], "argument --align: expected an integer >= 1, got 0"),
        (["--calib-samples", "0"], "argument --calib-samples: expected an integer >= 1, got 0"),
        (["--heal-steps", "0"], "argument --heal-steps: expected an integer >= 1, got 0"),
        (["--max-memory", "nan"], "argument --max-memory:"),  # once it disabled the memory check
        (["--max-memory", "-1"], "argument --max-memory: expected a number > 0"),
    ],
)
def test_bad_numbers_are_usage_errors_before_any_work(tmp_path, capsys, options, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(capsys, "compress", "/nonexistent/model", "--out", tmp_path / "out", *options)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "phrases"),
    [
        (["--keep", "0.5", "--align", "64"], ["align 64 leaves no room for a rank", "use a smaller align"]),
        (["--keep", "0.02"], ["keep 0.02 is far below what one block of 8 ranks keeps", "smaller --align"]),
        (["--keep", "0.02", "--dry-run"], ["keep 0.02 is far below what one block of 8 ranks keeps"]),
        (["--keep", "0.5", "--targets", "gate,sideways"], ["targets must be distinct names"]),
        (["--keep", "0.5", "--layers", "7"], ["layers [7] do not exist: the model has 2 decoder layers"]),
    ],
)
def test_compress_rejects_bad_settings(compressed, tmp_path, capsys, options, phrases):
    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    argv = ["compress", model_dir, "--calib", text, "--out", out_dir, *options]
    if "--align" not in options:
        argv += ["--align", "8"]
    assert_cli_error(capsys, "compress", argv, *phrases)
    assert not out_dir.exists()


def test_missing_model_directory(compressed, tmp_path, capsys):
    _, text, _ = compressed
    missing = tmp_path / "no-such-model"
    argv = ["compress", missing, "--calib", text, "--out", tmp_path / "out"]
    assert_cli_error(capsys, "compress", argv, f"model directory {missing} does not exist")
    assert_cli_error(capsys, "generate", ["generate", missing, "--prompt", "x"], "does not exist")


def test_directory_that_is_not_a_model(compressed, tmp_path, capsys):
    _, text, _ = compressed
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "readme.txt").write_text("not a model")
    argv = ["compress", folder, "--calib", text, "--out", tmp_path / "out"]
    assert_cli_error(
        capsys, "compress", argv, f"{folder} is not a Hugging Face model directory (no config.json)"
    )


@pytest.mark.parametrize(
    ("config", "model_type"),
    [
        (GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64), "gpt2"),
        (
            BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64),
            "bert",
        ),
    ],
)
def test_unsupported_architecture(compressed, tmp_path, capsys, config, model_type):
    _, text, _ = compressed
    config.save_pretrained(tmp_path / model_type)
    argv = ["compress", tmp_path / model_type, "--calib", text, "--out", tmp_path / "out"]
    assert_cli_error(
        capsys,
        "compress",
        argv,
        f"unsupported model type {model_type!r}",
        "svdmlp supports: gemma, gemma2, gemma3, gemma3_text, llama, mistral, qwen2, qwen3",
    )
    assert not (tmp_path / "out").exists()


def test_out_is_a_non_checkpoint_directory(compressed, tmp_path, capsys):
    model_dir, text, _ = compressed
    out_dir = tmp_path / "mine"
    out_dir.mkdir()
    (out_dir / "thesis.tex").write_text("years of work")
    before = snapshot(out_dir)
    for extra in ([], ["--overwrite"]):
        argv = ["compress", model_dir, "--calib", text, *TINY, "--out", out_dir, *extra]
        assert_cli_error(capsys, "compress", argv, f"{out_dir} exists and is not an svdmlp checkpoint")
        assert snapshot(out_dir) == before


def test_calibration_text_errors(compressed, tmp_path, capsys):
    model_dir, _, _ = compressed
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    missing = tmp_path / "missing.txt"
    for calib, phrase in (
        (empty, f"text file {empty} is empty"),
        (missing, f"text file {missing} does not exist"),
    ):
        argv = ["compress", model_dir, "--calib", calib, *TINY, "--out", tmp_path / "out"]
        assert_cli_error(capsys, "compress", argv, phrase)
        assert not (tmp_path / "out").exists()


def test_nan_weights(compressed, tokenizer, tmp_path, capsys):
    model_dir, text, _ = compressed
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 5] = float("nan")
    model.save_pretrained(tmp_path / "nan-model")
    tokenizer.save_pretrained(tmp_path / "nan-model")
    argv = ["compress", tmp_path / "nan-model", "--calib", text, *TINY, "--out", tmp_path / "out"]
    assert_cli_error(capsys, "compress", argv, "model.layers.1.mlp.up_proj has NaN or inf weights")
    assert not (tmp_path / "out").exists()


def _config(*argv):
    from svdmlp.cli import build_parser
    from svdmlp.cli.compress import config

    return config(build_parser().parse_args(["compress", "--out", "x", *argv]), inter=1536)


def test_effort_presets_fill_every_option_not_given():
    default = _config()
    assert (default.allocation, default.sequential, default.heal) == ("budget", True, "closed-form+lora")
    assert (default.calibration.num_samples, default.lora.steps) == (32, 16)
    assert default.calibration.source == "general"
    fast = _config("--effort", "fast")
    assert (fast.allocation, fast.sequential, fast.heal, fast.calibration.num_samples) == (
        "uniform",
        False,
        "none",
        32,
    )
    thorough = _config("--effort", "thorough")
    assert (thorough.calibration.num_samples, thorough.lora.steps) == (32, 64)
    mixed = _config("--no-allocate", "--heal-steps", "5", "--calib-samples", "8")
    assert (mixed.allocation, mixed.sequential, mixed.lora.steps, mixed.calibration.num_samples) == (
        "uniform",
        True,
        5,
        8,
    )
    plain = _config("--method", "svd")  # no calibration: no sequential pass, no closed form
    assert (plain.sequential, plain.heal, plain.allocation) == (False, "lora", "budget")


@pytest.mark.parametrize("effort", ["fast", "default", "thorough"])
def test_an_efforts_recipe_is_what_compress_does_with_that_effort(effort):
    from svdmlp.config import EFFORTS, CompressConfig

    given = _config("--effort", effort)
    named = CompressConfig().with_recipe(EFFORTS[effort].recipe)
    fields = ("method", "allocation", "sequential", "heal")
    assert [getattr(named, f) for f in fields] == [getattr(given, f) for f in fields]


def test_a_plan_over_the_memory_allowed_is_refused_before_any_work(compressed, tmp_path, capsys):
    model_dir, text, _ = compressed
    argv = ["compress", model_dir, "--calib", text, *TINY, "--max-memory", "0.01", "--out", tmp_path / "out"]
    line = assert_cli_error(capsys, "compress", argv, "predicted to need", "GB allowed (--max-memory)")
    assert "error: the " in line
    assert not (tmp_path / "out").exists()


def test_a_dry_run_prints_each_steps_prediction_and_writes_nothing(compressed, tmp_path, capsys):
    import json

    model_dir, text, _ = compressed
    record = tmp_path / "record.json"
    argv = ["compress", model_dir, "--calib", text, *TINY, "--dry-run", "--out", tmp_path / "out"]
    code, out, err = run_cli(capsys, *argv, "--json", record)
    assert code == 0 and err.startswith("svdmlp: predicted: peak memory ")
    lines = out.splitlines()
    assert lines[0].split() == ["step", "peak", "memory", "time"]
    assert any(line.startswith("calibration ") for line in lines) and "GFLOP/s" in out
    assert json.loads(record.read_text())["predicted"]["memory_bytes"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]  # no checkpoint, no scratch


@pytest.mark.parametrize("short", ["scratch", "checkpoint"])
def test_a_plan_whose_scratch_files_and_checkpoint_do_not_fit_the_disk_is_refused_before_any_work(
    compressed, tmp_path, capsys, monkeypatch, short
):
    from svdmlp.compression import footprint, workspace

    if short == "scratch":
        monkeypatch.setattr(workspace, "free_disk", lambda path: 0)
    else:  # the disk has room for the scratch files; the checkpoint written beside them counts too
        monkeypatch.setattr(footprint, "checkpoint_bytes", lambda *args: 1e18)
    model_dir, text, _ = compressed
    argv = ["compress", model_dir, "--calib", text, *TINY, "--out", tmp_path / "out"]
    assert_cli_error(capsys, "compress", argv, "predicted to need", "of disk", "larger disk")
    assert list(tmp_path.iterdir()) == []  # no scratch directory, no output


def test_factor_bits_store_the_factors_quantized_and_eval_counts_their_bytes(compressed, tmp_path, capsys):
    import json

    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    code, out, _ = run_cli(
        capsys,
        "compress",
        model_dir,
        "--keep",
        "0.5",
        "--calib",
        text,
        *TINY,
        "--factor-bits",
        "8",
        "--out",
        out_dir,
    )
    assert code == 0
    assert "factors stored int8: 0.0 MB in bf16 -> 0.0 MB, GPTQ and refit on the calibration windows" in out
    quantization = checkpoint.read_metadata(out_dir)["report"]["quantization"]
    assert quantization["factor_params"] == 15360 and quantization["method"] == "gptq+refit"
    assert quantization["output_error_mean"] < 0.02
    evaluate = ["--text", text, "--seq-len", "16", "--max-windows", "2", "--no-baseline"]
    code, out, _ = run_cli(capsys, "eval", out_dir, *evaluate, "--json", "-")
    assert code == 0
    (row,) = json.loads(out)["rows"]
    assert row["kind"].endswith(", factors int8)")
    # 15,360 int8 values and one fp16 scale per output channel of each factor (16 ranks, 64 or 96 outputs)
    per_layer = 2 * (
        32 + 96 + 96 + 16 + 64
    )  # gate_up_u_t 32 outputs, gate/up_v_t 96, down_u_t 16, down_v_t 64
    assert row["quantization"]["mlp_bytes"] == 15360 + 2 * per_layer
    assert_cli_error(
        capsys, "eval", ["eval", out_dir, *evaluate, "--quantize", "int4"], "already stores its factors int8"
    )
    with pytest.raises(SystemExit):
        run_cli(capsys, "compress", model_dir, "--factor-bits", "5", "--out", tmp_path / "x")
    assert "invalid choice: 5 (choose from 16, 8, 4)" in capsys.readouterr().err


def test_quantize_stores_the_weights_with_their_corrections_and_loads_them_as_rounded(
    compressed, tmp_path, capsys
):
    import json

    from transformers import AutoModelForCausalLM

    from svdmlp import models
    from svdmlp.compression.quantized_dense import quantize_dense_mlps
    from svdmlp.config import CalibrationSpec, CompressConfig
    from svdmlp.quantized_linear import QuantizedLinear

    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    calib = ["--calib", text, "--calib-samples", "4", "--calib-seq-len", "32", "--align", "8"]
    argv = ["compress", model_dir, "--quantize", "int4", "--correction-keep", "0.5", *calib]
    code, out, err = run_cli(capsys, *argv, "--save-dtype", "float32", "--out", out_dir)
    assert code == 0, err
    assert "left at this pace" not in err and "svdmlp: quantization done at " in err
    lines = out.splitlines()
    # hidden 64, inter 96: the correction's rank round(0.5·64·96 / (160·8))·8 = 16, keep 16·160/6144
    assert lines[2].split()[:5] == ["0", "quantized,", "corrected", "16/16/16", "0.417/0.417/0.417"]
    assert "MLP weights stored int4 by GPTQ on the calibration windows and a correction keeping 0.5" in out
    metadata = checkpoint.read_metadata(out_dir)
    assert metadata["config"]["quantize"] == "int4" and metadata["config"]["correction_keep"] == 0.5
    manifest = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    assert manifest["weights"] == "int4" and manifest["format_version"] == 5
    assert manifest["layers"] == {
        "0": {"gate": 16, "up": 16, "down": 16},
        "1": {"gate": 16, "up": 16, "down": 16},
    }

    # The same rounding as fake quantization of the dense model on the same windows: the same logits
    dense, tokenizer, _ = models.load_dense(str(model_dir))
    config = CompressConfig(keep=1.0, align=8, calibration=CalibrationSpec(str(text), 4, 32), sequential=True)
    quantize_dense_mlps(dense, tokenizer, "int4", config, progress=False, correction_keep=0.5)
    loaded, _ = checkpoint.load(out_dir)
    assert isinstance(loaded.model.layers[1].mlp.down_proj, QuantizedLinear)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        expected, got = dense(ids).logits, loaded(ids).logits
        through_transformers = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)(ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(through_transformers, got, rtol=0, atol=0)

    evaluate = ["--text", text, "--seq-len", "16", "--max-windows", "2", "--no-baseline"]
    code, out, _ = run_cli(capsys, "eval", out_dir, *evaluate, "--json", "-")
    assert code == 0
    (row,) = json.loads(out)["rows"]
    assert row["kind"] == "compressed (MLP int4 GPTQ + correction 0.5)"
    # 2 layers × 3 weights of 64·96 int4 values, one fp16 scale per row of each (128 inputs a group),
    # and the corrections' 2 × 3 × 16·160 parameters in bf16
    scales = 2 * 2 * (96 + 96 + 64)
    assert row["quantization"]["mlp_bytes"] == 2 * 3 * 64 * 96 // 2 + scales + 2 * 2 * 3 * 16 * 160
    assert_cli_error(
        capsys,
        "eval",
        ["eval", out_dir, *evaluate, "--quantize", "int8"],
        "already stores its MLP weights int4",
    )
    code, out, _ = run_cli(capsys, "info", out_dir)
    assert code == 0 and "quantized, corrected" in out

    # Tampered like any checkpoint: refused before anything loads
    weights = next(out_dir.glob("model-00001-*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="changed since it was saved|does not match|SHA-256"):
        checkpoint.load(out_dir)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--quantize", "int4", "--keep", "0.5"],
            "--quantize stores every MLP weight quantized, nothing factorised: --keep do not apply",
        ),
        (
            ["--quantize", "int8", "--factor-bits", "4"],
            "--factor-bits is the width of the correction's factors: give --correction-keep",
        ),
        (["--correction-keep", "0.1"], "--correction-keep corrects quantized weights: give --quantize"),
        (["--quantize", "int4", "--correction-keep", "1"], "the correction's keep must be in [0, 1)"),
    ],
)
def test_quantize_refuses_what_does_not_apply(compressed, tmp_path, capsys, flags, message):
    model_dir, _, _ = compressed
    assert_cli_error(capsys, "compress", ["compress", model_dir, *flags, "--out", tmp_path / "x"], message)
    assert not (tmp_path / "x").exists()


def test_quantize_stores_zero_points_of_an_asymmetric_scheme(compressed, tmp_path, capsys):
    from svdmlp import models
    from svdmlp.compression.quantized_dense import quantize_dense_mlps
    from svdmlp.config import CalibrationSpec, CompressConfig

    model_dir, text, _ = compressed
    calib = ["--calib", text, "--calib-samples", "4", "--calib-seq-len", "32"]
    out_dir = tmp_path / "out"
    code, out, err = run_cli(
        capsys,
        "compress",
        model_dir,
        "--quantize",
        "int4-asym",
        *calib,
        "--save-dtype",
        "float32",
        "--out",
        out_dir,
    )
    assert code == 0, err
    assert "MLP weights stored int4-asym by GPTQ on the calibration windows: " in out
    assert checkpoint.read_metadata(out_dir)["report"]["layers"][0]["status"] == "quantized"
    dense, tokenizer, _ = models.load_dense(str(model_dir))
    config = CompressConfig(keep=1.0, calibration=CalibrationSpec(str(text), 4, 32), sequential=True)
    quantize_dense_mlps(dense, tokenizer, "int4-asym", config, progress=False)
    loaded, _ = checkpoint.load(out_dir, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, dense(ids).logits, rtol=1e-4, atol=1e-4)


def test_quantize_stores_the_correction_int8_and_loads_it_as_fake_quantization_scores_it(
    compressed, tmp_path, capsys
):
    import json

    from transformers import AutoModelForCausalLM

    from svdmlp import models
    from svdmlp.compression.quantized_dense import quantize_dense_mlps
    from svdmlp.config import CalibrationSpec, CompressConfig
    from svdmlp.int_weights import QuantizedMatrix, scheme

    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    calib = ["--calib", text, "--calib-samples", "4", "--calib-seq-len", "32", "--align", "8"]
    argv = [
        "compress",
        model_dir,
        "--quantize",
        "int4-asym",
        "--correction-keep",
        "0.5",
        "--factor-bits",
        "8",
    ]
    code, out, err = run_cli(capsys, *argv, *calib, "--save-dtype", "float32", "--out", out_dir)
    assert code == 0, err
    assert "a correction keeping 0.5 of each weight (15,360 parameters in int8)" in out
    manifest = json.loads((out_dir / "config.json").read_text())["quantization_config"]
    assert manifest["weights"] == "int4-asym" and manifest["factor_bits"] == 8
    loaded, _ = checkpoint.load(out_dir, dtype=torch.float32)
    down = loaded.model.layers[1].mlp.down_proj
    assert isinstance(down.v_t, QuantizedMatrix) and down.rank == 16
    dense, tokenizer, _ = models.load_dense(str(model_dir))
    config = CompressConfig(keep=1.0, align=8, calibration=CalibrationSpec(str(text), 4, 32), sequential=True)
    fake = quantize_dense_mlps(
        dense, tokenizer, "int4-asym", config, progress=False, correction_keep=0.5, correction_bits=8
    )
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        got = loaded(ids).logits
        through_transformers = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)(ids).logits
        torch.testing.assert_close(got, dense(ids).logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(through_transformers, got, rtol=0, atol=0)
    # the bytes counted are the stored ones: per layer gate and up (96 x 64) and down (64 x 96), each
    # with its factors v (out x 16) and u (16 x in) int8 with a scale a row
    stored = checkpoint.read_metadata(out_dir)["report"]["quantization"]
    int4, int8 = scheme("int4-asym"), scheme("int8")
    gate = int4.nbytes(96, 64) + int8.nbytes(96, 16) + int8.nbytes(16, 64)
    down = int4.nbytes(64, 96) + int8.nbytes(64, 16) + int8.nbytes(16, 96)
    assert stored["mlp_bytes"] == fake["mlp_bytes"] == 2 * (2 * gate + down)
    assert stored["correction_bits"] == 8


def test_quantize_allocates_the_corrections_ranks_from_measured_divergence(compressed, tmp_path, capsys):
    from svdmlp import models
    from svdmlp.compression.quantized_dense import quantize_dense_mlps
    from svdmlp.config import CalibrationSpec, CompressConfig

    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    calib = ["--calib", text, "--calib-samples", "4", "--calib-seq-len", "32", "--align", "8"]
    argv = ["compress", model_dir, "--quantize", "int4", "--correction-keep", "0.2", "--allocate", *calib]
    code, out, err = run_cli(capsys, *argv, "--save-dtype", "float32", "--out", out_dir)
    assert code == 0, err
    report = checkpoint.read_metadata(out_dir)["report"]
    allocation = report["allocation"]
    assert [layer["index"] for layer in allocation["layers"]] == [0, 1]
    assert all(layer["kl"] > 0 and layer["rank"] % 8 == 0 for layer in allocation["layers"])
    chosen = {layer["index"]: layer["rank"] for layer in allocation["layers"]}
    stored = {layer["index"]: {p["rank"] for p in layer["projections"]} or {0} for layer in report["layers"]}
    assert stored == {index: {rank} for index, rank in chosen.items()}
    # within the budget of the uniform correction: 0.2 of 2 layers x 3 weights of 64 x 96
    assert sum(rank * (2 * (64 + 96) + (96 + 64)) for rank in chosen.values()) <= 0.2 * 2 * 3 * 64 * 96
    assert "allocation" in report["timings"]

    # fake quantization with the same allocation scores the same model
    dense, tokenizer, _ = models.load_dense(str(model_dir))
    config = CompressConfig(keep=1.0, align=8, calibration=CalibrationSpec(str(text), 4, 32), sequential=True)
    fake = quantize_dense_mlps(
        dense, tokenizer, "int4", config, progress=False, correction_keep=0.2, allocate=True
    )
    assert [layer["rank"] for layer in fake["allocation"]["layers"]] == list(chosen.values())
    loaded, _ = checkpoint.load(out_dir, dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, dense(ids).logits, rtol=1e-4, atol=1e-4)
    assert_cli_error(
        capsys,
        "compress",
        ["compress", model_dir, "--quantize", "int4", "--allocate", "--out", tmp_path / "x"],
        "--allocate shares the correction's ranks out: give --correction-keep",
    )
