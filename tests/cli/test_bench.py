"""``svdmlp bench kernel --quick`` end to end on CPU: table printed, JSON schema, PNG written."""

import json

from svdmlp.cli import main

ROW_FIELDS = {
    "model", "hidden", "intermediate", "m", "keep", "ranks", "achieved_keep", "dtype", "align", "graph",
    "bytes", "flops", "floor_s", "time_s", "pct_of_floor", "speedup", "check", "errors",
}  # fmt: skip


def test_quick_cpu_run_writes_table_json_and_png(tmp_path, capsys):
    json_path, png_path = tmp_path / "kernel.json", tmp_path / "plots" / "kernel.png"
    argv = [
        "bench",
        "kernel",
        "--quick",
        "--device",
        "cpu",
        "--json",
        str(json_path),
        "--plot",
        str(png_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "needs a CUDA GPU" in out
    assert "µs dense" in out and "unfused over dense: mean" in out

    report = json.loads(json_path.read_text())
    assert report["schema"] == "svdmlp-bench-kernel/1"
    assert {"torch", "triton", "svdmlp"} <= set(report["environment"]["versions"])
    assert report["environment"]["device"]["type"] == "cpu" and report["environment"]["timestamp"]
    assert report["ceilings"]["copy_bandwidth"] > 0 and report["ceilings"]["matmul_flops"] > 0
    assert report["rows"] and all(ROW_FIELDS <= set(row) for row in report["rows"])
    row = report["rows"][0]
    assert row["time_s"]["fused"] is None and row["time_s"]["dense"] > 0
    assert row["floor_s"]["dense"] > row["floor_s"]["lowrank"] > 0
    assert set(report["summary"]) == {"0.8"}
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
