"""The ``svdmlp`` command in-process: the happy paths print what they promise, bad input exits 2 with
one clear line on stderr and no traceback."""

from __future__ import annotations

import argparse
import json
import math
import shutil

import huggingface_hub.constants
import pytest
import torch
from transformers import AutoModelForCausalLM, BertConfig, GPT2Config

from conftest import tiny_checkpoint
from svdmlp import checkpoint
from svdmlp.cli import build_parser, main

TINY = ["--align", "8", "--calib-samples", "4", "--calib-seq-len", "32"]
EVAL = ["--seq-len", "32", "--max-windows", "2"]


@pytest.fixture(autouse=True, scope="module")
def _cpu_defaults():
    """The same defaults (CPU, float32) on every machine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        yield


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_error(capsys, command: str, argv, *phrases: str) -> str:
    """Run ``argv``; expect exit 2 and exactly one stderr line ``svdmlp COMMAND: error: ...``."""
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"svdmlp {command}: error: "), line
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in line, (phrase, line)
    return line


def snapshot(directory) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(directory)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def offline(monkeypatch):
    """Make sure no hub request leaves the machine (huggingface_hub reads the env var at import)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def compressed(tmp_path_factory, tokenizer):
    """``svdmlp compress`` run once on a tiny Llama directory: (model_dir, text_file, checkpoint)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("cli"), tokenizer)


def test_compress_prints_layer_table_and_summary(compressed, tmp_path, capsys):
    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    code, out, _ = run(
        capsys, "compress", model_dir, "--keep", "0.5", "--calib", text, *TINY, "--out", out_dir
    )
    assert code == 0
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
    metadata = checkpoint.read_metadata(out_dir)
    assert metadata["dtype"] == "bfloat16"  # --save-dtype default
    assert metadata["base_model"] == str(model_dir)
    assert metadata["config"]["calibration"] == {"source": str(text), "num_samples": 4, "seq_len": 32}


def test_compress_allocate_says_why_each_layer_got_its_rank(compressed, tmp_path, capsys):
    model_dir, text, _ = compressed
    out_dir = tmp_path / "out"
    code, out, _ = run(
        capsys, "compress", model_dir, "--keep", "0.5", "--allocate", "--calib", text, *TINY, "--out", out_dir
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].endswith("KL alone (nats/token) -> predicted")
    assert " at rank 16 -> " in lines[2] and " at rank 16 -> " in lines[3]  # the rank rule at 0.5
    assert "allocation " in out.splitlines()[-1]  # its own phase in the wall time
    report = checkpoint.read_metadata(out_dir)["report"]
    assert [layer["index"] for layer in report["allocation"]["layers"]] == [0, 1]


def test_compress_overwrite(compressed, tmp_path, capsys):
    model_dir, text, ckpt = compressed
    out_dir = tmp_path / "ckpt"
    shutil.copytree(ckpt, out_dir)
    before = snapshot(out_dir)
    argv = ["compress", model_dir, "--keep", "0.25", "--calib", text, *TINY, "--out", out_dir]
    assert_error(capsys, "compress", argv, "already holds an svdmlp checkpoint", "--overwrite")
    assert snapshot(out_dir) == before
    code, _, _ = run(capsys, *argv, "--overwrite")
    assert code == 0
    assert checkpoint.read_metadata(out_dir)["config"]["keep"] == 0.25
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_info(compressed, capsys):
    _, text, ckpt = compressed
    code, out, _ = run(capsys, "info", ckpt)
    assert code == 0
    assert out.startswith(f"checkpoint {ckpt}: llama from ")
    assert "method whiten, keep 0.5, align 8, targets ['gate', 'up', 'down']" in out
    assert "16/16/16" in out and "achieved keep 0.4167" in out

    code, out, err = run(capsys, "info", ckpt, "--json", "-")
    assert code == 0
    assert json.loads(out) == checkpoint.read_metadata(ckpt)  # standard output holds the JSON alone
    assert err.startswith(f"checkpoint {ckpt}: llama from ")  # the report moved to standard error


def test_eval_checkpoint_against_its_dense_base(compressed, capsys):
    model_dir, text, ckpt = compressed
    code, out, err = run(capsys, "eval", ckpt, "--text", text, *EVAL, "--json", "-")
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
    assert compressed_row["params"] == 81216 and dense["params"] == 102720
    assert compressed_row["achieved_keep"] == pytest.approx(15360 / 36864)


def test_eval_dense_model(compressed, capsys):
    model_dir, text, _ = compressed
    code, out, _ = run(capsys, "eval", model_dir, "--text", text, *EVAL, "--json", "-")
    assert code == 0
    summary = json.loads(out)
    assert [row["kind"] for row in summary["rows"]] == ["dense"]
    assert isinstance(summary["perplexity"], float) and math.isfinite(summary["perplexity"])


def test_eval_no_baseline(compressed, capsys):
    _, text, ckpt = compressed
    code, out, _ = run(capsys, "eval", ckpt, "--text", text, *EVAL, "--no-baseline", "--json", "-")
    assert code == 0
    summary = json.loads(out)
    assert [row["kind"] for row in summary["rows"]] == ["compressed (whiten keep 0.5)"]


def test_generate_is_greedy_and_repeatable(compressed, capsys):
    _, _, ckpt = compressed
    code, first, _ = run(capsys, "generate", ckpt, "--prompt", "the quick", "--max-new-tokens", "5")
    assert code == 0
    code, second, _ = run(capsys, "generate", ckpt, "--prompt", "the quick", "--max-new-tokens", "5")
    assert code == 0 and first == second and first.endswith("\n")


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    names = sorted(commands.choices)
    assert {"compress", "eval", "generate", "info", "plan", "bench"} <= set(names)
    argvs = [[name] for name in names]
    for name, sub in commands.choices.items():  # nested commands, e.g. bench kernel
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                argvs += [[name, nested] for nested in action.choices]
    for argv in argvs:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith(f"usage: svdmlp {' '.join(argv)}"), argv


def test_argparse_errors_exit_2(capsys):
    for argv in (["compress", "--keep", "half", "--out", "x"], ["compress", "m"], ["nope"], []):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert "usage: svdmlp" in capsys.readouterr().err


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "phrases"),
    [
        (["--keep", "1.5"], ["keep must be in (0, 1]", "got 1.5"]),
        (["--keep", "0"], ["keep must be in (0, 1]", "got 0.0"]),
        (["--keep", "0.5", "--align", "0"], ["align must be an integer >= 1, got 0"]),
        (["--keep", "0.5", "--align", "64"], ["align 64 leaves no room for a rank", "use a smaller align"]),
        (["--keep", "0.5", "--calib-samples", "0"], ["num_samples must be >= 1"]),
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
    assert_error(capsys, "compress", argv, *phrases)
    assert not out_dir.exists()


def test_missing_model_directory(compressed, tmp_path, capsys):
    _, text, _ = compressed
    missing = tmp_path / "no-such-model"
    argv = ["compress", missing, "--calib", text, "--out", tmp_path / "out"]
    assert_error(capsys, "compress", argv, f"model directory {missing} does not exist")
    assert_error(capsys, "generate", ["generate", missing, "--prompt", "x"], "does not exist")


def test_directory_that_is_not_a_model(compressed, tmp_path, capsys):
    _, text, _ = compressed
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "readme.txt").write_text("not a model")
    argv = ["compress", folder, "--calib", text, "--out", tmp_path / "out"]
    assert_error(capsys, "compress", argv, f"{folder} is not a Hugging Face model directory (no config.json)")


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
    assert_error(
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
        assert_error(capsys, "compress", argv, f"{out_dir} exists and is not an svdmlp checkpoint")
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
        assert_error(capsys, "compress", argv, phrase)
        assert not (tmp_path / "out").exists()


def test_nan_weights(compressed, tokenizer, tmp_path, capsys):
    model_dir, text, _ = compressed
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 5] = float("nan")
    model.save_pretrained(tmp_path / "nan-model")
    tokenizer.save_pretrained(tmp_path / "nan-model")
    argv = ["compress", tmp_path / "nan-model", "--calib", text, *TINY, "--out", tmp_path / "out"]
    assert_error(capsys, "compress", argv, "model.layers.1.mlp.up_proj has NaN or inf weights")
    assert not (tmp_path / "out").exists()


def test_eval_of_a_truncated_checkpoint(compressed, tmp_path, capsys):
    _, text, ckpt = compressed
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert_error(capsys, "eval", ["eval", broken, "--text", text, *EVAL], "truncated")
    assert_error(capsys, "generate", ["generate", broken, "--prompt", "x"], "truncated")


def test_info_of_something_that_is_not_a_checkpoint(compressed, tmp_path, capsys):
    model_dir, _, _ = compressed
    assert_error(capsys, "info", ["info", model_dir], "is not an svdmlp checkpoint (no svdmlp.json)")
    assert_error(capsys, "info", ["info", tmp_path / "nothing"], "does not exist")


def test_eval_input_errors(compressed, tmp_path, capsys):
    _, text, ckpt = compressed
    assert_error(
        capsys,
        "eval",
        ["eval", ckpt, "--dataset", "bogus", *EVAL],
        "unknown perplexity set 'bogus'; expected one of ['c4', 'ptb', 'wikitext2']",
    )
    assert_error(capsys, "eval", ["eval", ckpt, "--text", tmp_path / "none.txt"], "does not exist")
    assert_error(
        capsys,
        "eval",
        ["eval", ckpt, "--text", text, "--data-files", "oops"],
        "--data-files expects SET=PATH",
    )


def test_generate_input_errors(compressed, capsys):
    _, _, ckpt = compressed
    assert_error(
        capsys,
        "generate",
        ["generate", ckpt, "--prompt", "x", "--max-new-tokens", "0"],
        "--max-new-tokens must be >= 1, got 0",
    )
    assert_error(
        capsys,
        "generate",
        ["generate", ckpt, "--prompt", "x", "--temperature", "-1"],
        "--temperature must be >= 0",
    )
    assert_error(
        capsys, "generate", ["generate", ckpt, "--prompt", "x", "--chat"], "tokenizer has no chat template"
    )


def test_hub_id_while_offline(compressed, offline, tmp_path, capsys):
    _, text, _ = compressed
    for command, argv in (
        ("generate", ["generate", "someone/no-such-model", "--prompt", "x"]),
        ("eval", ["eval", "someone/no-such-model", "--text", text]),
        ("compress", ["compress", "someone/no-such-model", "--calib", text, "--out", tmp_path / "out"]),
    ):
        assert_error(
            capsys,
            command,
            argv,
            "could not load model 'someone/no-such-model': it is not a local directory and the Hugging Face hub could not provide it",
        )


def test_triton_backend_on_cpu_without_interpreter(compressed, monkeypatch, capsys):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, _, ckpt = compressed
    assert_error(
        capsys,
        "generate",
        ["generate", ckpt, "--prompt", "x", "--backend", "triton"],
        "backend 'triton' is unavailable: Triton kernels need a CUDA device",
    )


def test_cuda_device_without_a_gpu(compressed, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _, _, ckpt = compressed
    assert_error(
        capsys,
        "generate",
        ["generate", ckpt, "--prompt", "x", "--device", "cuda"],
        "--device cuda was asked for but no CUDA GPU is available",
    )
