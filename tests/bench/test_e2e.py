"""``bench e2e`` on a tiny local model: every row present, the JSON and PNG written, bad input refused."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_model
from svdmlp.bench import e2e
from svdmlp.bench.ceilings import Ceilings
from svdmlp.cli import main


def test_e2e_writes_table_json_and_plot(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out_json, out_png = tmp_path / "e2e.json", tmp_path / "e2e.png"
    argv = [
        "bench",
        "e2e",
        str(model_dir),
        "--keep",
        "0.6",
        "--batch",
        "1,3",
        "--align",
        "8",
        "--price",
        "3.6",
    ]
    argv += ["--prompt-len", "8", "--new-tokens", "4", "--repeats", "1"]
    assert main([*argv, "--json", str(out_json), "--plot", str(out_png)]) == 0
    out = capsys.readouterr().out
    assert "decode ms/step" in out and "keep 0.6 batch 1: decode" in out
    report = json.loads(out_json.read_text())
    assert report["schema"] == "svdmlp-bench-e2e/1"
    rows = {(row["variant"], row["batch"]): row for row in report["rows"]}
    assert set(rows) == {("dense", 1), ("dense", 3), ("keep 0.6", 1), ("keep 0.6", 3)}
    assert rows[("keep 0.6", 1)]["weight_bytes"] < rows[("dense", 1)]["weight_bytes"]
    assert rows[("dense", 1)]["speedup_vs_dense"] == 1.0
    assert "hf_decode_s_per_step" in rows[("dense", 1)] and "hf_decode_s_per_step" not in rows[("dense", 3)]
    assert out_png.stat().st_size > 0
    dense = rows[("dense", 1)]
    assert dense["dollars_per_million_tokens"] == pytest.approx(dense["decode_s_per_step"] * 1e6 / 1e3)
    assert dense["joules_per_token"] is None and "CUDA" in dense["energy_note"] and "$/Mtok" in out
    assert report["backend_choices"] == []  # the PyTorch backend on a CPU measures nothing


def test_the_backends_choices_are_recorded_and_logged(monkeypatch):
    from svdmlp.backends import choice

    monkeypatch.setattr(choice, "_CHOICES", {("gated_mlp", "cuda:0", torch.bfloat16, 16): "fused"})
    monkeypatch.setattr(e2e, "measure_ceilings", lambda *a: Ceilings(1e9, 1e9, 1, 1, "float32"))
    monkeypatch.setattr(e2e, "measure_model", lambda *a: [])
    lines = []
    config = e2e.E2EConfig(
        torch.device("cpu"), (None,), (0.8,), (1,), 8, 2, 1, torch.float32, 8, "torch", hf_baseline=False
    )
    report = e2e.run(config, lines.append)
    assert report["backend_choices"] == [
        {"key": ["gated_mlp", "cuda:0", "torch.bfloat16", "16"], "path": "fused"}
    ]
    assert any("backend ran the fused path for gated_mlp" in line for line in lines)


def test_factor_bits_put_quantized_variants_beside_float_ones(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out_json = tmp_path / "e2e.json"
    argv = ["bench", "e2e", str(model_dir), "--keep", "0.5", "--batch", "1", "--align", "16", "--no-hf"]
    argv += ["--factor-bits", "16,8,4", "--dtype", "bfloat16", "--prompt-len", "8", "--new-tokens", "3"]
    assert main([*argv, "--repeats", "1", "--json", str(out_json)]) == 0
    rows = {row["variant"]: row for row in json.loads(out_json.read_text())["rows"]}
    assert list(rows) == ["dense", "keep 0.5", "keep 0.5 int8", "keep 0.5 int4"]
    float_bytes, int8_bytes, int4_bytes = (rows[v]["weight_bytes"] for v in list(rows)[1:])
    assert int4_bytes < int8_bytes < float_bytes < rows["dense"]["weight_bytes"]
    assert json.loads(out_json.read_text())["config"]["factor_bits"] == [16, 8, 4]
    capsys.readouterr()
    assert main(["bench", "e2e", str(model_dir), "--device", "cpu", "--factor-bits", "3"]) == 2
    assert "factor bits must be one of [4, 8, 16], got 3" in capsys.readouterr().err


def test_quantized_variants_run_beside_dense_at_their_bytes(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out_json = tmp_path / "e2e.json"
    argv = ["bench", "e2e", str(model_dir), "--keep", "0.5", "--batch", "1", "--align", "16", "--no-hf"]
    argv += [
        "--quantize",
        "int8,int4,int4+0.25,int4-asym+0.25-int8",
        "--dtype",
        "bfloat16",
        "--prompt-len",
        "8",
    ]
    assert main([*argv, "--new-tokens", "3", "--repeats", "1", "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    rows = {row["variant"]: row for row in report["rows"]}
    assert list(rows) == [
        "dense",
        "keep 0.5",
        "dense int8",
        "dense int4",
        "dense int4+0.25",
        "dense int4-asym+0.25-int8",
    ]
    assert (
        rows["dense int4"]["weight_bytes"]
        < rows["dense int8"]["weight_bytes"]
        < rows["dense"]["weight_bytes"]
    )
    # hidden 64, inter 96: the correction's rank round(0.25·64·96 / (160·16))·16 = 16 for each projection,
    # (64 + 96)·16 bf16 parameters each, three projections a layer
    layers = len(tiny_model("llama").model.layers)
    extra = rows["dense int4+0.25"]["weight_bytes"] - rows["dense int4"]["weight_bytes"]
    assert rows["dense int4+0.25"]["ranks"] == {"gate": 16, "up": 16, "down": 16}
    assert extra == layers * 3 * (64 + 96) * 16 * 2
    # int4-asym's zero points (a byte per row: one group) and the int8 correction's factors, u (16 × in)
    # and v (out × 16), a byte a value and an fp16 scale a row
    asym = rows["dense int4-asym+0.25-int8"]["weight_bytes"] - rows["dense int4"]["weight_bytes"]
    gate = 96 + (16 * 64 + 16 * 2) + (96 * 16 + 96 * 2)
    down = 64 + (16 * 96 + 16 * 2) + (64 * 16 + 64 * 2)
    assert asym == layers * (2 * gate + down)
    assert report["config"]["quantized"] == ["int8", "int4", "int4+0.25", "int4-asym+0.25-int8"]
    assert "dense int4+0.25 batch 1: decode" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("int3", "the scheme must be one of int8, int4, int4-asym"),
        ("int4-asym-gptq", "the scheme must be one of int8, int4, int4-asym"),
        ("int4+x", "the correction is KEEP, a number in (0, 1]"),
        ("int4+1.5", "the correction is KEEP, a number in (0, 1]"),
        ("int4+0.1-int3", "or KEEP-int8 or KEEP-int4"),
    ],
)
def test_a_bad_quantized_variant_is_one_line(model_dir, capsys, spec, message):
    assert main(["bench", "e2e", str(model_dir), "--device", "cpu", "--quantize", spec]) == 2
    assert message in capsys.readouterr().err


def test_random_lowrank_has_the_ranks_keep_gives():
    model = tiny_model("gemma2")
    ranks = e2e.install_random_lowrank(model, keep=0.5, align=8, backend="torch")
    # hidden 64, inter 96: r = round(0.5·64·96 / (160·8))·8 = 16 for every projection
    assert ranks == {"gate": 16, "up": 16, "down": 16}
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()


def test_streamed_bytes_skip_an_untied_input_embedding():
    tied, untied = (
        tiny_model("llama", tie_word_embeddings=True),
        tiny_model("llama", tie_word_embeddings=False),
    )
    total = sum(p.numel() * 4 for p in untied.parameters())
    assert e2e.streamed_bytes(untied) == total - untied.get_input_embeddings().weight.numel() * 4
    assert e2e.streamed_bytes(tied) == sum(p.numel() * 4 for p in tied.parameters())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--keep", "1.5"], "keep must be in (0, 1]"),
        (["--batch", "1,65"], "batch sizes must be in [1, 64]"),
        (["--new-tokens", "1"], "new_tokens must be >= 2"),
    ],
)
def test_bad_flags_are_errors(model_dir, capsys, flags, message):
    assert main(["bench", "e2e", str(model_dir), "--device", "cpu", *flags]) == 2
    assert message in capsys.readouterr().err


def test_a_keep_list_that_is_not_numbers_is_a_usage_error(model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "e2e", str(model_dir), "--keep", "a,b"])
    assert exit_info.value.code == 2
    assert "argument --keep: expected a comma-separated list, got 'a,b'" in capsys.readouterr().err


def test_the_compile_mode_reaches_every_engine(model_dir, monkeypatch):
    """``--compile-mode max-autotune`` compiles each engine's step in that mode; the command line offers
    exactly the engine's modes."""
    from svdmlp.cli import build_parser, options
    from svdmlp.engine.engine import COMPILE_MODES

    args = build_parser().parse_args(["bench", "e2e", str(model_dir), "--compile-mode", "max-autotune"])
    assert options.compile_mode(args) == "max-autotune"
    assert options.compile_mode(build_parser().parse_args(["bench", "e2e", "--compile", "m"])) == "default"
    assert options.compile_mode(build_parser().parse_args(["bench", "e2e"])) is None
    assert set(options.COMPILE_MODES) == set(COMPILE_MODES)

    built = []
    monkeypatch.setattr(e2e, "Engine", lambda model, **options: built.append(options))
    config = e2e.E2EConfig(
        models=(str(model_dir),),
        keeps=(0.6,),
        batches=(1,),
        prompt_len=4,
        new_tokens=2,
        repeats=1,
        device=torch.device("cpu"),
        dtype=torch.float32,
        align=8,
        backend="torch",
        hf_baseline=False,
        compile="max-autotune",
    )
    e2e.build_variants(str(model_dir), config, log=lambda line: None)
    assert [(o["compile"], o["compile_mode"]) for o in built] == [(True, "max-autotune")] * 2


def test_an_unknown_compile_mode_is_refused():
    from svdmlp.engine import Engine

    with pytest.raises(ValueError, match="compile_mode must be one of"):
        Engine(tiny_model("llama"), compile=True, compile_mode="fastest")
