"""``svdmlp serve``: refusals in one line before anything listens, and (in the vLLM environment) a real
OpenAI-compatible server answering a chat completion and a streamed completion through ``openai``."""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import SAMPLE_TEXT, assert_cli_error, edit_metadata, tiny_model
from svdmlp import checkpoint
from svdmlp.compression import pipeline
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.paths import file_sha256

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture
def ckpt(compressed, tmp_path):
    """A copy of the tiny compressed checkpoint, free to alter."""
    return shutil.copytree(compressed[2], tmp_path / "ckpt")


def _edit_config(directory, edit) -> None:
    """Change config.json and record its new hash, as a writer of a newer svdmlp would."""
    path = directory / "config.json"
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    record = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    edit_metadata(directory, lambda m: m["files"].update({"config.json": record}))


def test_altered_weights_are_refused(ckpt, capsys):
    shard = next(ckpt.glob("model-00002-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert_cli_error(capsys, "serve", ["serve", ckpt], "corrupted", shard.name)


def test_a_missing_factor_file_is_refused(ckpt, capsys):
    shard = next(ckpt.glob("model-00002-*.safetensors"))
    shard.unlink()
    assert_cli_error(capsys, "serve", ["serve", ckpt], "missing", shard.name)


def test_an_unknown_record_version_is_refused(ckpt, capsys):
    _edit_config(ckpt, lambda record: record["quantization_config"].update(format_version=99))
    assert_cli_error(capsys, "serve", ["serve", ckpt], "format_version 99", "upgrade svdmlp")


def test_an_earlier_format_is_refused_with_the_upgrade_command(ckpt, capsys):
    edit_metadata(ckpt, lambda m: m.update(format_version=3))
    assert_cli_error(capsys, "serve", ["serve", ckpt], "format 3", f"svdmlp upgrade {ckpt}")


def test_partial_targets_are_refused(ckpt, capsys):
    _edit_config(ckpt, lambda record: record["quantization_config"]["layers"]["0"].pop("up"))
    assert_cli_error(capsys, "serve", ["serve", ckpt], "layer 0", "low-rank whole")


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here")
def test_without_vllm_it_says_how_to_get_it(ckpt, capsys):
    assert_cli_error(capsys, "serve", ["serve", ckpt], "make serve-env", ".venv-vllm/bin/svdmlp serve")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def chat_checkpoint(tokenizer, tmp_path):
    """A tiny compressed Llama of heads vLLM's CPU attention takes, its tokenizer with a chat template."""
    text = tmp_path / "calib.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    model = tiny_model("llama", hidden_size=128, intermediate_size=512, num_attention_heads=2, head_dim=64)
    config = CompressConfig(keep=0.5, align=8, calibration=CalibrationSpec(str(text), 4, 32))
    report = pipeline.compress(model, tokenizer, config, progress=False)
    chat = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<eos>")
    chat.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return checkpoint.save(tmp_path / "ckpt", model, chat, config, report, base_model="tiny")


@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM (make serve-env)")
def test_a_served_checkpoint_answers_the_openai_client(chat_checkpoint):
    import openai

    port = _free_port()
    vllm_args = ["--enforce-eager", "--max-model-len", "256", "--kv-cache-memory-bytes", str(128 * 2**20)]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "svdmlp",
            "serve",
            str(chat_checkpoint),
            "--port",
            str(port),
            "--vllm",
            *vllm_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.stderr.read()[-3000:]
            try:
                (model,) = client.models.list().data
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "the server did not start in 300 s"
                time.sleep(2)
        chat = client.chat.completions.create(
            model=model.id,
            messages=[{"role": "user", "content": "the quick fox"}],
            max_tokens=8,
            temperature=0,
        )
        assert chat.choices[0].message.content and chat.usage.completion_tokens == 8
        pieces = client.completions.create(
            model=model.id, prompt="the old king", max_tokens=8, temperature=0, stream=True
        )
        streamed = [piece.choices[0].text for piece in pieces if piece.choices]
        assert len(streamed) >= 2 and "".join(streamed)
    finally:
        server.terminate()
        server.wait(timeout=60)
