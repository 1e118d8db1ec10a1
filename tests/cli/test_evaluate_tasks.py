"""``svdmlp eval`` with perplexity texts and lm-eval tasks: one table, deltas, a stable JSON record."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_checkpoint
from svdmlp.cli import main
from svdmlp.evaluate import harness, tasks

pytest.importorskip("lm_eval")

RECORDS = [
    {"question": "the quick fox", "choices": ["jumps over", "sleeps"], "label": 0},
    {"question": "the lazy dog", "choices": ["walks", "sings over the far hill"], "label": 1},
    {"question": "the brave king", "choices": ["speaks", "runs", "falls"], "label": 2},
]
EVAL = ["--seq-len", "32", "--max-windows", "2"]
TOP_KEYS = {
    "calibration",
    "failed",
    "keep_definition",
    "perplexity",
    "protocol",
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
def cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    local = harness._task_manager.__wrapped__  # lm-eval's own 15 s index is not needed here
    monkeypatch.setattr(harness, "_task_manager", lambda factory, path, defaults: local(factory, path, False))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_checkpoint_and_base_on_text_and_task(setup, capsys, tmp_path):
    model_dir, text, task_dir, ckpt = setup
    output = tmp_path / "result.json"
    argv = ["eval", ckpt, "--text", text, *EVAL, "--tasks", "tiny_mc", "--include-path", task_dir]
    code, out, _ = run(capsys, *argv, "--json", output)
    assert code == 0
    header = out.splitlines()[1]
    assert "tiny_mc acc" in header and "tiny_mc acc_norm" in header
    assert "compressed / dense perplexity:" in out and "compressed - dense accuracy: tiny_mc acc " in out
    assert out.strip().splitlines()[-1] == f"wrote {output}"
    summary = json.loads(output.read_text())
    assert set(summary) == TOP_KEYS
    code, printed, _ = run(capsys, *argv, "--json", "-")  # the same record on standard output
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
    }
    assert set(summary["versions"]) == {"svdmlp", "torch", "transformers", "lm_eval"}
    assert set(summary["calibration"]) == {"tokens", "sha256"} and summary["calibration"]["tokens"] == 128
    dense, compressed = summary["rows"]
    for row in (dense, compressed):
        assert set(row) == {
            "model",
            "kind",
            "params",
            "mlp_params",
            "achieved_keep",
            "perplexity",
            "tasks",
        } | ({"compress_seconds"} if row is compressed else set())
        result = row["tasks"]["tiny_mc"]
        assert result["error"] == "" and result["samples"] == len(RECORDS)
        assert set(result["metrics"]) == {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"}
    assert dense["achieved_keep"] == 1.0 and compressed["achieved_keep"] < 0.5


def test_a_failed_task_is_reported_and_exits_1(setup, capsys, tmp_path):
    model_dir, _, task_dir, _ = setup
    output = tmp_path / "result.json"
    argv = ["eval", model_dir, "--tasks", "tiny_mc,missing_mc", "--include-path", task_dir, "--json", output]
    code, out, _ = run(capsys, *argv)
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
    code, _, err = run(capsys, "eval", model_dir, "--tasks", "x", "--include-path", tmp_path / "none")
    assert (
        code == 2
        and err.strip() == f"svdmlp eval: error: --include-path {tmp_path / 'none'} is not a directory"
    )
    code, _, err = run(
        capsys, "eval", model_dir, "--tasks", "tiny_mc", "--include-path", task_dir, "--limit", "0"
    )
    assert code == 2 and err.strip() == "svdmlp eval: error: limit must be >= 1, got 0"
