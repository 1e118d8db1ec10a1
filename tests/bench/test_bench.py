"""The device scripts dry-run on a CPU (DRY_RUN=1: the kernels interpreted, tiny shapes): every step
runs and every file they promise is written."""

from __future__ import annotations

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
