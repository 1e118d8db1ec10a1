"""The catalogue of bad inputs (docs/bad-inputs.md, issue 52) run through the command line: each case
exits with its status, says what is wrong on one line, and never shows a traceback.

Each case is (id, item of issue 52, how it is made, expected exit status, a phrase of its message). A
maker gets the ``compressed`` fixture's (model_dir, text, checkpoint), a scratch directory and
pytest's monkeypatch, changes nothing it did not copy, and returns the command's arguments.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import edit_metadata, run_cli

TINY_EVAL = ["--seq-len", "32", "--max-windows", "1"]


def _copy(ckpt, tmp) -> Path:
    return Path(shutil.copytree(ckpt, tmp / "ckpt"))


def _edited(edit):
    """A maker: a copy of the checkpoint with ``edit`` applied to its svdmlp.json (sealed again)."""

    def make(ckpt, tmp):
        copy = _copy(ckpt, tmp)
        edit_metadata(copy, edit)
        return copy

    return make


def _rank(value):
    return _edited(lambda m: m["report"]["layers"][0]["projections"][0].update(rank=value))


def _record_file(copy: Path, name: str) -> None:
    data = (copy / name).read_bytes()
    record = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    edit_metadata(copy, lambda m: m["files"].update({name: record}))


def _fewer_layers(ckpt, tmp):
    copy = _copy(ckpt, tmp)
    path = copy / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_hidden_layers": 1}))
    _record_file(copy, "config.json")
    return copy


def _nested(ckpt, tmp):
    copy = _copy(ckpt, tmp)
    (copy / "svdmlp.json").write_text("[" * 200_000 + "]" * 200_000)
    return copy


def _pickled(model_dir, tmp) -> Path:
    directory = Path(shutil.copytree(model_dir, tmp / "pickled"))
    torch.save(load_file(directory / "model.safetensors"), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    return directory


def _unsealed_edit(ckpt, tmp):
    copy = _copy(ckpt, tmp)
    path = copy / "svdmlp.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "base_model": "/elsewhere/model"}))
    return copy


def _nan_weights(ckpt, tmp):
    copy = _copy(ckpt, tmp)
    shard = copy / "model-00001-of-00005.safetensors"  # the embeddings
    save_file({k: torch.full_like(t, float("nan")) for k, t in load_file(shard).items()}, shard)
    _record_file(copy, shard.name)
    return copy


# (id, item, maker(paths, tmp, monkeypatch) -> argv, exit status, phrase)
CASES = [
    # Item 1: a file the user named for --json.
    ("json-is-a-directory", 1, lambda p, t, m: ["info", p[2], "--json", t], 2, "is a directory; name a file"),
    # Item 2: a base model recorded as a relative path names another model from each directory.
    (
        "relative-base-model",
        2,
        lambda p, t, m: ["eval", _edited(lambda r: r.update(base_model="./dense"))(p[2], t), *TINY_EVAL],
        2,
        "relative path './dense'",
    ),
    # Item 6: svdmlp.json's structure and types, validated as it is read.
    (
        "rank-negative",
        6,
        lambda p, t, m: ["generate", _rank(-32)(p[2], t), "--prompt", "x"],
        2,
        "of rank -32",
    ),
    ("rank-as-text", 6, lambda p, t, m: ["info", _rank("abc")(p[2], t)], 2, "of rank 'abc'"),
    (
        "layer-beyond-the-model",
        6,
        lambda p, t, m: (
            ["generate", _edited(lambda r: r["report"]["layers"][0].update(index=99))(p[2], t)]
            + ["--prompt", "x"]
        ),
        2,
        "records layer 99, but the model of config.json has 2 layers",
    ),
    (
        "report-removed",
        6,
        lambda p, t, m: ["info", _edited(lambda r: r.pop("report"))(p[2], t)],
        2,
        "report is missing",
    ),
    (
        "dtype-unknown",
        6,
        lambda p, t, m: ["generate", _edited(lambda r: r.update(dtype="float99"))(p[2], t), "--prompt", "x"],
        2,
        "dtype 'float99'",
    ),
    (
        "layers-edited-with-their-hash",
        6,
        lambda p, t, m: ["generate", _fewer_layers(p[2], t), "--prompt", "x"],
        2,
        "records layer 1, but the model of config.json has 1 layers",
    ),
    ("json-nested-too-deeply", 6, lambda p, t, m: ["info", _nested(p[2], t)], 2, "nested too deeply"),
    (
        "empty-prompt-hf",
        6,
        lambda p, t, m: ["generate", p[2], "--prompt", "", "--engine", "hf"],
        2,
        "the prompt is empty",
    ),
    # Item 7: pickles are never loaded; svdmlp.json is sealed by its own SHA-256.
    (
        "pickled-model",
        7,
        lambda p, t, m: ["generate", _pickled(p[0], t), "--prompt", "x"],
        2,
        "holds pickled weights only (pytorch_model.bin)",
    ),
    (
        "pickled-base-model",
        7,
        lambda p, t, m: (
            ["eval", _edited(lambda r: r.update(base_model=str(_pickled(p[0], t))))(p[2], t)]
            + ["--text", p[1], *TINY_EVAL]
        ),
        2,
        "holds pickled weights only",
    ),
    (
        "svdmlp-json-edited",
        7,
        lambda p, t, m: ["info", _unsealed_edit(p[2], t)],
        2,
        "was edited after it was saved",
    ),
    (
        "format-4-without-digest-loads",
        7,
        lambda p, t, m: ["info", _edited(lambda r: r.update(format_version=4) or r.pop("sha256"))(p[2], t)],
        0,
        "",
    ),
    # Item 8: limits checked before any work.
    (
        "seq-len-past-the-context",
        8,
        lambda p, t, m: ["eval", p[2], "--text", p[1], "--seq-len", "100000", "--no-baseline"],
        2,
        "longer than the model's context of 256 positions",
    ),
    (
        "hf-generation-past-the-context",
        8,
        lambda p, t, m: ["generate", p[2], "--prompt", "x", "--engine", "hf", "--max-new-tokens", "300"],
        2,
        "exceeds the model's context of 256 tokens",
    ),
    (
        "max-new-tokens-absurd",
        8,
        lambda p, t, m: ["generate", p[2], "--prompt", "x", "--max-new-tokens", "1000000000"],
        2,
        "+ 1000000000 new tokens exceeds the model's context",
    ),
    (
        "nan-weights",
        8,
        lambda p, t, m: ["eval", _nan_weights(p[2], t), "--text", p[1], *TINY_EVAL, "--no-baseline"],
        2,
        "contain NaN or inf (model.embed_tokens.weight)",
    ),
    (
        "temperature-nan",
        8,
        lambda p, t, m: ["generate", p[2], "--prompt", "x", "--temperature", "nan"],
        2,
        "argument --temperature: expected a finite number, got 'nan'",
    ),
    # Item 9: what is in the way is named before any work.
    (
        "calibration-file-is-a-directory",
        9,
        lambda p, t, m: ["compress", p[0], "--calib", t, "--out", t / "out"],
        2,
        "is a directory; name a UTF-8 text file",
    ),
    (
        "out-is-a-mount-point",
        9,
        lambda p, t, m: (
            m.setattr(os.path, "ismount", lambda path: Path(path) == t / "mnt")
            or ["upgrade", p[2], "--out", t / "mnt"]
        ),
        2,
        "is a mount point",
    ),
    (
        "out-not-writable",
        9,
        lambda p, t, m: (
            m.setattr(os, "access", lambda path, mode: Path(path) != t)
            or ["upgrade", p[2], "--out", t / "new"]
        ),
        2,
        "cannot write to ",
    ),
    (
        "top-p-out-of-range",
        9,
        lambda p, t, m: ["generate", "/no/such/model", "--prompt", "x", "--top-p", "1.5"],
        2,
        "argument --top-p: expected a number in (0, 1], got 1.5",
    ),
    (
        "seq-len-zero",
        9,
        lambda p, t, m: ["eval", "/no/such/model", "--seq-len", "0"],
        2,
        "argument --seq-len: expected an integer >= 1, got 0",
    ),
]


@pytest.mark.parametrize(("case", "item", "make", "status", "phrase"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(compressed, tmp_path, monkeypatch, capsys, case, item, make, status, phrase):
    argv = [str(a) for a in make(compressed, tmp_path, monkeypatch)]
    try:
        code, _, err = run_cli(capsys, *argv)
        # compress states its prediction first; then the error boundary's one line
        lines = [line for line in err.strip().splitlines() if not line.startswith("svdmlp: predicted: ")]
        if code == 2:
            assert len(lines) == 1 and lines[0].startswith(f"svdmlp {argv[0]}: error: "), err
    except SystemExit as exit_info:  # argparse: a usage line, then the error
        code, err = exit_info.code, capsys.readouterr().err
        assert err.strip().splitlines()[-1].startswith(f"svdmlp {argv[0]}: error: argument "), err
    assert code == status, (case, err)
    assert "Traceback" not in err and phrase in err, (case, err)
