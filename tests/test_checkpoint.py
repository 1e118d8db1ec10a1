"""Checkpoints: exact round trips for every architecture, atomic saves, and clear load errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import ARCH_CONFIGS, SAMPLE_TEXT, VOCAB, edit_metadata, snapshot, tiny_model
from svdmlp import checkpoint, checkpoint_record
from svdmlp.compression import pipeline
from svdmlp.compression.report import CompressionReport
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


def _shard(directory, tensor: str = "model.layers.1.mlp.up_v_t"):
    """The weights file of ``directory`` that holds ``tensor``."""
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return directory / index["weight_map"][tensor]


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
        "model-00001-of-00005.safetensors",  # embeddings, two layers, LM head, the rest
        "model.safetensors.index.json",
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
    # One weights file per unit: embeddings, each decoder layer, the LM head (untied), the rest.
    shards = [f"model-0000{k}-of-00005.safetensors" for k in range(1, 6)]
    assert metadata["weights"] == {"files": shards}
    assert _shard(directory, "model.layers.1.mlp.down_v_t") == directory / shards[2]
    assert _shard(directory, "model.norm.weight") == directory / shards[4]
    # Every file but svdmlp.json itself, the weights included.
    files = sorted(p.name for p in directory.iterdir() if p.name != "svdmlp.json")
    assert sorted(metadata["files"]) == files
    assert {"config.json", "generation_config.json", *shards, "tokenizer.json"} <= set(files)
    for name in files:
        path = directory / name
        assert metadata["files"][name] == {"bytes": path.stat().st_size, "sha256": file_sha256(path)}, name
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
    before = snapshot(target)
    metadata = checkpoint.read_metadata(saved[0])
    config = CompressConfig.from_dict(metadata["config"])
    report = CompressionReport.from_dict(metadata["report"])
    with pytest.raises(
        FileExistsError, match="exists and is not an svdmlp checkpoint; refusing to replace it"
    ):
        checkpoint.save(target, model, tokenizer, config, report, base_model="x", overwrite=overwrite)
    assert snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]


def test_save_refuses_a_file_in_the_way(tmp_path):
    target = tmp_path / "out"
    target.write_text("a file")
    with pytest.raises(FileExistsError, match="is not an svdmlp checkpoint"):
        checkpoint.check_target(target, overwrite=True)
    assert target.read_text() == "a file"


def test_save_refuses_a_mount_point_before_any_work(tmp_path, monkeypatch):
    """Issue 52, item 9: the finished checkpoint's rename onto a mount point failed with EBUSY."""
    monkeypatch.setattr(os.path, "ismount", lambda path: Path(path) == tmp_path)
    with pytest.raises(ValueError, match=f"{tmp_path} is a mount point, which a finished checkpoint cannot"):
        checkpoint.check_target(tmp_path, overwrite=False)


def test_save_refuses_a_parent_it_cannot_write_before_any_work(tmp_path, monkeypatch):
    """Issue 52, item 9: on a read-only file system the disk check said "0.0 GB free" instead."""
    readonly = tmp_path / "ro"
    readonly.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != readonly and access(path, mode))
    target = readonly / "not" / "yet" / "ckpt"
    with pytest.raises(
        PermissionError, match=f"^cannot write to {readonly} \\(for the checkpoint {target}\\)"
    ):
        checkpoint.check_target(target, overwrite=False)
    checkpoint.check_target(tmp_path / "ckpt", overwrite=False)


def test_save_into_an_empty_directory(tokenizer, tmp_path, text_file):
    model, config, report = _compress("llama", tokenizer, text_file)
    target = tmp_path / "empty"
    target.mkdir()
    checkpoint.save(target, model, tokenizer, config, report, base_model="x")
    assert checkpoint.is_checkpoint(target)


def test_overwriting_a_checkpoint_needs_overwrite(ckpt, tokenizer, text_file):
    before = snapshot(ckpt)
    model, config, report = _compress("llama", tokenizer, text_file, keep=0.25)
    with pytest.raises(FileExistsError, match="already holds an svdmlp checkpoint; pass overwrite=True"):
        checkpoint.save(ckpt, model, tokenizer, config, report, base_model="x")
    assert snapshot(ckpt) == before

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
    weights = _shard(ckpt)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(
        ValueError, match=f"truncated or altered: {len(data) - 100} bytes, expected {len(data)}"
    ):
        checkpoint.load(ckpt)


def test_truncated_weights_without_verification_still_fail_clearly(ckpt):
    weights = _shard(ckpt)
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot be read"):
        checkpoint.load(ckpt, verify=False)


def test_flipped_byte_is_detected(ckpt):
    weights = _shard(ckpt)
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted: SHA-256 differs from the one recorded at save time"):
        checkpoint.load(ckpt)


def test_missing_weights(ckpt):
    _shard(ckpt).unlink()
    with pytest.raises(ValueError, match="model-00003-of-00005.safetensors are missing"):
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
    with pytest.raises(
        ValueError, match=f"{value!r}.*; this svdmlp reads 'svdmlp' version 1 or 2 or 3 or 4 or 5$"
    ):
        checkpoint.load(ckpt)


def _one_line_error(ckpt, **kwargs) -> str:
    with pytest.raises(ValueError) as error:
        checkpoint.load(ckpt, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


def _manifest_layers(ckpt, edit) -> None:
    """Edit the ranks config.json's quantization_config records (the model's skeleton is built from
    them), as a hand edit of both records would; the files' hashes then no longer match."""
    _edit_config(ckpt, lambda config: edit(config["quantization_config"]["layers"]))


def test_a_report_that_disagrees_with_the_manifest_is_refused(ckpt):
    edit_metadata(ckpt, lambda m: m["report"]["layers"][0]["projections"][0].update(rank=24))
    assert _one_line_error(ckpt) == (
        f"checkpoint {ckpt}: config.json's quantization_config and svdmlp.json's report record other "
        "ranks, factor bits or quantized weights (edited by hand?): compress again"
    )


def test_ranks_that_do_not_match_the_weights(ckpt):
    edit_metadata(ckpt, lambda m: m["report"]["layers"][0]["projections"][0].update(rank=24))
    _manifest_layers(ckpt, lambda layers: layers["0"].update(gate=24))
    assert _one_line_error(ckpt, verify=False) == (
        f"checkpoint {ckpt} does not match its recorded architecture: 2 of another shape "
        "(model.layers.0.mlp.gate_up_u_t 64x32 instead of 64x40, model.layers.0.mlp.gate_v_t 16x96 instead of "
        "24x96); its svdmlp.json and weights disagree (save the checkpoint again)"
    )


def test_layer_recorded_as_skipped_but_stored_compressed(ckpt):
    edit_metadata(ckpt, lambda m: m["report"]["layers"][1].update(status="skipped", projections=[]))
    _manifest_layers(ckpt, lambda layers: layers.pop("1"))
    assert (
        "does not match its recorded architecture: 3 missing (model.layers.1.mlp.down_proj.weight, "
        "model.layers.1.mlp.gate_proj.weight, model.layers.1.mlp.up_proj.weight), 5 unexpected "
        "(model.layers.1.mlp.down_u_t, model.layers.1.mlp.down_v_t, model.layers.1.mlp.gate_up_u_t and 2 more); "
    ) in _one_line_error(ckpt, verify=False)


def test_tensor_missing_from_the_weights(ckpt):
    weights = _shard(ckpt)
    tensors = load_file(weights)
    del tensors["model.layers.1.mlp.up_v_t"]
    save_file(tensors, weights)
    assert "does not match its recorded architecture: 1 missing (model.layers.1.mlp.up_v_t); " in (
        _one_line_error(ckpt, verify=False)
    )


# --- every file of the checkpoint is checked ---------------------------------------------------


def _edit_config(ckpt, edit) -> None:
    path = ckpt / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize(
    "edit",
    [lambda c: c["rope_parameters"].update(rope_theta=20000.0), lambda c: c.update(rms_norm_eps=0.5)],
    ids=["rope_theta", "rms_norm_eps"],
)
def test_edited_config_is_detected(saved, ckpt, edit):
    _edit_config(ckpt, edit)
    message = _one_line_error(ckpt)
    assert message.startswith(f"checkpoint file {ckpt / 'config.json'} is ")
    assert message.endswith("; restore the checkpoint or save it again")
    # What verification prevents: the edit changes the model's output, silently.
    loaded, _ = checkpoint.load(ckpt, verify=False)
    assert not torch.equal(_logits(loaded), _logits(saved[1]))


def test_changed_file_of_the_same_size_is_detected(ckpt):
    path = ckpt / "config.json"
    text = path.read_text()
    assert '"rms_norm_eps": 1e-06' in text
    path.write_text(text.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    assert _one_line_error(ckpt) == (
        f"checkpoint file {path} is corrupted: SHA-256 differs from the one recorded at save time; "
        "restore the checkpoint or save it again"
    )


def test_truncated_tokenizer_is_detected(ckpt):
    path = ckpt / "tokenizer.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert (
        f"checkpoint file {path} is truncated or altered: {len(data) // 2} bytes, expected {len(data)}"
        in (_one_line_error(ckpt))
    )


@pytest.mark.parametrize("name", ["generation_config.json", "tokenizer_config.json", "config.json"])
def test_missing_file_is_detected(ckpt, name):
    (ckpt / name).unlink()
    assert _one_line_error(ckpt) == (
        f"checkpoint file {ckpt / name} is missing; restore the checkpoint or save it again"
    )


def test_added_file_is_ignored(saved, ckpt):
    (ckpt / "README.md").write_text("notes")
    loaded, _ = checkpoint.load(ckpt)
    assert torch.equal(_logits(loaded), _logits(saved[1]))


def _as_version_1(ckpt) -> None:
    """What a format_version 1 checkpoint held: one weights file, its record, no "files"."""
    metadata = json.loads((ckpt / "svdmlp.json").read_text())
    tensors = {}
    for name in metadata["weights"]["files"]:
        tensors.update(load_file(ckpt / name))
        (ckpt / name).unlink()
    weights = ckpt / "model.safetensors"
    save_file(tensors, weights)
    metadata["format_version"] = 1
    del metadata[checkpoint_record.DIGEST_KEY]  # format 5 added it
    metadata["weights"] = {
        "file": weights.name,
        "bytes": weights.stat().st_size,
        "sha256": file_sha256(weights),
    }
    del metadata["files"]
    (ckpt / "svdmlp.json").write_text(json.dumps(metadata))


def test_version_1_checkpoint_still_loads_and_checks_its_weights(saved, ckpt):
    _as_version_1(ckpt)
    assert checkpoint.read_metadata(ckpt)["format_version"] == 1
    loaded, _ = checkpoint.load(ckpt)
    assert torch.equal(_logits(loaded), _logits(saved[1]))
    (ckpt / "generation_config.json").unlink()  # version 1 recorded nothing of it
    checkpoint.load(ckpt)

    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    assert "model.safetensors are truncated or altered: " in _one_line_error(ckpt)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(files=None),
        lambda m: m["files"].update({"../outside.json": {"bytes": 1, "sha256": "0"}}),
        lambda m: m["files"].update({"/etc/hostname": {"bytes": 1, "sha256": "0"}}),
        lambda m: m["files"]["config.json"].pop("sha256"),
        lambda m: m["files"]["config.json"].update(bytes="12"),
        lambda m: m.pop("weights"),
    ],
    ids=["no-files", "outside", "absolute", "no-sha256", "bytes-as-text", "no-weights"],
)
def test_malformed_file_record(ckpt, edit):
    edit_metadata(ckpt, edit)
    with pytest.raises(
        ValueError, match="svdmlp.json is corrupted: its record of the checkpoint's files is malformed"
    ):
        checkpoint.read_metadata(ckpt)


# --- svdmlp.json is validated as it is read, and sealed by its own digest (issue 52, items 6 and 7) ---


def _first_projection(m) -> dict:
    return m["report"]["layers"][0]["projections"][0]


@pytest.mark.parametrize(
    ("edit", "phrase"),
    [
        (lambda m: _first_projection(m).update(rank=-32), "its report has layer 0 gate of rank -32"),
        (lambda m: _first_projection(m).update(rank="abc"), "its report has layer 0 gate of rank 'abc'"),
        (lambda m: _first_projection(m).update(rank=True), "of rank True"),
        (
            lambda m: m["report"]["layers"][0].update(index=99),
            "its report records layer 99, but the model of config.json has 2 layers",
        ),
        (lambda m: m.pop("report"), "its report is missing"),
        (lambda m: m.update(dtype="float99"), "dtype 'float99' is none of float32"),
        (lambda m: m.update(base_model=None), "base_model None is not a name"),
        (lambda m: m["config"].update(keep="abc"), "its compression config is malformed"),
        (lambda m: m["report"]["params_before"].update(mlp=0), "counts no MLP parameters"),
        (lambda m: m["report"]["layers"].append(m["report"]["layers"][0]), "records layer 0 twice"),
        (lambda m: m["report"]["layers"][0].update(status="gone"), "of status 'gone'"),
        (lambda m: _first_projection(m).update(name="gate_up"), "with projections ['gate_up', 'up', 'down']"),
        (lambda m: _first_projection(m).update(extra=1), "layer 0 gate of unknown form"),
    ],
    ids=[
        "negative-rank",
        "rank-as-text",
        "rank-as-bool",
        "layer-beyond-model",
        "no-report",
        "dtype",
        "base-model",
        "config",
        "no-mlp",
        "layer-twice",
        "status",
        "projection-name",
        "unknown-key",
    ],
)
def test_a_malformed_record_is_one_line_when_read(ckpt, edit, phrase):
    """Each of these once crashed a load (or, the dtype, loaded anyway) with exit 1 or a traceback."""
    edit_metadata(ckpt, edit)
    with pytest.raises(ValueError) as error:
        checkpoint.read_metadata(ckpt)
    message = str(error.value)
    assert message.startswith(f"{ckpt / 'svdmlp.json'} is corrupted: ") and "\n" not in message
    assert phrase in message, message


def test_layers_edited_in_the_config_with_its_hash_are_refused(ckpt):
    """config.json's num_hidden_layers cut to 1, its new hash recorded: the record's layer 1 is beyond it."""
    path = ckpt / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_hidden_layers": 1}))
    record = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    edit_metadata(ckpt, lambda m: m["files"].update({"config.json": record}))
    assert "its report records layer 1, but the model of config.json has 1 layers" in _one_line_error(ckpt)


def test_a_record_nested_too_deeply_is_corrupted(ckpt):
    (ckpt / "svdmlp.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match="svdmlp.json is corrupted: its JSON is nested too deeply$"):
        checkpoint.read_metadata(ckpt)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(base_model="/elsewhere/another-model"),
        lambda m: m["config"].update(keep=0.9),
        lambda m: m["files"]["config.json"].update(sha256="0" * 64),
        lambda m: m.pop(checkpoint_record.DIGEST_KEY),
    ],
    ids=["base-model", "keep", "file-hash", "digest-removed"],
)
def test_an_edited_record_is_refused_by_its_digest(ckpt, edit):
    path = ckpt / "svdmlp.json"
    metadata = json.loads(path.read_text())
    assert metadata[checkpoint_record.DIGEST_KEY] == checkpoint_record.digest(metadata)
    edit(metadata)
    path.write_text(json.dumps(metadata, indent=2))
    assert _one_line_error(ckpt) == (
        f"{path} was edited after it was saved: its content does not match the SHA-256 it records; "
        "restore the checkpoint or save it again"
    )


def test_the_digest_ignores_the_layout_of_the_json(ckpt):
    path = ckpt / "svdmlp.json"
    path.write_text(json.dumps(dict(reversed(json.loads(path.read_text()).items()))))
    checkpoint.read_metadata(ckpt)


def test_a_format_4_checkpoint_without_a_digest_still_loads(saved, ckpt):
    edit_metadata(ckpt, lambda m: m.update(format_version=4) or m.pop(checkpoint_record.DIGEST_KEY))
    loaded, _ = checkpoint.load(ckpt)
    assert torch.equal(_logits(loaded), _logits(saved[1]))


# --- configs naming another architecture -------------------------------------------------------


def test_unsupported_architecture_in_the_config(ckpt):
    _edit_config(ckpt, lambda c: c.update(model_type="gpt2"))
    assert _one_line_error(ckpt).startswith(
        f"checkpoint file {ckpt / 'config.json'} is truncated or altered: "
    )
    assert _one_line_error(ckpt, verify=False).startswith(
        "unsupported model type 'gpt2'; svdmlp supports: gemma, "
    )


def test_architecture_unknown_to_transformers_in_the_config(ckpt):
    _edit_config(ckpt, lambda c: c.update(model_type="no-such-architecture"))
    assert _one_line_error(ckpt, verify=False).startswith(
        f"checkpoint {ckpt} has an unreadable config.json: The checkpoint you are trying to load has model type "
        "`no-such-architecture`"
    )


# --- saves that fail part-way ------------------------------------------------------------------


def _fail_writing_the_weights(monkeypatch, tokenizer):
    def save_half(tensors, path, metadata=None):
        save_file(tensors, path, metadata=metadata)
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", save_half)


def _fail_writing_the_tokenizer(monkeypatch, tokenizer):
    def save_part(directory, *args, **kwargs):
        (Path(directory) / "tokenizer.json").write_text('{"version": ')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tokenizer, "save_pretrained", save_part)


def _fail_renaming_into_place(monkeypatch, tokenizer):
    real = os.replace

    def replace(source, destination):
        if ".staging-" in Path(source).name:
            raise OSError(16, "Device or resource busy")
        real(source, destination)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize(
    "fail", [_fail_writing_the_weights, _fail_writing_the_tokenizer, _fail_renaming_into_place]
)
def test_failed_overwrite_keeps_the_previous_checkpoint(saved, ckpt, tokenizer, text_file, monkeypatch, fail):
    before = snapshot(ckpt)
    model, config, report = _compress("llama", tokenizer, text_file, keep=0.25)
    fail(monkeypatch, tokenizer)
    with pytest.raises(OSError):
        checkpoint.save(ckpt, model, tokenizer, config, report, base_model="replacement", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["ckpt"]  # no staging or retired dirs
    assert snapshot(ckpt) == before
    loaded, _ = checkpoint.load(ckpt)
    assert torch.equal(_logits(loaded), _logits(saved[1]))
    assert checkpoint.read_metadata(ckpt)["base_model"] == "tiny-llama"


def test_failed_first_save_leaves_nothing(tokenizer, text_file, tmp_path, monkeypatch):
    model, config, report = _compress("llama", tokenizer, text_file)
    _fail_writing_the_tokenizer(monkeypatch, tokenizer)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path / "parent" / "ckpt", model, tokenizer, config, report, base_model="x")
    assert list((tmp_path / "parent").iterdir()) == []


def test_a_checkpoint_is_readable_as_any_directory_made_by_mkdir(tokenizer, tmp_path, text_file):
    """The staging directory comes from mkdtemp (mode 0700): the saved one gets the umask's mode."""
    model, config, report = _compress("llama", tokenizer, text_file)
    old = os.umask(0o022)
    try:
        target = checkpoint.save(tmp_path / "shared", model, tokenizer, config, report, base_model="x")
    finally:
        os.umask(old)
    assert target.stat().st_mode & 0o777 == 0o755


def test_load_any_takes_a_checkpoint_or_a_dense_model(saved, model_dir):
    directory, model = saved
    loaded, _, metadata = checkpoint.load_any(str(directory), dtype=torch.float32)
    assert metadata == checkpoint.read_metadata(directory)
    torch.testing.assert_close(_logits(loaded), _logits(model.float()))
    dense, _, metadata = checkpoint.load_any(str(model_dir))
    assert metadata is None and next(dense.parameters()).dtype == torch.float32


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_factors_round_trip_in_one_call(bits, tokenizer, text_file, tmp_path):
    from svdmlp.int_weights import QuantizedMatrix

    model, config, report = _compress("qwen2", tokenizer, text_file, factor_bits=bits)
    assert report.quantization["bits"] == bits
    assert (
        0
        < report.quantization["factor_bytes"]
        < report.quantization["factor_bytes_before"] / (1.9 if bits == 8 else 3.5)
    )
    assert report.achieved_keep == pytest.approx(0.5, abs=0.1)  # parameters counted before quantization
    expected = _logits(model)
    directory = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    assert checkpoint.read_metadata(directory)["config"]["factor_bits"] == bits
    loaded, _ = checkpoint.load(directory)
    assert torch.equal(_logits(loaded), expected)
    mlp = _mlp(loaded, 0)
    assert isinstance(mlp.gate_up_u_t, QuantizedMatrix) and mlp.gate_up_u_t.scheme.bits == bits
    in_bf16, _ = checkpoint.load(directory, dtype=torch.bfloat16)  # a cast keeps the scales as stored
    assert torch.equal(_mlp(in_bf16, 0).gate_up_u_t.dequantized(), mlp.gate_up_u_t.dequantized())
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["model.layers.0.mlp.down_u_t.values"] == "model-00002-of-00005.safetensors"
    stored = load_file(directory / "model-00002-of-00005.safetensors")
    assert stored["model.layers.0.mlp.down_u_t.values"].dtype == (torch.int8 if bits == 8 else torch.uint8)


def test_a_factor_scheme_this_svdmlp_cannot_read_is_refused(tokenizer, text_file, tmp_path):
    model, config, report = _compress("llama", tokenizer, text_file, factor_bits=8)
    directory = checkpoint.save(tmp_path / "ckpt", model, tokenizer, config, report, base_model="tiny")
    edit_metadata(directory, lambda m: m["config"].update(factor_bits=3))
    assert _one_line_error(directory) == (
        f"{directory / 'svdmlp.json'} is corrupted: its compression config is malformed "
        "(factor bits must be one of [4, 8, 16], got 3)"
    )
    edit_metadata(directory, lambda m: m["config"].update(factor_bits=4))  # another scheme's shapes
    _edit_config(directory, lambda config: config["quantization_config"].update(factor_bits=4))
    assert "does not match its recorded architecture" in _one_line_error(directory, verify=False)


def test_every_file_has_the_same_mode(saved):
    import stat

    directory, _ = saved
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir() if path.is_file()}
    assert len(set(modes.values())) == 1, modes


def test_a_checkpoint_an_earlier_svdmlp_wrote_loads_to_the_same_logits():
    """tests/data/format4: a tiny Llama compressed with the default recipe by svdmlp as it was on
    2026-12-07 (format 4, before the renovation of compression and the record's digest), with the
    logits that version's ``svdmlp.load`` gave; loaded by this one, and by transformers, unchanged."""
    import transformers
    from safetensors.torch import load_file

    data = Path(__file__).parent / "data" / "format4"
    expected = load_file(data / "logits.safetensors")
    assert checkpoint.read_metadata(data / "checkpoint")["format_version"] == 4
    model, _ = checkpoint.load(data / "checkpoint", backend="torch")
    served = transformers.AutoModelForCausalLM.from_pretrained(data / "checkpoint")
    with torch.no_grad():
        for loaded in (model, served):
            assert torch.equal(loaded(input_ids=expected["input_ids"]).logits, expected["logits"])
