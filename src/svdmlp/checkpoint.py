"""Checkpoints: safetensors weights + ``svdmlp.json`` + the model's config and tokenizer.

A checkpoint directory holds:
- ``model-0000K-of-0000N.safetensors``: every tensor of the compressed model (low-rank factors in the
  kernels' layout, untouched dense weights), tied tensors stored once, one file per decoder layer
  (and one for the embeddings, the LM head, the rest), so that compression writes each layer as it is
  made and a big model is never whole in memory; ``model.safetensors.index.json`` maps every tensor to
  its file, as Hugging Face's sharded checkpoints do;
- ``svdmlp.json``: format version, the compression config, the per-layer report (ranks, achieved
  keep, errors), the calibration-token hash, library versions, the size and SHA-256 of every
  other file of the directory, and the SHA-256 of its own content (read and validated by
  :mod:`svdmlp.checkpoint_record`);
- ``config.json`` / ``generation_config.json`` and the tokenizer files, as Hugging Face writes them; the
  config also carries the ``quantization_config`` by which transformers and vLLM load the checkpoint
  (:mod:`svdmlp.serving.quant_config`).

Saves are atomic (a staging directory renamed into place) and never replace a directory that is
not an svdmlp checkpoint. Loads build the model skeleton with parameters on the meta device, swap in
empty low-rank modules of the recorded ranks, and assign the safetensors tensors in place. Loads first
check the record and every recorded file, so a changed config (``rope_theta``, ``rms_norm_eps``),
tokenizer or record is refused like changed weights.
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
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from svdmlp import arch, lazy, lowrank, models
from svdmlp.checkpoint_record import (
    DIGEST_KEY,
    FORMAT,
    FORMAT_VERSION,
    METADATA_FILE,
    digest,
    is_checkpoint,
    read_metadata,
    verify_files,
    weight_files,
)
from svdmlp.compression.report import CompressionReport
from svdmlp.config import CompressConfig
from svdmlp.paths import file_sha256, under_umask
from svdmlp.serving import quant_config, skeleton
from svdmlp.versions import installed_versions


def save(
    directory: str | os.PathLike,
    model: nn.Module,
    tokenizer,
    config: CompressConfig,
    report: CompressionReport,
    base_model: str,
    overwrite: bool = False,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint of the (compressed) ``model`` to ``directory`` atomically, its weights in
    ``dtype`` (None: as they are); a model whose weights are on disk (:mod:`svdmlp.lazy`) is read
    one unit at a time.

    Raises:
        FileExistsError: if ``directory`` exists and is not empty, unless it is an svdmlp checkpoint
            and ``overwrite`` is set. A directory that is not a checkpoint is never replaced.
    """
    target = Path(directory).expanduser().resolve()
    check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    staging.chmod(under_umask(0o777))  # mkdtemp's 0700 would keep the checkpoint from its other users
    try:
        shards, aliases = _write_weights(model, staging, dtype)
        _write_config(model, staging, quant_config.of_checkpoint(report.to_dict(), config.to_dict()))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        files = _file_records(staging)
        metadata = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "versions": installed_versions(("svdmlp", "torch", "transformers", "safetensors")),
            "base_model": models.recorded_name(base_model),
            "model_type": model.config.model_type,
            "dtype": str(dtype or _model_dtype(model)).removeprefix("torch."),
            "config": config.to_dict(),
            "report": report.to_dict(),
            "weights": {"files": shards},
            "files": files,
            "tied": aliases,
        }
        metadata[DIGEST_KEY] = digest(metadata)
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        _replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_config(model: nn.Module, staging: Path, spec: quant_config.QuantSpec) -> None:
    """The model's ``config.json`` with the ``quantization_config`` that lets transformers (after
    ``import svdmlp``) and vLLM (with svdmlp installed) load the checkpoint, and the guard that makes
    transformers without svdmlp refuse it (:data:`svdmlp.serving.quant_config.WEIGHTS_GUARD`)."""
    model.config.save_pretrained(staging)
    path = staging / "config.json"
    record = json.loads(path.read_text())
    if not record.get("architectures"):  # as a model's own save_pretrained names it: vLLM picks its class so
        record["architectures"] = [type(model).__name__]
    record["quantization_config"] = spec.to_dict()
    record["transformers_weights"] = quant_config.WEIGHTS_GUARD
    path.write_text(json.dumps(record, indent=2) + "\n")


def _model_dtype(model: nn.Module) -> torch.dtype:
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


def _write_weights(
    model: nn.Module, staging: Path, dtype: torch.dtype | None
) -> tuple[list[str], dict[str, str]]:
    """Write the model's tensors to ``staging``, one file per unit (:func:`svdmlp.lazy.units_of`) and
    one for the rest, each unit loaded only while it is written (one that
    :meth:`~svdmlp.lazy.DiskWeights.store` wrote in ``dtype`` is linked as it is); the files' names,
    and the alias -> stored-name map of tied tensors."""
    weights = lazy.of(model)
    spec = arch.of_model(model)
    units = weights.units if weights is not None else lazy.units_of(model, arch.decoder_layers(model, spec))
    aliases = {alias: group[0] for group in lazy.tensor_names(model).values() for alias in group[1:]}
    done: set[str] = set(aliases)
    weight_map, shards = {}, []

    def write(file: str, tensors: dict[str, torch.Tensor]) -> None:
        tensors = {  # integer tensors (quantized factors) as they are
            name: t.detach().to(dtype if dtype and t.is_floating_point() else t.dtype).contiguous()
            for name, t in tensors.items()
        }
        metadata = {"format": "pt", "svdmlp_format_version": str(FORMAT_VERSION)}
        save_file(tensors, staging / file, metadata=metadata)
        os.chmod(staging / file, under_umask(0o666))  # safetensors writes 0600; the other files are 0644
        weight_map.update(dict.fromkeys(tensors, file))
        done.update(tensors)
        shards.append(file)

    for position, unit in enumerate(units):
        file = lazy.shard_name(position, len(units))
        stored = None if weights is None else weights.stored.get(id(unit))
        if stored is not None and (dtype or weights.dtype) == weights.dtype:
            _link_or_copy(stored, staging / file)
            os.chmod(staging / file, under_umask(0o666))
            with safe_open(staging / file, framework="pt") as handle:
                names = list(handle.keys())
            weight_map.update(dict.fromkeys(names, file))
            done.update(names)
            shards.append(file)
            continue
        with lazy.held(model, unit):
            write(file, {name: t for name, t in lazy.unit_tensors(model, unit).items() if name not in done})
    names = lazy.tensor_names(model)
    rest = {
        group[0]: tensor
        for tensor in model.state_dict(keep_vars=True).values()
        for group in [names[id(tensor)]]
    }
    write(lazy.shard_name(len(units), len(units)), {name: t for name, t in rest.items() if name not in done})
    index = {"metadata": {"format": FORMAT}, "weight_map": dict(sorted(weight_map.items()))}
    (staging / lazy.INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return shards, aliases


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` as a hard link to ``source`` (no copy: the model still reads ``source``), or a copy
    where the two lie on different file systems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def check_target(directory: str | os.PathLike, overwrite: bool) -> None:
    """Raise unless a checkpoint may be written to ``directory``, before any work: FileExistsError for
    something there that may not be replaced, ValueError for a mount point (the finished checkpoint is
    renamed onto ``directory``, which fails there with EBUSY), PermissionError for a parent directory
    not writable (a read-only file system: the disk check then read "0.0 GB free")."""
    target = Path(directory).expanduser()
    if os.path.ismount(target):
        raise ValueError(
            f"{target} is a mount point, which a finished checkpoint cannot be renamed onto; "
            "give a directory inside it"
        )
    parent = target.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(
            f"cannot write to {parent} (for the checkpoint {target}): choose another output"
        )
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


def _file_records(root: Path) -> dict[str, dict]:
    """Size and SHA-256 of every file under ``root`` but the metadata, by relative POSIX path."""
    records = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and name != METADATA_FILE:
            records[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return records


def _replace(staging: Path, target: Path) -> None:
    """Move ``staging`` to ``target``; an old checkpoint there is removed only after the swap, and
    put back if the swap fails."""
    if not target.exists():
        os.replace(staging, target)
        return
    retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    previous = retired / "checkpoint"
    try:
        os.replace(target, previous)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(previous, target)
            raise
    except BaseException:
        if target.exists():  # the previous checkpoint is in place: nothing to keep in ``retired``
            shutil.rmtree(retired, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _read_weights(path: Path, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors of one weights file on ``device``, the floating ones in ``dtype`` (integer ones,
    quantized factors, as stored). Each is read straight into its final buffer: loading the whole file
    and then casting the model held both copies (a 1.5B checkpoint in bf16 scored in float32 peaked at
    10.1 GB, its float32 weights alone being 6.2 GB; reading straight into float32: 7.0 GB)."""
    with safe_open(path, framework="pt") as handle:
        return {
            key: lazy.read_tensor(handle, path, key, dtype, device)
            if handle.get_slice(key).get_dtype() in lazy.FLOATING
            else handle.get_tensor(key).to(device)
            for key in handle.keys()
        }


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


def _manifest(directory, config, metadata: dict) -> quant_config.QuantSpec:
    """Each compressed layer's ranks and the factors' bits, which the model's skeleton is built from:
    the manifest in ``config.json`` (format 4 on, the one transformers and vLLM read), checked against
    the report in ``svdmlp.json``; an older checkpoint's report alone."""
    recorded = quant_config.of_checkpoint(metadata["report"], metadata["config"])
    record = getattr(config, "quantization_config", None)
    if record is None:
        return recorded
    manifest = quant_config.parse(record)
    fields = ("layers", "factor_bits", "weights")
    if any(getattr(manifest, name) != getattr(recorded, name) for name in fields):
        raise ValueError(
            f"checkpoint {directory}: config.json's quantization_config and svdmlp.json's report record "
            "other ranks, factor bits or quantized weights (edited by hand?): compress again"
        )
    return manifest


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
        verify: check the size and SHA-256 of every recorded file (config, tokenizer, weights)
            before reading any of them.

    Returns:
        (model, tokenizer): the compressed model in eval mode, and its tokenizer.
    """
    metadata = read_metadata(directory)
    if verify:
        verify_files(directory, metadata)
    try:
        config = AutoConfig.from_pretrained(directory)
    except (ValueError, OSError) as err:
        raise ValueError(
            f"checkpoint {directory} has an unreadable config.json: {models.first_line(err)}"
        ) from None
    arch.for_config(config)  # an unsupported architecture is refused before anything is built
    if hasattr(config, "transformers_weights"):  # the guard for transformers alone (quant_config)
        delattr(config, "transformers_weights")
    compute = dtype or getattr(torch, metadata["dtype"])
    # Built in the compute dtype, as transformers builds a model it loads: buffers it keeps in float32
    # (the rotary frequencies) stay so, where casting the whole model afterwards rounded them.
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=compute)
    manifest = _manifest(directory, config, metadata)
    skeleton.install(model, manifest, compute)
    state = {}
    for name in weight_files(metadata):
        weights = Path(directory).expanduser() / name
        try:
            state.update(_read_weights(weights, compute, torch.device(device)))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"checkpoint weights {weights} cannot be read: {err}") from None
    for alias, stored_name in metadata.get("tied", {}).items():
        if stored_name in state:
            state[alias] = state[stored_name]
    expected = model.state_dict()
    mismatched = [
        (name, state[name].shape, tensor.shape)
        for name, tensor in expected.items()
        if name in state and state[name].shape != tensor.shape
    ]
    problems = models.weights_mismatch(
        expected.keys() - state.keys(), state.keys() - expected.keys(), mismatched
    )
    if not problems:
        try:
            model.load_state_dict(state, strict=True, assign=True)
        except RuntimeError as err:  # what the comparison above did not foresee, on one line
            problems = " ".join(str(err).split())
    if problems:
        raise ValueError(
            f"checkpoint {directory} does not match its recorded architecture: {problems}; "
            "its svdmlp.json and weights disagree (save the checkpoint again)"
        )
    _retie(model, metadata.get("tied", {}))
    models.check_finite(model, f"checkpoint {directory}")
    model = model.to(device=device).eval()
    lowrank.set_backend(model, backend)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return model, tokenizer


def upgrade(
    directory: str | os.PathLike, out: str | os.PathLike | None = None, overwrite: bool = False
) -> Path:
    """Write a checkpoint of any readable format again in this svdmlp's format (the same tensors, config
    and report), to ``out``, or in place (atomically) when ``out`` is None."""
    metadata = read_metadata(directory)
    model, tokenizer = load(directory)
    return save(
        directory if out is None else out,
        model,
        tokenizer,
        CompressConfig.from_dict(metadata["config"]),
        CompressionReport.from_dict(metadata["report"]),
        metadata["base_model"],
        overwrite=out is None or overwrite,
        dtype=getattr(torch, metadata["dtype"]),
    )


def load_any(target: str | None, backend: str = "auto", dtype: torch.dtype | None = None, device="cpu"):
    """``(model, tokenizer, metadata)`` of a checkpoint directory, or of any model
    :func:`svdmlp.models.load_dense` takes (metadata None; ``dtype`` None is float32 there)."""
    if target is not None and is_checkpoint(target):
        model, tokenizer = load(target, backend=backend, dtype=dtype, device=device)
        return model, tokenizer, read_metadata(target)
    model, tokenizer, _ = models.load_dense(target, dtype=dtype or torch.float32, device=device)
    return model, tokenizer, None
