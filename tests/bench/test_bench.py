"""The device scripts dry-run on a CPU (DRY_RUN=1: the kernels interpreted, tiny shapes): every step
runs and every file they promise is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _dry_run(script: str, out: Path, model_dir: Path) -> subprocess.CompletedProcess:
    environment = dict(os.environ, OUT=str(out), DRY_RUN="1", PYTHON=sys.executable, E2E_MODEL=str(model_dir))
    return subprocess.run(
        ["bash", f"benchmarks/{script}"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_first_device_script_dry_runs(model_dir, tmp_path):
    result = _dry_run("gpu_first.sh", tmp_path / "out", model_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in ("env.txt", "launches.jsonl", "launches.json", "launches.txt", "e2e.json", "e2e.txt"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name


def test_the_full_device_sweep_dry_runs(model_dir, tmp_path):
    result = _dry_run("gpu_all.sh", tmp_path / "out", model_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with tarfile.open(tmp_path / "out" / "gpu-results.tar.gz") as archive:
        names = set(archive.getnames())
    for name in (
        "kernel/kernel.json",
        "kernel/bench.txt",
        "e2e/e2e.json",
        "e2e/e2e-compiled.json",
        "e2e/e2e-quantized.json",
    ):
        assert name in names, name
    assert (tmp_path / "out" / "kernel-bench.txt").stat().st_size > 0
    with tarfile.open(tmp_path / "out" / "gpu-results.tar.gz") as archive:
        quantized = json.load(archive.extractfile("e2e/e2e-quantized.json"))
    variants = {row["variant"] for row in quantized["rows"]}
    assert {
        "dense int8",
        "dense int4",
        "dense int4+0.05",
        "dense int4-asym+0.05-int8",
        "keep 0.8 int4",
    } <= variants  # the anchors beside SVD


def test_the_decode_step_script_dry_runs(model_dir, tmp_path):
    result = _dry_run("gpu_decode.sh", tmp_path / "out", model_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in (
        "env.txt",
        "e2e-compiled.json",
        "e2e-compiled.txt",
        "decode-profile.json",
        "decode-profile.txt",
        "chain.jsonl",
        "chain.txt",
    ):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    rows = json.loads((tmp_path / "out" / "decode-profile.json").read_text())
    assert [row["variant"] for row in rows] == ["dense (default)", "keep 0.8 (default)"]


def test_the_decode_tile_sweep_dry_runs(tmp_path):
    """benchmarks/decode_tiles.py, both modes: every launch and variant timed and checked, one record each."""
    environment = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT / "src"))
    for mode in ([], ["--chain"]):
        out = tmp_path / f"tiles{len(mode)}.jsonl"
        result = subprocess.run(
            [sys.executable, "benchmarks/decode_tiles.py", "--dry-run", "--jsonl", str(out), *mode],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        records = [json.loads(line) for line in out.read_text().splitlines()]
        if mode:
            assert [r["m"] for r in records] == [1, 16]
            settings = [[v for v in r.values() if isinstance(v, dict)] for r in records]
            assert [len(s) for s in settings] == [5, 5]  # PDL off, on, on with three L2 prefetch shares
            assert all(v["check"]["ok"] for s in settings for v in s)
        else:
            assert [r["launch"] for r in records] == ["shrink", "gated_expand+down", "down_expand"] * 2
            assert all(v["error"] is None for r in records for v in r["variants"])


def test_the_compression_script_dry_runs(model_dir, tmp_path):
    result = _dry_run("gpu_compress.sh", tmp_path / "out", model_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for name in ("llama-1b-2", "llama-1b-4"):
        record = json.loads((tmp_path / "out" / f"{name}.json").read_text())
        assert record["peak_memory_bytes"]["host"] > 0, name
        assert "peak memory " in (tmp_path / "out" / f"{name}.txt").read_text()
    assert "llama-1b-4 exit status: 0" in result.stdout
