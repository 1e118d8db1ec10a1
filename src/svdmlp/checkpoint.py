"""Checkpoints: safetensors weights + ``svdmlp.json`` + the model's config and tokenizer.

A checkpoint directory holds:
- ``model.safetensors``: every tensor of the compressed model (low-rank factors in the kernels'
  layout, untouched dense weights), tied tensors stored once;
- ``svdmlp.json``: format version, the compression config, the per-layer report (ranks, achieved
  keep, errors), the calibration-token hash, library versions, and the weights' size and SHA-256;
- ``config.json`` / ``generation_config.json`` and the tokenizer files, as Hugging Face writes them.

Saves are atomic (a staging directory renamed into place) and never replace a directory that is
not an svdmlp checkpoint. Loads build the model skeleton with parameters on the meta device, swap in
empty low-rank modules of the recorded ranks, and assign the safetensors tensors in place.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn as nn
from accelerate import init_empty_weights
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from svdmlp import arch, lowrank
from svdmlp.compress.report import CompressionReport
from svdmlp.config import CompressConfig
from svdmlp.paths import file_sha256
from svdmlp.versions import installed_versions

METADATA_FILE = "svdmlp.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "svdmlp"
FORMAT_VERSION = 1


def is_checkpoint(directory: str | os.PathLike) -> bool:
    return (Path(directory) / METADATA_FILE).is_file()


def save(
    directory: str | os.PathLike,
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    report: CompressionReport,
    base_model: str,
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint of the (compressed) ``model`` to ``directory`` atomically.

    Raises:
        FileExistsError: if ``directory`` exists and is not empty, unless it is an svdmlp checkpoint
            and ``overwrite`` is set. A directory that is not a checkpoint is never replaced.
    """
    target = Path(directory).expanduser().resolve()
    check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        tensors, aliases = _unique_tensors(model)
        weights = staging / WEIGHTS_FILE
        save_file(tensors, weights, metadata={"format": "pt", "svdmlp_format_version": str(FORMAT_VERSION)})
        model.config.save_pretrained(staging)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        metadata = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": installed_versions(("svdmlp", "torch", "transformers", "safetensors")),
            "base_model": base_model,
            "model_type": model.config.model_type,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "config": config.to_dict(),
            "report": report.to_dict(),
            "weights": {
                "file": WEIGHTS_FILE,
                "bytes": weights.stat().st_size,
                "sha256": file_sha256(weights),
            },
            "tied": aliases,
        }
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        _replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def check_target(directory: str | os.PathLike, overwrite: bool) -> None:
    """Raise FileExistsError unless a checkpoint may be written to ``directory``."""
    target = Path(directory).expanduser()
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    if not target.is_dir() or not is_checkpoint(target):
        raise FileExistsError(
            f"{target} exists and is not an svdmlp checkpoint; refusing to replace it (choose another output)"
        )
    if not overwrite:
        raise FileExistsError(
            f"{target} already holds an svdmlp checkpoint; pass overwrite=True (--overwrite)"
        )


def _replace(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an old checkpoint there is removed only after the swap."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    os.replace(target, retired / "checkpoint")
    os.replace(staging, target)
    shutil.rmtree(retired, ignore_errors=True)


def _unique_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict with shared (tied) tensors stored once, and the alias → stored-name map."""
    tensors, aliases, seen = {}, {}, {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            tensors[name] = tensor.detach().contiguous()
    return tensors, aliases


def read_metadata(directory: str | os.PathLike) -> dict:
    """The parsed ``svdmlp.json`` of a checkpoint, with clear errors for anything else."""
    root = Path(directory).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"checkpoint directory {root} does not exist")
    path = root / METADATA_FILE
    if not path.is_file():
        raise ValueError(f"{root} is not an svdmlp checkpoint (no {METADATA_FILE})")
    try:
        metadata = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is corrupted: {err}") from None
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format {metadata.get('format')!r} version {metadata.get('format_version')!r}; "
            f"this svdmlp reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    return metadata


def verify_weights(directory: str | os.PathLike, metadata: dict) -> Path:
    """Check the weights file against the size and SHA-256 recorded at save time."""
    expected = metadata["weights"]
    path = Path(directory).expanduser() / expected["file"]
    if not path.is_file():
        raise ValueError(f"checkpoint weights {path} are missing")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise ValueError(
            f"checkpoint weights {path} are truncated or altered: {size} bytes, expected {expected['bytes']}"
        )
    if file_sha256(path) != expected["sha256"]:
        raise ValueError(
            f"checkpoint weights {path} are corrupted: SHA-256 differs from the one recorded at save time"
        )
    return path


def _retie(model: nn.Module, aliases: dict[str, str]) -> None:
    """Make each alias the very tensor it was tied to at save time.

    ``load_state_dict(assign=True)`` wraps every entry in its own Parameter, so tied weights (an
    embedding shared with the LM head) would come back as two parameters that a later ``.to(dtype)``
    copies apart. Sharing the module attribute restores one tensor, as in the saved model.
    """
    for alias, stored_name in aliases.items():
        owner, _, attribute = alias.rpartition(".")
        source_owner, _, source_attribute = stored_name.rpartition(".")
        shared = getattr(model.get_submodule(source_owner), source_attribute)
        setattr(model.get_submodule(owner), attribute, shared)


def load(
    directory: str | os.PathLike,
    backend: str = "auto",
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    verify: bool = True,
):
    """Load a checkpoint written by :func:`save`.

    Args:
        directory: the checkpoint directory.
        backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch" or "triton".
        dtype: compute dtype; None keeps the stored one.
        device: where the model runs.
        verify: check the weights' size and SHA-256 before loading.

    Returns:
        (model, tokenizer): the compressed model in eval mode, and its tokenizer.
    """
    metadata = read_metadata(directory)
    weights = verify_weights(directory, metadata) if verify else Path(directory) / metadata["weights"]["file"]
    config = AutoConfig.from_pretrained(directory)
    spec = arch.for_config(config)
    stored = getattr(torch, metadata["dtype"])
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=stored)
    report = CompressionReport.from_dict(metadata["report"])
    for layer in report.layers:
        if layer.status == "compressed":
            lowrank.install(model, spec, layer.index, layer.ranks, stored, "meta")
    try:
        state = load_file(weights)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"checkpoint weights {weights} cannot be read: {err}") from None
    for alias, stored_name in metadata.get("tied", {}).items():
        state[alias] = state[stored_name]
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as err:
        raise ValueError(f"checkpoint {directory} does not match its recorded architecture: {err}") from None
    _retie(model, metadata.get("tied", {}))
    model = model.to(device=device, dtype=dtype or stored).eval()
    lowrank.set_backend(model, backend)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return model, tokenizer
