"""``svdmlp upgrade``: a checkpoint of an earlier format written again in the current one, the same model."""

from __future__ import annotations

import json
import shutil

import torch
from transformers import AutoModelForCausalLM

import svdmlp
from conftest import VOCAB, run_cli
from svdmlp import checkpoint, checkpoint_record
from svdmlp.paths import file_sha256


def _as_format_3(directory) -> None:
    """What svdmlp wrote before format 4: no quantization_config in config.json."""
    path = directory / "config.json"
    record = json.loads(path.read_text())
    del record["quantization_config"], record["transformers_weights"]
    path.write_text(json.dumps(record))
    metadata = json.loads((directory / "svdmlp.json").read_text())
    metadata["format_version"] = 3
    del metadata[checkpoint_record.DIGEST_KEY]  # format 5 added it
    metadata["files"]["config.json"] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (directory / "svdmlp.json").write_text(json.dumps(metadata))


def _logits(model) -> torch.Tensor:
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return model(ids).logits


def test_upgrade_in_place_keeps_the_model_and_makes_it_loadable(compressed, tmp_path, capsys):
    old = shutil.copytree(compressed[2], tmp_path / "old")
    _as_format_3(old)
    before = _logits(svdmlp.load(old)[0])
    code, out, _ = run_cli(capsys, "upgrade", old)
    assert code == 0 and f"format 3 -> {checkpoint.FORMAT_VERSION}" in out
    assert checkpoint.read_metadata(old)["format_version"] == checkpoint.FORMAT_VERSION
    torch.testing.assert_close(_logits(svdmlp.load(old)[0]), before, rtol=0, atol=0)
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(old)), before, rtol=0, atol=0)


def test_upgrade_to_another_directory_leaves_the_old_one(compressed, tmp_path, capsys):
    old = shutil.copytree(compressed[2], tmp_path / "old")
    _as_format_3(old)
    code, _, _ = run_cli(capsys, "upgrade", old, "--out", tmp_path / "new")
    assert code == 0
    assert checkpoint.read_metadata(old)["format_version"] == 3
    assert checkpoint_record.servable(tmp_path / "new").layers
