"""``svdmlp eval``: a checkpoint against its dense base (or a model alone) on perplexity texts and lm-eval
tasks: one table, deltas, a stable JSON record, and bad input as one line and exit 2."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from conftest import assert_cli_error, edit_metadata, run_cli, tiny_checkpoint
from svdmlp.evaluate import harness, tasks

pytest.importorskip("lm_eval")

RECORDS = [
    {"question": "the quick fox", "choices": ["jumps over", "sleeps"], "label": 0},
    {"question": "the lazy dog", "choices": ["walks", "sings over the far hill"], "label": 1},
    {"question": "the brave king", "choices": ["speaks", "runs", "falls"], "label": 2},
]
EVAL = ["--seq-len", "32", "--max-windows", "2"]
TOP_KEYS = {
    "bos",
    "calibration",
    "failed",
    "keep_definition",
    "perplexity",
    "protocol",
    "ratio_to_dense",
    "rows",
    "seed",
    "settings",
    "text",
    "versions",
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    """A tiny Llama directory, a text, a local task folder and a checkpoint compressed from the model."""
    root = tmp_path_factory.mktemp("evalcmd")
    model_dir, text, ckpt = tiny_checkpoint(root, tokenizer)
    task_dir = root / "tasks"
    tasks.write_multiple_choice_task(task_dir, "tiny_mc", RECORDS)
    return model_dir, text, task_dir, ckpt


@pytest.fixture(autouse=True)
def local_tasks_only(monkeypatch):
    local = harness._task_manager.__wrapped__  # lm-eval's own 15 s index is not needed here
    monkeypatch.setattr(harness, "_task_manager", lambda factory, path, defaults: local(factory, path, False))


def test_checkpoint_and_base_on_text_and_task(setup, capsys, tmp_path):
    model_dir, text, task_dir, ckpt = setup
    output = tmp_path / "result.json"
    argv = ["eval", ckpt, "--text", text, *EVAL, "--tasks", "tiny_mc", "--include-path", task_dir]
    code, out, _ = run_cli(capsys, *argv, "--json", output)
    assert code == 0
    header = out.splitlines()[1]
    assert "tiny_mc acc" in header and "tiny_mc acc_norm" in header
    assert "compressed / dense perplexity:" in out and "compressed - dense accuracy: tiny_mc acc " in out
    assert out.strip().splitlines()[-1] == f"wrote {output}"
    summary = json.loads(output.read_text())
    assert set(summary) == TOP_KEYS
    dense, compressed = (row["perplexity"][str(text)] for row in summary["rows"])
    assert summary["ratio_to_dense"] == {
        "ratios": {str(text): compressed / dense},
        "geomean": pytest.approx(compressed / dense),
        "groups": {},  # a file is in neither the held-out domains nor an unseen suite
    }
    assert summary["calibration"]["sources"] == [[str(text), 1.0]]
    assert f"calibrated on 128 tokens of: {text} 1.00 (token SHA-256 " in out
    code, printed, _ = run_cli(capsys, *argv, "--json", "-")  # the same record on standard output
    assert code == 0 and json.loads(printed) == summary
    assert summary["failed"] == [] and summary["seed"] == 0
    assert summary["settings"] == {
        "seq_len": 32,
        "max_windows": 2,
        "batch_size": 1,
        "tasks": ["tiny_mc"],
        "include_path": str(task_dir),
        "limit": None,
        "seed": 0,
        "bos": "auto",
    }
    assert summary["bos"] == {"token_id": None, "convention": None}  # a Llama whose tokenizer adds none
    assert set(summary["versions"]) == {"svdmlp", "torch", "transformers", "lm_eval"}
    assert (
        set(summary["calibration"]) == {"tokens", "sha256", "sources"}
        and summary["calibration"]["tokens"] == 128
    )
    dense, compressed = summary["rows"]
    for row in (dense, compressed):
        compressed_only = {"compress_seconds", "timings", "calibration", "healing"}
        assert set(row) == {"model", "kind", "params", "achieved_keep", "perplexity", "tasks", "bos"} | (
            compressed_only if row is compressed else set()
        )
        assert set(row["params"]) == {"total", "mlp"}
        result = row["tasks"]["tiny_mc"]
        assert result["error"] == "" and result["samples"] == len(RECORDS)
        assert set(result["metrics"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert dense["achieved_keep"] == 1.0 and compressed["achieved_keep"] < 0.5


def test_a_failed_task_is_reported_and_exits_1(setup, capsys, tmp_path):
    model_dir, _, task_dir, _ = setup
    output = tmp_path / "result.json"
    argv = ["eval", model_dir, "--tasks", "tiny_mc,missing_mc", "--include-path", task_dir, "--json", output]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 1
    lines = out.strip().splitlines()
    assert (
        f"task missing_mc failed on dense: unknown task 'missing_mc': not in lm-eval's registry or {task_dir}"
        in lines
    )
    summary = json.loads(output.read_text())
    assert summary["failed"] == [lines[-2]]
    (row,) = summary["rows"]
    assert row["perplexity"] == {}  # tasks alone: no default text
    assert row["tasks"]["tiny_mc"]["error"] == "" and row["tasks"]["missing_mc"]["metrics"] == {}
    assert "failed" in lines[3]  # the table's cell, not a blank


def test_bad_task_options_are_one_line_errors(setup, capsys, tmp_path):
    model_dir, _, task_dir, _ = setup
    code, _, err = run_cli(capsys, "eval", model_dir, "--tasks", "x", "--include-path", tmp_path / "none")
    assert (
        code == 2
        and err.strip() == f"svdmlp eval: error: --include-path {tmp_path / 'none'} is not a directory"
    )
    with pytest.raises(SystemExit) as exit_info:  # a usage error, before the model loads
        run_cli(capsys, "eval", model_dir, "--tasks", "tiny_mc", "--include-path", task_dir, "--limit", "0")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.strip().endswith("svdmlp eval: error: argument --limit: expected an integer >= 1, got 0")


def test_eval_checkpoint_against_its_dense_base(compressed, capsys):
    model_dir, text, ckpt = compressed
    code, out, err = run_cli(capsys, "eval", ckpt, "--text", text, *EVAL, "--json", "-")
    assert code == 0
    lines = err.strip().splitlines()
    assert (
        "token-level perplexity: non-overlapping 32-token windows (first 2), no BOS, float32 on cpu" in lines
    )
    assert "compressed / dense perplexity:" in err
    summary = json.loads(out)
    assert isinstance(summary["perplexity"], float) and math.isfinite(summary["perplexity"])
    assert summary["perplexity"] > 1
    assert summary["text"] == str(text)
    dense, compressed_row = summary["rows"]
    assert dense["kind"] == "dense" and dense["model"] == str(model_dir)
    assert compressed_row["kind"] == "compressed (whiten keep 0.5)" and compressed_row["model"] == str(ckpt)
    assert summary["perplexity"] == compressed_row["perplexity"][str(text)]
    assert compressed_row["params"]["total"] == 81216 and dense["params"]["total"] == 102720
    assert dense["params"]["mlp"] - compressed_row["params"]["mlp"] == 102720 - 81216
    assert compressed_row["achieved_keep"] == pytest.approx(15360 / 36864)


def test_eval_dense_model(compressed, capsys):
    model_dir, text, _ = compressed
    code, out, _ = run_cli(capsys, "eval", model_dir, "--text", text, *EVAL, "--json", "-")
    assert code == 0
    summary = json.loads(out)
    assert [row["kind"] for row in summary["rows"]] == ["dense"]
    assert isinstance(summary["perplexity"], float) and math.isfinite(summary["perplexity"])


def test_eval_dense_model_quantized(compressed, capsys):
    model_dir, text, ckpt = compressed
    code, out, err = run_cli(
        capsys, "eval", model_dir, "--text", text, *EVAL, "--quantize", "int4", "--json", "-"
    )
    assert code == 0 and "quantized / dense perplexity:" in err
    dense, quantized = json.loads(out)["rows"]
    assert quantized["kind"] == "dense, MLP int4 RTN"
    info = quantized["quantization"]
    # hidden 64, inter 96, 2 layers: 6 matrices of 6144 weights at 4 bits, one fp16 scale per row
    # (one group of 128 covers 64 or 96 inputs).
    assert (
        info["mlp_bytes"] == 6 * 6144 // 2 + 2 * 2 * (96 + 96 + 64) and info["mlp_bytes_bf16"] == 6 * 6144 * 2
    )
    assert quantized["perplexity"][str(text)] != dense["perplexity"][str(text)]
    code, out, err = run_cli(capsys, "eval", ckpt, "--text", text, *EVAL, "--quantize", "int8", "--json", "-")
    assert code == 0 and "compressed / dense perplexity:" in err
    base, factors = json.loads(out)["rows"]
    assert factors["kind"] == "compressed (whiten keep 0.5, MLP int8 RTN)" and "quantization" not in base
    # int8 halves the bf16 bytes of every factor, plus one fp16 scale per output of each (rank 8 here:
    # a scale per 8 weights of the expands).
    assert factors["quantization"]["mlp_bytes"] < 0.6 * factors["quantization"]["mlp_bytes_bf16"]


def test_eval_dense_model_rounded_by_gptq(compressed, capsys):
    model_dir, text, ckpt = compressed
    calib = ["--calib", text, "--calib-samples", "4", "--calib-seq-len", "32"]
    argv = ["eval", model_dir, "--text", text, *EVAL, "--quantize", "int4", *calib, "--json", "-"]
    code, out, _ = run_cli(capsys, *argv, "--gptq")
    assert code == 0
    dense, gptq = json.loads(out)["rows"]
    assert gptq["kind"] == "dense, MLP int4 GPTQ" and gptq["quantization"]["method"] == "gptq"
    assert gptq["quantization"]["calibration_tokens"] == 4 * 32
    code, out, _ = run_cli(capsys, *argv)
    _, rtn = json.loads(out)["rows"]
    assert gptq["quantization"]["mlp_bytes"] == rtn["quantization"]["mlp_bytes"]
    assert gptq["perplexity"] != rtn["perplexity"]
    assert_cli_error(capsys, "eval", ["eval", model_dir, "--gptq"], "give --quantize SCHEME")
    assert_cli_error(capsys, "eval", ["eval", ckpt, "--quantize", "int4", "--gptq"], "svdmlp quantize")


def test_eval_dense_model_rounded_with_a_low_rank_correction(compressed, capsys):
    model_dir, text, _ = compressed
    calib = ["--calib", text, "--calib-samples", "4", "--calib-seq-len", "32"]
    argv = [
        "eval",
        model_dir,
        "--text",
        text,
        *EVAL,
        "--quantize",
        "int3g16",
        "--gptq",
        *calib,
        "--json",
        "-",
    ]
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    _, plain = json.loads(out)["rows"]
    code, out, err = run_cli(capsys, *argv, "--correction-keep", "0.25")
    assert code == 0, err
    _, fixed = json.loads(out)["rows"]
    assert fixed["kind"] == "dense, MLP int3g16 GPTQ + correction 0.25"
    info = fixed["quantization"]
    assert info["bits"] == 3 and info["correction_keep"] == 0.25 and info["correction_params"] > 0
    assert info["mlp_bytes"] == plain["quantization"]["mlp_bytes"] + 2 * info["correction_params"]
    code, out, err = run_cli(capsys, *argv, "--correction-keep", "0.25", "--factor-bits", "8")
    assert code == 0, err
    _, int8 = json.loads(out)["rows"]
    assert int8["kind"] == "dense, MLP int3g16 GPTQ + correction 0.25 (int8)"
    assert int8["quantization"]["correction_bits"] == 8
    # hidden 64, inter 96: rank round(0.25·64·96 / (160·8))·8 = 8 at --align 8; at the default 32, the
    # rank rule's floor, one block of 32
    code, out, _ = run_cli(capsys, *argv, "--correction-keep", "0.25", "--align", "8")
    _, aligned = json.loads(out)["rows"]
    assert aligned["quantization"]["correction_params"] == 2 * 3 * 8 * 160
    assert info["correction_params"] == 2 * 3 * 32 * 160
    # a byte per parameter and an fp16 scale per row of each factor: less than bf16, more than half of it
    added = int8["quantization"]["mlp_bytes"] - plain["quantization"]["mlp_bytes"]
    assert info["correction_params"] < added < 2 * info["correction_params"]
    assert_cli_error(
        capsys,
        "eval",
        ["eval", model_dir, "--quantize", "int4", "--factor-bits", "8"],
        "give --correction-keep",
    )
    assert_cli_error(
        capsys, "eval", ["eval", model_dir, "--quantize", "int3", "--correction-keep", "0.1"], "--gptq"
    )
    assert_cli_error(capsys, "eval", ["eval", model_dir, "--quantize", "int9"], "unknown quantization 'int9'")


def test_eval_no_baseline(compressed, capsys):
    _, text, ckpt = compressed
    code, out, _ = run_cli(capsys, "eval", ckpt, "--text", text, *EVAL, "--no-baseline", "--json", "-")
    assert code == 0
    summary = json.loads(out)
    assert [row["kind"] for row in summary["rows"]] == ["compressed (whiten keep 0.5)"]


def test_eval_of_a_truncated_checkpoint(compressed, tmp_path, capsys):
    _, text, ckpt = compressed
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    weights = broken / "model-00002-of-00005.safetensors"  # the first decoder layer
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_cli_error(capsys, "eval", ["eval", broken, "--text", text, *EVAL], "truncated")
    assert_cli_error(capsys, "generate", ["generate", broken, "--prompt", "x"], "truncated")


def test_eval_input_errors(compressed, tmp_path, capsys):
    _, text, ckpt = compressed
    assert_cli_error(
        capsys,
        "eval",
        ["eval", ckpt, "--dataset", "bogus", *EVAL],
        "unknown perplexity set 'bogus'; expected one of ['c4', 'ptb', 'wikitext2']",
    )
    assert_cli_error(capsys, "eval", ["eval", ckpt, "--text", tmp_path / "none.txt"], "does not exist")
    assert_cli_error(
        capsys,
        "eval",
        ["eval", ckpt, "--text", text, "--data-files", "oops"],
        "--data-files expects SET=PATH",
    )


def test_each_row_scores_its_own_model(compressed, capsys):
    """The compressed row is the checkpoint's perplexity and the dense row its base model's, each as a
    plain loop over the same windows gives it (the two differ, so swapping them cannot go unseen)."""
    from svdmlp import checkpoint, models
    from svdmlp.evaluate import perplexity

    model_dir, text, ckpt = compressed
    code, out, _ = run_cli(capsys, "eval", ckpt, "--text", text, *EVAL, "--json", "-")
    assert code == 0
    dense_row, compressed_row = json.loads(out)["rows"]

    def plain(model, tokenizer) -> float:
        windows = perplexity.text_windows(tokenizer, text.read_text(), 32, max_windows=2)
        return perplexity.perplexity(model, windows, progress=False).perplexity

    expected_compressed = plain(*checkpoint.load(ckpt, dtype=torch.float32))
    expected_dense = plain(*models.load_dense(str(model_dir))[:2])
    assert compressed_row["perplexity"][str(text)] == pytest.approx(expected_compressed, rel=1e-6)
    assert dense_row["perplexity"][str(text)] == pytest.approx(expected_dense, rel=1e-6)
    assert abs(expected_compressed / expected_dense - 1) > 100 * 1e-6  # far outside the tolerance above


def test_a_relative_base_path_is_recorded_absolute_and_an_old_relative_one_refused(
    compressed, tmp_path, capsys, monkeypatch
):
    """The audit's case: compressed from A against ./dense, scored from B, where another ./dense lies."""
    model_dir, _, ckpt = compressed
    for folder in ("A", "B"):
        shutil.copytree(model_dir, tmp_path / folder / "dense")
    monkeypatch.chdir(tmp_path / "A")
    copy = shutil.copytree(ckpt, tmp_path / "A" / "ck")
    from svdmlp import checkpoint, models

    model, tokenizer = checkpoint.load(copy)
    metadata = checkpoint.read_metadata(copy)
    from svdmlp.compression.report import CompressionReport
    from svdmlp.config import CompressConfig

    config, report = (
        CompressConfig.from_dict(metadata["config"]),
        CompressionReport.from_dict(metadata["report"]),
    )
    checkpoint.save(copy, model, tokenizer, config, report, "dense", overwrite=True)
    assert checkpoint.read_metadata(copy)["base_model"] == str(tmp_path / "A" / "dense")
    assert models.recorded_name("smollm2-135m") == "smollm2-135m"
    assert models.recorded_name("org/not-here") == "org/not-here"

    edit_metadata(
        copy, lambda m: m.update(base_model="dense")
    )  # as svdmlp wrote it before: the path as given
    monkeypatch.chdir(tmp_path / "B")
    line = assert_cli_error(capsys, "eval", ["eval", copy, "--max-windows", 1], "relative path 'dense'")
    assert "--no-baseline" in line
