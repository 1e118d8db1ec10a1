"""Compressing into a directory (``svdmlp.compress_to``, what ``svdmlp compress`` runs): the default
recipe from Python, resuming after a kill at any write (and after the newest kept file was damaged),
and one run at a time per output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import svdmlp
from conftest import SAMPLE_TEXT, save_tiny_llama
from svdmlp import lazy, paths
from svdmlp.cli import main
from svdmlp.compression import workspace
from svdmlp.config import CalibrationSpec, CompressConfig, LoraSpec


def _config(calib) -> CompressConfig:
    """The default recipe (allocation, sequential fisher calibration, closed form, distillation),
    small: 4 windows of 32 tokens of ``calib``, ranks aligned to 8, two distillation steps of 16 tokens."""
    small = dict(align=8, calibration=CalibrationSpec(str(calib), 4, 32), lora=LoraSpec(steps=2, seq_len=16))
    return CompressConfig.preset("default", keep=0.6, **small)


@pytest.fixture
def model(tmp_path, tokenizer):
    return save_tiny_llama(tmp_path / "model", tokenizer)


@pytest.fixture
def calib(tmp_path):
    path = tmp_path / "calib.txt"
    path.write_text(SAMPLE_TEXT)
    return path


def _weights(directory) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's weight files, by name."""
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors


def _same(found: dict, expected: dict) -> None:
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name


def test_the_default_recipe_from_python_is_the_command_lines(tokenizer):
    preset = CompressConfig.preset("default", keep=0.7, inter=1536)
    assert (preset.method, preset.allocation, preset.sequential, preset.heal) == (
        "fisher",
        "budget",
        True,
        "closed-form+lora",
    )
    assert preset.keep == 0.7 and preset.calibration.num_samples == 32 and preset.lora.steps == 16
    assert CompressConfig.preset(inter=4864).calibration.num_samples == 128  # a wide MLP gets more
    plain = CompressConfig.preset("default", method="svd")  # no calibration: nothing that needs it
    assert (plain.sequential, plain.heal) == (False, "lora")
    with pytest.raises(ValueError, match="unknown effort 'quick'"):
        CompressConfig.preset("quick")


def test_a_python_run_stopped_between_layers_continues_to_the_same_factors(
    model, calib, tmp_path, monkeypatch
):
    config = _config(calib)
    whole = svdmlp.compress_to(model, tmp_path / "whole", config, progress=False, log=lambda line: None)
    assert whole.path == tmp_path / "whole" and whole.report.achieved_keep < 1
    stored, lines = [], []
    store = lazy.DiskWeights.store

    def stopped(self, unit):
        stored.append(unit)
        if len(stored) == 2:  # the second compressed layer
            raise KeyboardInterrupt
        return store(self, unit)

    monkeypatch.setattr(lazy.DiskWeights, "store", stopped)
    with pytest.raises(KeyboardInterrupt):
        svdmlp.compress_to(model, tmp_path / "ckpt", config, progress=False, log=lines.append)
    assert "run the same command again to continue" in lines[-1]
    monkeypatch.setattr(lazy.DiskWeights, "store", store)
    done = svdmlp.compress_to(model, tmp_path / "ckpt", config, progress=False, log=lines.append)
    assert done.continued and any("1 compressed layers done" in line for line in lines)
    _same(_weights(tmp_path / "ckpt"), _weights(tmp_path / "whole"))
    assert not workspace.work_directory(tmp_path / "ckpt").exists()


def _killed_at(point: int, argv: list[str]) -> int:
    """Run ``svdmlp`` with ``argv`` in a forked process killed (``os._exit``, no clean-up) at write
    ``point`` of its scratch files and journal: before it on odd points, just after it on even ones;
    the process's exit status (137 when killed)."""
    child = os.fork()
    if child == 0:  # never returns to pytest
        code = 1
        try:
            count = [0]

            def killing(write):
                def wrapped(*args, **kwargs):
                    count[0] += 1
                    if count[0] == (point + 1) // 2 and point % 2:
                        os._exit(137)
                    result = write(*args, **kwargs)
                    if count[0] == point // 2 and not point % 2:
                        os._exit(137)
                    return result

                return wrapped

            lazy.save_atomic = killing(lazy.save_atomic)
            paths.write_output = killing(paths.write_output)
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (the process ends with os._exit)
            code = main(argv)
        finally:
            os._exit(code)
    deadline = time.monotonic() + 300
    while True:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            raise AssertionError(f"the run killed at write {point} did not end")
        time.sleep(0.05)


def _damage(directory, how: str) -> str:
    """Truncate or change the newest file the stopped run kept (what a crash or a bad disk might
    leave); the file's name."""
    files = [path for path in directory.rglob("*") if path.is_file()]
    newest = max(files, key=lambda path: (path.stat().st_mtime_ns, path.name))
    data = newest.read_bytes()
    if how == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    else:  # 4 bytes near the end changed: a whole file whose values are not the ones written
        newest.write_bytes(data[:-16] + bytes(4) + data[-12:])
    return newest.name


def test_a_run_killed_at_any_write_continues_to_the_same_factors_or_refuses_in_one_line(
    model, calib, tmp_path, capsys
):
    argv = ["compress", str(model), "--calib", str(calib), "--calib-samples", "4", "--calib-seq-len", "32"]
    argv += ["--align", "8", "--heal-steps", "2", "--heal-seq-len", "16", "--keep", "0.6"]
    assert main([*argv, "--out", str(tmp_path / "whole")]) == 0
    expected = _weights(tmp_path / "whole")
    capsys.readouterr()
    # The writes of an uninterrupted run: spilled Grams and layer inputs, layers, journal records.
    writes = [0]
    save, write = lazy.save_atomic, paths.write_output

    def counted(function):
        def wrapped(*args, **kwargs):
            writes[0] += 1
            return function(*args, **kwargs)

        return wrapped

    lazy.save_atomic, paths.write_output = counted(save), counted(write)
    try:
        assert main([*argv, "--out", str(tmp_path / "counted")]) == 0
    finally:
        lazy.save_atomic, paths.write_output = save, write
    points = sorted({round(k * (2 * writes[0] - 1) / 23) + 1 for k in range(24)})
    assert len(points) >= 20, writes
    damaged = []
    for number, point in enumerate(points):
        out = tmp_path / f"run{point}"
        assert _killed_at(point, [*argv, "--out", str(out)]) == 137, point
        work = workspace.work_directory(out)
        if number % 3 and work.is_dir() and any(work.iterdir()):
            damaged.append(_damage(work, "truncate" if number % 3 == 1 else "change"))
        capsys.readouterr()
        code = main([*argv, "--out", str(out)])
        err = capsys.readouterr().err
        assert "Traceback" not in err, (point, err)
        if code == 0:
            _same(_weights(out), expected)
            assert not work.exists()
        else:  # refused: one line, nothing saved
            assert code == 2 and len(err.strip().splitlines()) == 1, (point, err)
            assert not out.exists()
    assert len(damaged) >= 10


def test_two_runs_on_one_output_one_refuses_at_once_and_a_later_run_works(model, calib, tmp_path, capsys):
    out = tmp_path / "ckpt"
    argv = ["compress", str(model), "--calib", str(calib), "--calib-samples", "4", "--calib-seq-len", "32"]
    argv += ["--align", "8", "--heal-steps", "2", "--heal-seq-len", "16", "--out", str(out)]
    first = subprocess.Popen(
        [sys.executable, "-m", "svdmlp", *argv], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    lock = out.parent / ".ckpt.lock"
    deadline = time.monotonic() + 120
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lock.exists(), first.communicate()[1]
    started = time.monotonic()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - started < 30
    assert err.strip().splitlines() == [
        f"svdmlp compress: error: another svdmlp run (process {first.pid}) is writing {out}: wait for it "
        "to end, or choose another --out"
    ]
    assert first.wait(timeout=600) == 0, first.stderr.read()
    assert not lock.exists()
    assert main([*argv, "--overwrite"]) == 0  # the lock let go
