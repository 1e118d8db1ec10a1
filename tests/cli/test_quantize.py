"""``svdmlp quantize``: a checkpoint's float factors stored int8/int4 in a new checkpoint, calibrated on
the windows it was compressed with; the source checkpoint untouched, bad input refused before any work."""

from __future__ import annotations

import json

from conftest import assert_cli_error, run_cli
from svdmlp import checkpoint


def test_quantize_writes_a_checkpoint_with_calibrated_int4_factors(compressed, tmp_path, capsys):
    _, text, ckpt = compressed
    before = (ckpt / "svdmlp.json").read_text()
    out = tmp_path / "int4"
    code, stdout, _ = run_cli(capsys, "quantize", ckpt, "--factor-bits", "4", "--out", out, "--json", "-")
    assert code == 0
    record = json.loads(stdout)
    quantization = record["quantization"]
    assert quantization["method"] == "gptq+refit" and quantization["scheme"] == "int4"
    assert quantization["output_error_mean"] < quantization["rtn_error_mean"]
    metadata = checkpoint.read_metadata(out)
    assert metadata["config"]["factor_bits"] == 4 and metadata["report"]["quantization"] == quantization
    assert (ckpt / "svdmlp.json").read_text() == before  # the source is left as it was
    evaluate = ["--text", text, "--seq-len", "16", "--max-windows", "2", "--no-baseline", "--json", "-"]
    code, stdout, _ = run_cli(capsys, "eval", out, *evaluate)
    assert code == 0 and json.loads(stdout)["rows"][0]["kind"].endswith(", factors int4)")

    assert_cli_error(
        capsys,
        "quantize",
        ["quantize", out, "--factor-bits", "8", "--out", tmp_path / "again"],
        "already stores",
    )
    assert_cli_error(
        capsys,
        "quantize",
        ["quantize", ckpt, "--factor-bits", "8", "--out", out],
        "already holds an svdmlp checkpoint",
    )
    assert not (tmp_path / "again").exists()
