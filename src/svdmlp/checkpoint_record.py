"""A checkpoint's ``svdmlp.json``: read, validated and checked against the files it records, without
torch (``svdmlp info`` and ``svdmlp serve``'s check answer in a fraction of a second; importing torch and
transformers took 9 of the 11 seconds ``svdmlp info`` did). :mod:`svdmlp.checkpoint` writes the record
and loads the model it describes.

Everything svdmlp reads from the record is validated as it is read (:func:`validate`): a hand-edited
rank, layer, dtype or missing key is one ValueError naming it, never a crash deep inside a load. From
format 5 the record carries the SHA-256 of its own content (:func:`digest`), so that an edit of what no
file hash covers (the base model, the ranks, the file hashes themselves) is refused too. It is a check
against accidents and careless edits, not a signature: whoever edits the record can compute it again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from svdmlp.arch import PROJECTIONS
from svdmlp.compression.report import LayerRecord, ProjectionRecord
from svdmlp.config import CompressConfig
from svdmlp.paths import file_sha256
from svdmlp.serving import quant_config

METADATA_FILE = "svdmlp.json"
FORMAT = "svdmlp"
# Version 1 recorded the size and SHA-256 of its one weights file alone ("weights": {"file", ...});
# version 2 records them for every file of the directory but svdmlp.json ("files"); version 3 stores
# the weights in one file per unit (embeddings, each decoder layer, LM head, rest): "weights": {"files"};
# version 4 adds the quantization_config to config.json that transformers and vLLM load it by;
# version 5 adds the SHA-256 of svdmlp.json's own content (DIGEST_KEY).
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)
DIGEST_KEY = "sha256"
DIGEST_SINCE = 5
# The dtypes svdmlp saves weights in (torch's floating dtypes by name).
DTYPES = ("float32", "bfloat16", "float16", "float64")
_STATUSES = ("compressed", "skipped", "quantized")  # quantized: the weights (--quantize), corrected or not


def is_checkpoint(directory: str | os.PathLike) -> bool:
    return (Path(directory) / METADATA_FILE).is_file()


def digest(metadata: dict) -> str:
    """SHA-256 of the record without its digest, as canonical JSON (sorted keys, no spaces): the same
    for the record as saved and as read back."""
    content = {key: value for key, value in metadata.items() if key != DIGEST_KEY}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_metadata(directory: str | os.PathLike) -> dict:
    """The parsed and validated ``svdmlp.json`` of a checkpoint; a one-line ValueError for anything else."""
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
    except RecursionError:  # json nests no deeper than Python's recursion limit
        raise ValueError(f"{path} is corrupted: its JSON is nested too deeply") from None
    validate(metadata, path, _layer_count(root))
    return metadata


def _layer_count(root: Path) -> int | None:
    """``num_hidden_layers`` of the checkpoint's config.json; None where it cannot be read (the file
    check or the load then says why)."""
    try:
        config = json.loads((root / "config.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    count = config.get("num_hidden_layers") if isinstance(config, dict) else None
    return count if _is_int(count) else None


def validate(metadata, path: Path, layers: int | None = None) -> None:
    """Raise a one-line ValueError unless ``metadata`` is a record :func:`svdmlp.checkpoint.save` could
    have written: the format, the digest (format 5 on), the records of the files, the strings, the
    compression config and the report, with its layers below ``layers`` (the model's count) when known."""

    def corrupted(what: str) -> ValueError:
        return ValueError(f"{path} is corrupted: {what}")

    if not isinstance(metadata, dict):
        raise corrupted("it holds no JSON object")
    version = metadata.get("format_version")
    if metadata.get("format") != FORMAT or not _is_int(version) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"{path} has format {metadata.get('format')!r} version {version!r}; "
            f"this svdmlp reads {FORMAT!r} version {' or '.join(map(str, READABLE_VERSIONS))}"
        )
    if version >= DIGEST_SINCE or DIGEST_KEY in metadata:
        if metadata.get(DIGEST_KEY) != digest(metadata):
            raise ValueError(
                f"{path} was edited after it was saved: its content does not match the SHA-256 it records; "
                "restore the checkpoint or save it again"
            )
    if not _files_ok(metadata, version):
        raise corrupted("its record of the checkpoint's files is malformed")
    for key in ("base_model", "model_type"):
        if not isinstance(metadata.get(key), str) or not metadata[key]:
            raise corrupted(f"{key} {metadata.get(key)!r} is not a name")
    if metadata.get("dtype") not in DTYPES:
        raise corrupted(f"dtype {metadata.get('dtype')!r} is none of {', '.join(DTYPES)}")
    tied = metadata.get("tied", {})
    if not isinstance(tied, dict) or not all(isinstance(v, str) for v in tied.values()):
        raise corrupted("its record of tied tensors is malformed")
    try:
        CompressConfig.from_dict(metadata.get("config"))
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise corrupted(f"its compression config is malformed ({err})") from None
    problem = _report_problem(metadata.get("report"), layers)
    if problem:
        raise corrupted(f"its report {problem}")


def _files_ok(metadata: dict, version: int) -> bool:
    weights = metadata.get("weights")
    files = metadata.get("files") if version >= 2 else {}
    if version >= 3:
        shards = weights.get("files") if isinstance(weights, dict) else None
        weights_ok = (
            isinstance(shards, list)
            and bool(shards)
            and isinstance(files, dict)
            and all(isinstance(name, str) and name in files for name in shards)
        )
    else:
        weights_ok = _is_record(weights) and _is_inside(weights.get("file"))
    return (
        weights_ok
        and isinstance(files, dict)
        and all(_is_inside(name) and _is_record(record) for name, record in files.items())
    )


def _report_problem(report, layers: int | None) -> str:
    """What is wrong with the recorded report, in words ("" if nothing): every field that the load,
    ``info`` and ``eval`` read, of the type they read it as."""
    if not isinstance(report, dict):
        return "is missing"
    for key in ("params_before", "params_after"):
        counts = report.get(key)
        if not (isinstance(counts, dict) and all(_is_int(counts.get(k), 0) for k in ("total", "mlp"))):
            return f"has no parameter counts {key}"
    if report["params_before"]["mlp"] == 0:
        return "counts no MLP parameters before compression"
    if not _is_number(report.get("seconds")):
        return "has no seconds"
    for key in ("calibration", "timings", "healing", "allocation", "quantization"):
        if not isinstance(report.get(key, {}), dict):
            return f"has a {key} that is not a record"
    entries = report.get("layers")
    if not isinstance(entries, list):
        return "has no list of layers"
    seen = set()
    for entry in entries:
        problem = _layer_problem(entry, layers)
        if problem:
            return problem
        if entry["index"] in seen:
            return f"records layer {entry['index']} twice"
        seen.add(entry["index"])
    return ""


def _layer_problem(entry, layers: int | None) -> str:
    if not isinstance(entry, dict) or not set(entry) <= _field_names(LayerRecord):
        return "has a layer record of unknown form"
    index = entry.get("index")
    if not _is_int(index, 0):
        return f"has a layer index {index!r} that is not an integer >= 0"
    if layers is not None and index >= layers:
        return f"records layer {index}, but the model of config.json has {layers} layers"
    if entry.get("status") not in _STATUSES or not isinstance(entry.get("module", ""), str):
        return f"has layer {index} of status {entry.get('status')!r}, not one of {', '.join(_STATUSES)}"
    projections = entry.get("projections", [])
    must_have = {"compressed": True, "skipped": False}.get(entry["status"], bool(projections))
    if not isinstance(projections, list) or must_have != bool(projections):
        return f"has layer {index} {entry['status']} with projections {projections!r}"
    names = [p.get("name") if isinstance(p, dict) else None for p in projections]
    if len(set(names)) != len(names) or not set(names) <= set(PROJECTIONS):
        return f"has layer {index} with projections {names!r} (distinct names of {', '.join(PROJECTIONS)})"
    for projection in projections:
        name = projection["name"]
        if not set(projection) <= _field_names(ProjectionRecord):
            return f"has layer {index} {name} of unknown form"
        shape = (projection.get("in_features"), projection.get("out_features"))
        if not all(_is_int(size, 1) for size in shape):
            return f"has layer {index} {name} of shape {shape!r}"
        rank = projection.get("rank")
        if not _is_int(rank, 1) or rank > min(shape):
            return f"has layer {index} {name} of rank {rank!r}, not an integer in 1..{min(shape)}"
        if not all(_is_number(projection.get(k)) for k in ("keep", "error")) or not all(
            projection.get(k) is None or _is_number(projection[k])
            for k in ("heal_error_before", "heal_error_after")
        ):
            return f"has layer {index} {name} with errors or keep that are not numbers"
    return ""


def _field_names(record) -> set[str]:
    return set(record.__dataclass_fields__)


def _is_int(value, least: int | None = None) -> bool:
    return type(value) is int and (least is None or value >= least)


def _is_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_record(record) -> bool:
    """Whether ``record`` is a file's size and SHA-256 as :func:`svdmlp.checkpoint.save` writes them."""
    return isinstance(record, dict) and _is_int(record.get("bytes")) and isinstance(record.get("sha256"), str)


def _is_inside(name) -> bool:
    """Whether a recorded file name is a relative path that stays inside the checkpoint."""
    return (
        isinstance(name, str) and name != "" and not Path(name).is_absolute() and ".." not in Path(name).parts
    )


def weight_files(metadata: dict) -> list[str]:
    """The names of the checkpoint's weights files (one before version 3)."""
    if metadata["format_version"] >= 3:
        return metadata["weights"]["files"]
    return [metadata["weights"]["file"]]


def _recorded_files(metadata: dict) -> dict[str, dict]:
    """The files whose size and SHA-256 the checkpoint recorded: every file but svdmlp.json from
    version 2 on, the weights alone in version 1."""
    if metadata["format_version"] >= 2:
        return metadata["files"]
    return {metadata["weights"]["file"]: metadata["weights"]}


def verify_files(directory: str | os.PathLike, metadata: dict) -> None:
    """Check every recorded file against the size and SHA-256 recorded at save time; a ValueError
    names the first one that is missing or differs."""
    root = Path(directory).expanduser()
    weights = weight_files(metadata)
    for name, expected in _recorded_files(metadata).items():
        _verify_file(root / name, expected, weights=name in weights)


def _verify_file(path: Path, expected: dict, weights: bool) -> None:
    subject = f"checkpoint weights {path} are" if weights else f"checkpoint file {path} is"
    advice = "restore the checkpoint or save it again"
    if not path.is_file():
        raise ValueError(f"{subject} missing; {advice}")
    size = path.stat().st_size
    if size != expected["bytes"]:
        raise ValueError(
            f"{subject} truncated or altered: {size} bytes, expected {expected['bytes']}; {advice}"
        )
    if file_sha256(path) != expected["sha256"]:
        raise ValueError(f"{subject} corrupted: SHA-256 differs from the one recorded at save time; {advice}")


def servable(directory: str | os.PathLike) -> quant_config.QuantSpec:
    """The ``quantization_config`` an engine will build ``directory``'s model from, once every file has
    been checked against its recorded hash; a ValueError for a checkpoint no engine should start on."""
    metadata = read_metadata(directory)
    verify_files(directory, metadata)
    if metadata["format_version"] < quant_config.VERSION:
        raise ValueError(
            f"{directory} is a format {metadata['format_version']} checkpoint, written before checkpoints "
            f"carried the quantization_config engines load them by; save it again with this svdmlp: "
            f"svdmlp upgrade {directory}"
        )
    record = json.loads((Path(directory).expanduser() / "config.json").read_text())
    return quant_config.parse(record.get("quantization_config"))
