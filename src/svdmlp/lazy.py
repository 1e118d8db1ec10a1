"""Weights that stay on disk: a model whose big modules are read from safetensors files for the
forward passes that use them and dropped after.

Compression works one decoder layer at a time, so it need hold only that one: a 1.5B model is 6 GB
in float32 and an 8B one 32 GB, one of their decoder layers 0.2 and 0.9 GB. :class:`DiskWeights`
keeps the parameters of its *units* (each decoder layer, the input embeddings, the LM head) as
hollow placeholders (right shape, dtype and device, one NaN behind every element: code that asks a
model for its device still gets the answer, and a forward that should not have run shows NaN);
a forward pre-hook loads a unit's parameters (memory-mapped reads, cast to the compute
dtype) and a forward hook drops them again, also when the forward raises. Code that reads weights
directly holds the unit for the block (:func:`held`). :meth:`DiskWeights.store` writes a unit (a
compressed layer) to a file of its own and reads it from there afterwards. An input embedding called
without gradients reads only the rows of its tokens (:func:`read_rows`): Qwen2.5-Coder-1.5B's is 0.93 GB
in float32, a window's 513 tokens 3 MB of it.

Tied parameters (an embedding shared with the LM head) stay one tensor: a parameter is replaced in
every slot that holds it. Holds are counted per parameter, so a tied weight stays loaded while any
unit that uses it is held. A forward pass with gradients must hold its unit until its backward has
run (as distillation and the output-gradient Grams do): autograd keeps the parameters it saw.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# The model attribute that holds its DiskWeights (a plain attribute: nn.Module keeps it out of state dicts).
_ATTRIBUTE = "_svdmlp_disk_weights"
# Bytes of a stored tensor read at a time when it is cast on loading. Read through the memory map,
# a 128k-vocabulary embedding stored in bf16 and loaded in float32 was 1.6 GB of resident memory
# while it was cast (the mapped file pages count, 0.5 GB, until the file is closed); read in blocks
# of rows with plain file reads, it is its 1.05 GB and one block.
READ_BYTES = 64 * 2**20
_STORED_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}
FLOATING = frozenset(_STORED_DTYPES)  # the safetensors dtype names that read_tensor casts


def _data_start(path: Path) -> tuple[int, dict]:
    """Where a safetensors file's tensor data begins, and its header (the format: an 8-byte
    little-endian header length, the JSON header, then the data)."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        return 8 + length, json.loads(file.read(length))


def read_tensor(handle, path: Path, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Tensor ``name`` of the safetensors file ``path`` (open as ``handle``) in ``dtype`` on ``device``.

    One that must be cast and is big is read a block of rows at a time into its final buffer, with
    file reads rather than through the map (see :data:`READ_BYTES`).
    """
    stored = handle.get_slice(name)
    shape, kind = stored.get_shape(), _STORED_DTYPES.get(stored.get_dtype())
    out = torch.empty(shape, dtype=dtype, device=device)
    if kind is None or kind == dtype or not shape or out.nbytes <= READ_BYTES:
        out.copy_(handle.get_tensor(name))
        return out
    start, header = _data_start(path)
    offset = start + header[name]["data_offsets"][0]
    row_bytes = (out.numel() // shape[0]) * torch.empty((), dtype=kind).element_size()
    rows = max(1, READ_BYTES // row_bytes)
    with open(path, "rb") as file:
        for first in range(0, shape[0], rows):
            count = min(rows, shape[0] - first)
            file.seek(offset + first * row_bytes)
            block = bytearray(count * row_bytes)
            file.readinto(block)
            out[first : first + count].copy_(torch.frombuffer(block, dtype=kind).view(count, *shape[1:]))
    return out


def read_rows(
    path: Path, name: str, rows: torch.Tensor, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Rows ``rows`` (sorted, distinct) of the tensor ``name`` of the safetensors file ``path``, in
    ``dtype`` on ``device``: one read of each row, nothing else of the tensor touched. None when it is
    not stored in one of the floating-point types :data:`FLOATING` names."""
    start, header = _data_start(path)
    info = header[name]
    kind, shape = _STORED_DTYPES.get(info["dtype"]), info["shape"]
    if kind is None:
        return None
    row_bytes = math.prod(shape[1:]) * torch.empty((), dtype=kind).element_size()
    offset = start + info["data_offsets"][0]
    with open(path, "rb") as file:
        data = b"".join(os.pread(file.fileno(), row_bytes, offset + row * row_bytes) for row in rows.tolist())
    read = torch.frombuffer(bytearray(data), dtype=kind).view(len(rows), *shape[1:])
    return read.to(device=device, dtype=dtype)


def tensor_files(directory: str | Path) -> dict[str, Path]:
    """Which file of a Hugging Face model directory holds each tensor (one file, or shards and their index)."""
    root = Path(directory)
    index = root / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: root / file for name, file in weight_map.items()}
    single = root / SINGLE_FILE
    if not single.is_file():
        raise ValueError(f"{root} holds no {SINGLE_FILE} and no {INDEX_FILE}")
    with safe_open(single, framework="pt") as handle:
        return dict.fromkeys(handle.keys(), single)


class _OnDisk:
    """One on-disk parameter: its hollow placeholder, where it lies, and its loaded copy while held,
    with the slots it was put in."""

    def __init__(self, placeholder: nn.Parameter, path: Path, name: str):
        self.placeholder, self.path, self.name = placeholder, path, name
        self.loaded: nn.Parameter | None = None
        self.slots: list[tuple[nn.Module, str]] = []
        self.holds = 0


@dataclass
class _Lookup:
    """An embedding's call that read only its tokens' rows, and the padding row it set aside."""

    entry: _OnDisk
    padding_idx: int | None


class DiskWeights:
    """The on-disk parameters of a model's units (see the module docstring).

    Args:
        model: the model, its units' parameters on the meta device (replaced by hollow placeholders).
        files: the file holding each tensor, by state-dict name.
        units: the modules loaded one at a time (each decoder layer, the embeddings, the LM head).
        dtype, device: what the parameters are cast to and where they are put when loaded.
        scratch: the directory :meth:`store` writes units to, in ``dtype`` (the checkpoint's shards,
            see :func:`shard_name`).
    """

    def __init__(
        self,
        model: nn.Module,
        files: dict[str, Path],
        units: list[nn.Module],
        dtype: torch.dtype,
        device: str | torch.device = "cpu",
        scratch: str | Path | None = None,
    ):
        self.model, self.dtype, self.device, self.units = model, dtype, torch.device(device), list(units)
        self._entries: dict[int, _OnDisk] = {}  # id(placeholder or loaded copy) -> its entry
        names = tensor_names(model)
        for unit in self.units:
            for parameter in unit.parameters():
                if parameter.device.type != "meta":  # resident, or tied to one placed already
                    continue
                found = [name for name in names[id(parameter)] if name in files]
                if not found:
                    raise ValueError(f"no weights file holds {names[id(parameter)][0]}")
                placeholder = self._hollow(parameter)
                self._entries[id(placeholder)] = _OnDisk(placeholder, files[found[0]], found[0])
                self._swap(parameter, placeholder)
            unit.register_forward_pre_hook(self._on_call)
            unit.register_forward_hook(self._on_return, always_call=True)
        # id(unit) -> what each running forward holds, or the lookup it made of an embedding's rows
        self._calls: dict[int, list[list[_OnDisk] | _Lookup]] = {}
        self.scratch = Path(scratch) if scratch is not None else None
        self.stored: dict[int, Path] = {}  # id(unit) -> the file store() wrote it to, in ``dtype``
        setattr(model, _ATTRIBUTE, self)

    def _on_call(self, module: nn.Module, args) -> tuple[torch.Tensor] | None:
        entry, rows = self._rows_only(module, args), None
        if entry is not None:
            tokens, ids = torch.unique(args[0], return_inverse=True)
            rows = read_rows(entry.path, entry.name, tokens.cpu(), self.dtype, self.device)
        if rows is None:
            self._calls.setdefault(id(module), []).append(self._acquire(module))
            return None
        # padding_idx names a row of the whole table and only masks its gradient, which is not taken
        lookup = _Lookup(entry, module.padding_idx)
        module._parameters["weight"], module.padding_idx = nn.Parameter(rows, requires_grad=False), None
        self._calls.setdefault(id(module), []).append(lookup)
        return (ids,)

    def _on_return(self, module: nn.Module, args, output) -> None:
        pending = self._calls.get(id(module))
        if not pending:  # none when the call was interrupted in :meth:`_on_call` (which cleaned up)
            return
        held = pending.pop()
        if isinstance(held, _Lookup):  # the rows go, the placeholder comes back
            module._parameters["weight"], module.padding_idx = held.entry.placeholder, held.padding_idx
        else:
            self._release(held)

    def _rows_only(self, module: nn.Module, args) -> _OnDisk | None:
        """The on-disk weight of an input embedding called on token ids, not loaded and needing no
        gradient: a lookup then reads only its tokens' rows (:meth:`_on_call`; a table not stored in
        floating point is loaded whole after all). None for any other call, which loads the unit whole."""
        if not isinstance(module, nn.Embedding) or module.max_norm is not None:
            return None
        entry = self._entries.get(id(module.weight))
        if entry is None or entry.holds or len(args) != 1 or not torch.is_tensor(args[0]):
            return None
        if args[0].is_floating_point() or torch.is_grad_enabled() and entry.placeholder.requires_grad:
            return None
        return entry

    def _hollow(self, like: nn.Parameter) -> nn.Parameter:
        """A placeholder for ``like``: its shape, the loaded dtype and device, one NaN in memory."""
        nan = torch.full((), float("nan"), dtype=self.dtype, device=self.device)
        return nn.Parameter(nan.expand(like.shape), requires_grad=like.requires_grad)

    def _of(self, module: nn.Module) -> list[_OnDisk]:
        """The entries of ``module``'s on-disk parameters, each once."""
        entries = {}
        for parameter in module.parameters():
            entry = self._entries.get(id(parameter))
            if entry is not None:
                entries[id(entry)] = entry
        return list(entries.values())

    def _swap(self, current: nn.Parameter, new: nn.Parameter) -> list[tuple[nn.Module, str]]:
        """Put ``new`` in every slot of the model that holds ``current`` (tied slots stay tied); the slots."""
        slots = []
        for module in self.model.modules():
            for attribute, parameter in module._parameters.items():
                if parameter is current:
                    module._parameters[attribute] = new
                    slots.append((module, attribute))
        return slots

    def _acquire(self, module: nn.Module) -> list[_OnDisk]:
        """Load ``module``'s on-disk parameters not loaded yet; the entries now held for it."""
        entries = self._of(module)
        by_file: dict[Path, list[_OnDisk]] = {}
        for entry in entries:
            if entry.holds == 0:
                by_file.setdefault(entry.path, []).append(entry)
        read = []
        try:
            for path, waiting in by_file.items():
                with safe_open(path, framework="pt") as handle:  # closed (unmapped) once read
                    for entry in waiting:
                        tensor = read_tensor(handle, path, entry.name, self.dtype, self.device)
                        entry.loaded = nn.Parameter(tensor, requires_grad=entry.placeholder.requires_grad)
                        self._entries[id(entry.loaded)] = entry
                        entry.slots = self._swap(entry.placeholder, entry.loaded)
                        read.append(entry)
        except BaseException:  # interrupted while reading (Ctrl-C): nothing stays loaded without a hold
            for entry in read:
                self._unload(entry)
            raise
        for entry in entries:
            entry.holds += 1
        return entries

    def _release(self, entries: list[_OnDisk]) -> None:
        """Drop the hold of ``entries`` (those of one :meth:`_acquire`, whatever the module holds now).

        The placeholder goes back into the slots the loaded copy was put in, also those of modules no
        longer in the model: compression replaces a held layer's dense projections, which distillation
        keeps aside as its teacher, and a loaded copy left in them stayed in memory (every layer's dense
        MLP, 4.5 GB of Qwen2.5-Coder-1.5B's 9.9 GB peak).
        """
        for entry in entries:
            entry.holds -= 1
            if entry.holds == 0:
                self._unload(entry)

    def _unload(self, entry: _OnDisk) -> None:
        """Put ``entry``'s placeholder back in every slot its loaded copy went into, and drop the copy."""
        for module, attribute in entry.slots:
            if module._parameters.get(attribute) is entry.loaded:
                module._parameters[attribute] = entry.placeholder
        self._swap(entry.loaded, entry.placeholder)  # and any slot it was put in since
        del self._entries[id(entry.loaded)]
        entry.loaded, entry.slots = None, []

    @contextmanager
    def held(self, *modules: nn.Module) -> Iterator[None]:
        """Inside the block, the parameters of ``modules`` are loaded."""
        held = []
        try:
            for module in modules:
                held.append(self._acquire(module))
            yield
        finally:
            for entries in held:
                self._release(entries)

    def shard(self, unit: nn.Module) -> Path:
        """The file in :attr:`scratch` that :meth:`store` writes ``unit`` to."""
        if self.scratch is None:
            raise ValueError("these disk weights have no scratch directory to store units in")
        return self.scratch / shard_name(self.units.index(unit), len(self.units))

    def adopt(self, unit: nn.Module) -> None:
        """Read ``unit`` from the file :meth:`store` wrote it to in an earlier run (a stopped compression
        continuing), as if this run had stored it; its parameters not on disk yet (the factors of a
        low-rank module installed on the meta device) become on-disk parameters, and its saved buffers
        on the meta device (a quantized weight's values and scales) are read into memory, where
        :meth:`store` keeps them."""
        path = self.shard(unit)
        names = tensor_names(self.model)
        with safe_open(path, framework="pt") as handle:
            stored = set(handle.keys())
            missing = sorted(set(unit_tensors(self.model, unit)) - stored)
            if missing:
                raise ValueError(f"{path} holds no {missing[0]}: it was written for another model or plan")
            for module in unit.modules():
                for key, buffer in module._buffers.items():
                    if buffer is not None and buffer.is_meta and id(buffer) in names:
                        module._buffers[key] = handle.get_tensor(names[id(buffer)][0])
        self._read_from(unit, path)

    def _read_from(self, unit: nn.Module, path: Path) -> None:
        """Read ``unit``'s parameters from ``path`` (which holds them all) from now on."""
        names = tensor_names(self.model)
        for parameter in list(unit.parameters()):
            entry = self._entries.get(id(parameter))
            if entry is None:  # in memory only, or on the meta device: it becomes an on-disk parameter
                placeholder = self._hollow(parameter)
                entry = self._entries[id(placeholder)] = _OnDisk(placeholder, path, "")
                self._swap(parameter, placeholder)
            entry.path, entry.name = path, names[id(parameter)][0]
        self.stored[id(unit)] = path

    def store(self, unit: nn.Module) -> Path:
        """Write every parameter of ``unit`` in :attr:`dtype` to its shard in :attr:`scratch` (atomically)
        and read them from there from now on; the ones only in memory (new factors) are dropped. Its
        saved buffers (quantized factors) are written too and stay in memory."""
        path = self.shard(unit)
        with self.held(unit):
            tensors = {name: t.detach().contiguous() for name, t in unit_tensors(self.model, unit).items()}
            save_atomic(tensors, path, {"format": "pt"})
        self._read_from(unit, path)
        return path


def save_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write ``tensors`` to the safetensors file ``path`` with a digest of their values in its metadata
    (:func:`intact` checks it); the file reaches the disk (fsync) before it replaces ``path``, so a stop or
    a crash while writing leaves the old file, never part of the new one."""
    partial = path.with_name(path.name + ".partial")
    digest = _digest(sorted(tensors), tensors.__getitem__)
    save_file(tensors, partial, metadata={**metadata, DIGEST: digest})
    with open(partial, "rb") as written:
        os.fsync(written.fileno())
    partial.replace(path)


# The metadata key of the digest save_atomic writes: the SHA-256 of each tensor's name, dtype, shape and
# bytes, in the order of their names.
DIGEST = "svdmlp_sha256"


def _digest(names: Iterable[str], get: Callable[[str], torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in names:
        tensor = get(name).detach().contiguous().cpu()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def saved_digest(path: Path) -> str | None:
    """The digest :func:`save_atomic` recorded in ``path`` (None for a file without one)."""
    with safe_open(path, framework="pt") as handle:
        return (handle.metadata() or {}).get(DIGEST)


def saved_metadata(handle) -> dict[str, str]:
    """The metadata a file :func:`save_atomic` wrote was given (its digest left out)."""
    return {key: value for key, value in (handle.metadata() or {}).items() if key != DIGEST}


def intact(path: Path, digest: str | None = None) -> bool:
    """Whether ``path`` is a whole file that :func:`save_atomic` wrote, its tensors as they were written
    (and its digest ``digest``, when given): what a stopped run checks before it trusts a file it kept.
    Reads the whole file."""
    try:
        with safe_open(path, framework="pt") as handle:
            recorded = (handle.metadata() or {}).get(DIGEST)
            if recorded is None or digest is not None and recorded != digest:
                return False
            return _digest(sorted(handle.keys()), handle.get_tensor) == recorded
    except (OSError, SafetensorError, ValueError):  # missing, truncated, an unreadable header
        return False


def tensor_names(model: nn.Module) -> dict[int, list[str]]:
    """Every state-dict name of each tensor of ``model``, by the tensor's identity (tied ones share)."""
    names: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names.setdefault(id(tensor), []).append(name)
    return names


def unit_tensors(model: nn.Module, unit: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors of ``unit`` that ``model``'s state dict holds (parameters and saved buffers), by
    their first state-dict name."""
    names = tensor_names(model)
    found = (*unit.parameters(), *unit.buffers())
    return {names[id(t)][0]: t for t in found if id(t) in names}


def shard_name(position: int, units: int) -> str:
    """The file of unit ``position`` among ``units`` (the last file, ``units``, holds the rest of the model)."""
    return f"model-{position + 1:05d}-of-{units + 1:05d}.safetensors"


def units_of(model: nn.Module, layers: nn.ModuleList) -> list[nn.Module]:
    """The modules a model is stored and loaded by: its input embeddings, decoder layers and LM
    head (when it is a module of its own), in that order."""
    units = [model.get_input_embeddings(), *layers]
    head = model.get_output_embeddings()
    if head is not None and all(head is not unit for unit in units):
        units.append(head)
    return units


def of(model: nn.Module) -> DiskWeights | None:
    """The model's :class:`DiskWeights`, or None when it is wholly in memory."""
    return getattr(model, _ATTRIBUTE, None)


@contextmanager
def held(model: nn.Module, *modules: nn.Module) -> Iterator[None]:
    """Inside the block the parameters of ``modules`` are loaded (nothing to do for a model in memory)."""
    weights = of(model)
    if weights is None:
        yield
        return
    with weights.held(*modules):
        yield


def store(model: nn.Module, unit: nn.Module) -> Path | None:
    """Write ``unit`` as it is now to the model's scratch directory and read it from there from now on
    (:meth:`DiskWeights.store`), and return that file: what changes a held unit's weights in place must
    do before it lets go, or the next forward reads the old ones. Nothing to do for a model in memory."""
    weights = of(model)
    return weights.store(unit) if weights is not None else None
