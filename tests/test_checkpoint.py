"""Checkpoints: exact round trips for every architecture, atomic saves, and clear load errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import ARCH_CONFIGS, SAMPLE_TEXT, VOCAB, tiny_model
from svdmlp import checkpoint
from svdmlp.compress import pipeline
from svdmlp.compress.report import CompressionReport
from svdmlp.config import CalibrationSpec, CompressConfig
from svdmlp.lowrank import LowRankGatedMLP, LowRankLinear
from svdmlp.paths import file_sha256


def _config(text_path, **overrides) -> CompressConfig:
    settings = {"keep": 0.5, "align": 8, **overrides}
    return CompressConfig(calibration=CalibrationSpec(str(text_path), 4, 32), **settings)


def _compress(model_type: str, tokenizer, text_path, **overrides):
    model = tiny_model(model_type)
    config = _config(text_path, **overrides)
    report = pipeline.compress(model, tokenizer, config, progress=False)
    return model, config, report


def _logits(model) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(ids).logits


def _snapshot(directory) -> dict[str, tuple[bytes, int]]:
    """Every file under ``directory``: its bytes and modification time, by relative path."""
    return {
        str(path.relative_to(directory)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _mlp(model, index: int):
    return model.model.layers[index].mlp


@pytest.fixture(scope="module")
def saved(tmp_path_factory, tokenizer):
    """A compressed tiny Llama saved once: (directory, in-memory model). Copy it before altering it."""
    root = tmp_path_factory.mktemp("saved")
    text = root / "calib.txt"
    text.write_text(SAMPLE_TEXT, encoding="utf-8")
    model, config, report = _compress("llama", tokenizer, text)
    directory = checkpoint.save(root / "ckpt", model, tokenizer, config, report, base_model="tiny-llama")
    return directory, model


@pytest.fixture
def ckpt(saved, tmp_path):
    """A private copy of the saved checkpoint, free to corrupt."""
    copy = tmp_path / "parent" / "ckpt"
    shutil.copytree(saved[0], copy)
    return copy


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_round_trip_is_exact_for_every_architecture(model_type, tokenizer, text_file, tmp_path):
    model, config, report = _compress(model_type, tokenizer, text_file)
    expected = _logits(model)
    directory = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    assert directory == (tmp_path / "ckpt").resolve()
    assert {p.name for p in directory.iterdir()} >= {
        "model.safetensors",
        "svdmlp.json",
        "config.json",
        "tokenizer.json",
    }

    loaded, loaded_tokenizer = checkpoint.load(directory)
    assert not loaded.training
    assert loaded.config.model_type == model_type
    assert torch.equal(_logits(loaded), expected)

    original, restored = model.state_dict(), loaded.state_dict()
    assert original.keys() == restored.keys()
    for name, tensor in original.items():
        assert restored[name].dtype == tensor.dtype == torch.float32, name
        assert torch.equal(restored[name], tensor), name

    # Tied tensors come back as one parameter (gemma ties the LM head to the embedding).
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == model_type.startswith("gemma")
    assert (loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight) == tied
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in model.parameters())
    metadata = checkpoint.read_metadata(directory)
    assert metadata["tied"] == ({"lm_head.weight": "model.embed_tokens.weight"} if tied else {})

    recorded = [layer.ranks for layer in report.layers]
    assert recorded == [{"gate": 16, "up": 16, "down": 16}] * 2
    assert [layer["status"] for layer in metadata["report"]["layers"]] == ["compressed"] * 2
    for index, ranks in enumerate(recorded):
        mlp = _mlp(loaded, index)
        assert isinstance(mlp, LowRankGatedMLP)
        assert mlp.ranks == ranks
        assert mlp.backend == "torch"
        assert tuple(mlp.gate_up_u_t.shape) == (64, 32) and tuple(mlp.down_v_t.shape) == (16, 64)

    assert loaded_tokenizer("the quick fox")["input_ids"] == tokenizer("the quick fox")["input_ids"]


def test_tied_weights_stay_tied_when_loaded_in_another_dtype(tokenizer, text_file, tmp_path):
    model, config, report = _compress("gemma", tokenizer, text_file)
    checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    loaded, _ = checkpoint.load(tmp_path / "ckpt", dtype=torch.bfloat16)
    head, embedding = loaded.get_output_embeddings().weight, loaded.get_input_embeddings().weight
    assert head is embedding and head.dtype == torch.bfloat16
    assert _mlp(loaded, 0).gate_up_u_t.dtype == torch.bfloat16


def test_partial_targets_round_trip(tokenizer, text_file, tmp_path):
    model, config, report = _compress("qwen3", tokenizer, text_file, targets=("down",))
    expected = _logits(model)
    checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    loaded, _ = checkpoint.load(tmp_path / "ckpt")
    assert torch.equal(_logits(loaded), expected)
    for index in range(2):
        mlp = _mlp(loaded, index)
        assert isinstance(mlp.down_proj, LowRankLinear) and mlp.down_proj.rank == 16
        assert mlp.down_proj.backend == "torch"
        assert isinstance(mlp.gate_proj, torch.nn.Linear) and isinstance(mlp.up_proj, torch.nn.Linear)
    assert checkpoint.read_metadata(tmp_path / "ckpt")["config"]["targets"] == ["down"]


def test_skipped_layers_round_trip(tokenizer, text_file, tmp_path):
    model, config, report = _compress("llama", tokenizer, text_file, layers=(1,))
    expected = _logits(model)
    checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    loaded, _ = checkpoint.load(tmp_path / "ckpt")
    assert torch.equal(_logits(loaded), expected)
    assert not isinstance(_mlp(loaded, 0), LowRankGatedMLP)
    assert isinstance(_mlp(loaded, 1), LowRankGatedMLP)


def test_metadata_records_config_report_and_checksum(saved):
    directory, model = saved
    metadata = checkpoint.read_metadata(directory)
    assert metadata["format"] == "svdmlp" and metadata["format_version"] == checkpoint.FORMAT_VERSION
    assert metadata["model_type"] == "llama" and metadata["dtype"] == "float32"
    assert metadata["base_model"] == "tiny-llama"
    assert CompressConfig.from_dict(metadata["config"]).align == 8
    assert metadata["config"]["keep"] == 0.5
    weights = directory / "model.safetensors"
    assert metadata["weights"]["bytes"] == weights.stat().st_size
    assert metadata["weights"]["sha256"] == file_sha256(weights)
    assert metadata["report"]["calibration"]["tokens"] == 4 * 32
    assert {"svdmlp", "torch", "transformers", "safetensors"} == set(metadata["versions"])
    assert checkpoint.is_checkpoint(directory)


def test_verify_false_loads_a_good_checkpoint(saved):
    directory, model = saved
    loaded, _ = checkpoint.load(directory, verify=False)
    assert torch.equal(_logits(loaded), _logits(model))


# --- saving over existing things ---------------------------------------------------------------


@pytest.mark.parametrize("overwrite", [False, True])
def test_save_never_replaces_a_directory_that_is_not_a_checkpoint(saved, tokenizer, tmp_path, overwrite):
    _, model = saved
    target = tmp_path / "precious"
    (target / "sub").mkdir(parents=True)
    (target / "notes.txt").write_text("keep me")
    (target / "sub" / "data.bin").write_bytes(bytes(range(256)))
    before = _snapshot(target)
    metadata = checkpoint.read_metadata(saved[0])
    config = CompressConfig.from_dict(metadata["config"])
    report = CompressionReport.from_dict(metadata["report"])
    with pytest.raises(
        FileExistsError, match="exists and is not an svdmlp checkpoint; refusing to replace it"
    ):
        checkpoint.save(target, model, tokenizer, config, report, base_model="x", overwrite=overwrite)
    assert _snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]


def test_save_refuses_a_file_in_the_way(tmp_path):
    target = tmp_path / "out"
    target.write_text("a file")
    with pytest.raises(FileExistsError, match="is not an svdmlp checkpoint"):
        checkpoint.check_target(target, overwrite=True)
    assert target.read_text() == "a file"


def test_save_into_an_empty_directory(tokenizer, tmp_path, text_file):
    model, config, report = _compress("llama", tokenizer, text_file)
    target = tmp_path / "empty"
    target.mkdir()
    checkpoint.save(target, model, tokenizer, config, report, base_model="x")
    assert checkpoint.is_checkpoint(target)


def test_overwriting_a_checkpoint_needs_overwrite(ckpt, tokenizer, text_file):
    before = _snapshot(ckpt)
    model, config, report = _compress("llama", tokenizer, text_file, keep=0.25)
    with pytest.raises(FileExistsError, match="already holds an svdmlp checkpoint; pass overwrite=True"):
        checkpoint.save(ckpt, model, tokenizer, config, report, base_model="x")
    assert _snapshot(ckpt) == before

    checkpoint.save(ckpt, model, tokenizer, config, report, base_model="replacement", overwrite=True)
    metadata = checkpoint.read_metadata(ckpt)
    assert metadata["base_model"] == "replacement" and metadata["config"]["keep"] == 0.25
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt"]  # no staging or retired dirs
    loaded, _ = checkpoint.load(ckpt)
    assert torch.equal(_logits(loaded), _logits(model))


# --- loading broken things ---------------------------------------------------------------------


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory .*nowhere does not exist"):
        checkpoint.load(tmp_path / "nowhere")


def test_directory_without_metadata(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is not an svdmlp checkpoint \(no svdmlp.json\)"):
        checkpoint.load(tmp_path)
    assert not checkpoint.is_checkpoint(tmp_path)


def test_truncated_weights(ckpt):
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(
        ValueError, match=f"truncated or altered: {len(data) - 100} bytes, expected {len(data)}"
    ):
        checkpoint.load(ckpt)


def test_truncated_weights_without_verification_still_fail_clearly(ckpt):
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot be read"):
        checkpoint.load(ckpt, verify=False)


def test_flipped_byte_is_detected(ckpt):
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted: SHA-256 differs from the one recorded at save time"):
        checkpoint.load(ckpt)


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="model.safetensors are missing"):
        checkpoint.load(ckpt)


def test_corrupted_metadata(ckpt):
    path = ckpt / "svdmlp.json"
    path.write_text(path.read_text()[:50])
    with pytest.raises(ValueError, match="svdmlp.json is corrupted"):
        checkpoint.load(ckpt)


@pytest.mark.parametrize(("key", "value"), [("format_version", 99), ("format", "other")])
def test_unknown_format(ckpt, key, value):
    path = ckpt / "svdmlp.json"
    metadata = json.loads(path.read_text())
    metadata[key] = value
    path.write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match=f"{value!r}.*this svdmlp reads 'svdmlp' version 1"):
        checkpoint.load(ckpt)


def test_ranks_that_do_not_match_the_weights(ckpt):
    path = ckpt / "svdmlp.json"
    metadata = json.loads(path.read_text())
    metadata["report"]["layers"][0]["projections"][0]["rank"] = 24
    path.write_text(json.dumps(metadata))
    with pytest.raises(ValueError, match="does not match its recorded architecture"):
        checkpoint.load(ckpt)
