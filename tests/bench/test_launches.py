"""``bench launches`` on a CPU (the kernels interpreted): rows streamed as measured, predictions beside
each launch."""

from __future__ import annotations

import json

import pytest

from svdmlp.cli import main


@pytest.fixture
def tiny_shape(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    config = {"hidden_size": 96, "intermediate_size": 200, "num_hidden_layers": 1, "model_type": "llama"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_each_launch_is_timed_beside_its_prediction(tiny_shape, tmp_path, capsys):
    stream, record = tmp_path / "rows.jsonl", tmp_path / "launches.json"
    argv = ["bench", "launches", "--models", str(tiny_shape), "--tokens", "1,40", "--align", "16"]
    argv += ["--repeats", "1", "--device", "cpu", "--jsonl", str(stream), "--json", str(record)]
    assert main(argv) == 0
    assert "compile pre-pass" in capsys.readouterr().out
    lines = [json.loads(line) for line in stream.read_text().splitlines()]
    assert "compile_s" in lines[0] and [row["m"] for row in lines[1:]] == [1, 40]
    decode, batch = json.loads(record.read_text())["rows"]
    assert [launch["kernel"] for launch in decode["launches"]] == ["matmul", "gated_expand+down", "matmul"]
    assert batch["launches"][0]["kernel"] == "cublas"  # the shrink above decode is a library GEMM
    for row in (decode, batch):
        assert row["check"]["ok"]
        for launch in row["launches"]:
            assert launch["measured_s"] > 0 and launch["predicted_s"] > 0
