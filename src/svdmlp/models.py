"""Loading dense models: a built-in packaged model (:mod:`svdmlp.packaged`), a GGUF file, a local Hugging
Face directory, or a hub id; safetensors only, refusing pickled weights before anything loads."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from svdmlp import arch, lazy, lowrank, packaged
from svdmlp.packaged import DEFAULT_ALIASES, DEFAULT_MODEL, PACKAGED


def resolve_model_path(name: str | None) -> str:
    """A loadable location for ``name``: a cached conversion (built-in or GGUF), a local directory, or a hub id."""
    if name in DEFAULT_ALIASES:
        name = DEFAULT_MODEL
    if name in PACKAGED:
        return str(packaged.packaged_model_dir(name))
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(packaged.gguf_model_dir(path))
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
        _refuse_pickles(path)
        return str(path)
    # A hub id is "name" or "org/name"; anything else shaped like a path is a missing directory.
    if (
        name.startswith((".", "/", "~"))
        or name.endswith("/")
        or name.count("/") > 1
        or os.sep != "/"
        and os.sep in name
    ):
        raise FileNotFoundError(f"model directory {name} does not exist")
    return name


# Weights files that are Python pickles: loading one can run any code it holds.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _refuse_pickles(directory: Path) -> None:
    """Refuse a model directory whose weights are pickles alone, before anything reads them: svdmlp
    loads safetensors only (``use_safetensors=True`` in every ``from_pretrained`` of weights)."""
    if any(directory.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if pickles:
        raise ValueError(
            f"{directory} holds pickled weights only ({', '.join(pickles[:3])}), and svdmlp loads safetensors "
            "only (a pickle can run code as it loads): convert the model to safetensors, e.g. "
            "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR), and pass NEW_DIR"
        )


def recorded_name(name: str | None) -> str:
    """How a checkpoint records its base model, so that the record names the same model wherever it is
    read: a built-in name or a hub id as given, a local directory or file as its absolute path (a
    relative one named another model from another directory)."""
    if name in DEFAULT_ALIASES:
        return DEFAULT_MODEL
    if name in PACKAGED:
        return name
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def check_recorded_base(name: str) -> None:
    """Refuse a base model that a checkpoint recorded as a relative path (svdmlp did before
    2026-12-07): from another directory it names another model, and scoring that as the baseline would
    give a wrong ratio without a word."""
    if name in PACKAGED or name in DEFAULT_ALIASES or Path(name).expanduser().is_absolute():
        return
    if Path(name).exists() or name.startswith(".") or os.sep in name and name.count("/") != 1:
        raise ValueError(
            f"the checkpoint records its base model as the relative path {name!r}, which names another "
            "model from each directory: evaluate with --no-baseline and score the base model by its own "
            "command (svdmlp eval BASE), or save the checkpoint again with an absolute base path"
        )


def load_config(name: str | None):
    """The model's config, checked against the supported architectures before any weight loads."""
    location = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(location)
    except OSError as err:
        raise ValueError(
            f"could not load model {name!r}: it is not a local directory and the Hugging Face hub "
            f"could not provide it ({first_line(err)})"
        ) from None
    arch.for_config(config)
    if _is_compressed(config):  # transformers would load it, low-rank, as if it were the dense model
        if (Path(location) / "svdmlp.json").is_file():
            raise ValueError(
                f"{location} is an svdmlp checkpoint, not a dense model: compress its base model, "
                "or load it with svdmlp.load"
            )
        raise ValueError(
            f"{location} holds an svdmlp-compressed model (quant_method 'svdmlp' in its config.json), not a "
            "dense one: compress its base model, or load it with transformers after import svdmlp"
        )
    return location, config


def _is_compressed(config) -> bool:
    """Whether a model config says svdmlp compressed the model (its quantization_config)."""
    record = getattr(config, "quantization_config", None)
    method = record.get("quant_method") if isinstance(record, dict) else getattr(record, "quant_method", None)
    return method == "svdmlp"


def load_dense(name: str | None, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load a supported dense causal LM and its tokenizer.

    Raises:
        ValueError: if the weights cannot be read (a truncated or damaged file) or do not match the
            architecture of the config (tensors missing, unexpected or of another shape): transformers
            would initialise what it cannot load at random.

    Returns:
        (model, tokenizer, location) with the model in eval mode on ``device``.
    """
    location, config = load_config(name)
    try:
        # ignore_mismatched_sizes: tensors of another shape are listed in the loading info with the
        # missing and unexpected ones (else transformers raises an error that only points at its log).
        model, info = AutoModelForCausalLM.from_pretrained(
            location,
            config=config,
            dtype=dtype,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            use_safetensors=True,  # never a pickle, from the hub either
        )
    except SafetensorError as err:
        raise ValueError(
            f"model weights {_unreadable_weights(location)} cannot be read ({first_line(err)}); "
            "the file is truncated or damaged: save, convert or download the model again"
        ) from None
    except OSError as err:
        where = err.filename or location
        raise ValueError(f"could not read the weights of model {where}: {first_line(err)}") from None
    problems = weights_mismatch(info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"])
    if info["error_msgs"]:  # transformers raises for these itself; refuse them the same way if not
        problems = "; ".join(filter(None, [problems, " ".join(info["error_msgs"][0].split())]))
    if problems:
        raise ValueError(
            f"the weights of {location} do not match the {config.model_type} architecture of its config: "
            f"{problems}; {_mismatch_advice(location, info['unexpected_keys'])}"
        )
    check_finite(model, location)
    tokenizer = AutoTokenizer.from_pretrained(location)
    return model.to(device).eval(), tokenizer, location


def check_finite(model, where) -> None:
    """Refuse a model whose weights hold NaN or inf (a damaged save, an overflowed conversion): it
    would score a perplexity of nan and generate noise, each with exit status 0."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(
                f"the weights of {where} contain NaN or inf ({name}); restore the model or save it again"
            )


class NotLocal(ValueError):
    """A model to load from disk is not on this disk (a hub id)."""


def load_lazy(
    name: str | None,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    scratch: str | os.PathLike | None = None,
):
    """Like :func:`load_dense`, but the embeddings, decoder layers and LM head stay on disk and are
    read for the forward passes that use them (:class:`svdmlp.lazy.DiskWeights`): memory holds one
    of them at a time, whatever the model's size. The model must be a local directory or built-in.

    Args:
        scratch: where :meth:`~svdmlp.lazy.DiskWeights.store` writes compressed layers (in ``dtype``).

    Returns:
        (model, tokenizer, location) with the model in eval mode on ``device``.
    """
    location, config = load_config(name)
    if not Path(location).is_dir():
        raise NotLocal(f"{name!r} is not a local model directory: download it first, or load it in memory")
    try:
        files = lazy.tensor_files(location)
        shapes = {}
        for path in set(files.values()):
            with safe_open(path, framework="pt") as handle:
                shapes.update({key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()})
    except (SafetensorError, OSError) as err:
        raise ValueError(
            f"model weights {_unreadable_weights(location)} cannot be read ({first_line(err)}); "
            "the file is truncated or damaged: save, convert or download the model again"
        ) from None
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # on the meta device from_config leaves a tied LM head a parameter of its own
    if (Path(location) / "generation_config.json").is_file():  # from_config makes a default one
        model.generation_config = GenerationConfig.from_pretrained(location)  # which a checkpoint keeps
    _check_shapes(model, location, config, shapes)
    spec = arch.for_config(config)
    units = lazy.units_of(model, arch.decoder_layers(model, spec))
    on_disk = {id(p) for unit in units for p in unit.parameters()}
    resident = {}
    for key, parameter in model.named_parameters():
        if id(parameter) not in on_disk:
            with safe_open(files[key], framework="pt") as handle:
                resident[key] = handle.get_tensor(key).to(device=device, dtype=dtype)
    model.load_state_dict(resident, strict=False, assign=True)
    lazy.DiskWeights(model, files, units, dtype, device, scratch)
    for module in model.modules():  # the buffers (rotary frequencies) go too; .to() would fill placeholders
        for key, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[key] = buffer.to(device)
    tokenizer = AutoTokenizer.from_pretrained(location)
    return model.eval(), tokenizer, location


# What compression downloads of a hub model: its config, tokenizer and safetensors weights, never pickles.
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken"]


def download(name: str) -> Path:
    """Hub model ``name``'s config, tokenizer and safetensors weights in the Hugging Face cache (fetched
    once; offline, what the cache holds), so that compression reads its layers from disk one at a time
    as it does a local model's.

    Raises:
        ValueError: the hub cannot provide it, or it has no safetensors weights (only pickles).
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        location = Path(snapshot_download(name, allow_patterns=HUB_FILES))
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise ValueError(
            f"could not download model {name!r} from the Hugging Face hub ({first_line(err)})"
        ) from None
    if not any(location.glob("*.safetensors")):
        raise ValueError(
            f"model {name!r} has no safetensors weights on the Hugging Face hub, and svdmlp does not "
            "load pickles: save it with save_pretrained(safe_serialization=True) and pass the directory"
        )
    return location


def load_for_compression(name: str | None, dtype: torch.dtype, device: str, scratch: str | os.PathLike):
    """``(model, tokenizer)`` to compress, its layers on disk (:func:`load_lazy`, compressed layers
    written to ``scratch``): a local directory or built-in model where it is, a hub id once
    :func:`download` has fetched it. Memory then holds one layer at a time whatever the model's size."""
    try:
        model, tokenizer, _ = load_lazy(name, dtype, device, scratch)
    except NotLocal:
        model, tokenizer, _ = load_lazy(str(download(name)), dtype, device, scratch)
    return model, tokenizer


def _check_shapes(model, location: str, config, shapes: dict[str, tuple]) -> None:
    """Refuse weights files that miss, add or reshape tensors of the model's architecture (a tied
    tensor may be stored under any of its names)."""
    names: dict[int, list[str]] = {}
    expected = {}
    for key, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(key)
        expected[key] = tuple(parameter.shape)
    missing = [group[0] for group in names.values() if not any(key in shapes for key in group)]
    unexpected = [key for key in shapes if key not in expected]
    mismatched = [
        (key, shapes[key], expected[key])
        for key in shapes
        if key in expected and shapes[key] != expected[key]
    ]
    problems = weights_mismatch(missing, unexpected, mismatched)
    if problems:
        raise ValueError(
            f"the weights of {location} do not match the {config.model_type} architecture of its config: "
            f"{problems}; {_mismatch_advice(location, unexpected)}"
        )


_SHOWN_KEYS = 3


def weights_mismatch(missing, unexpected, mismatched) -> str:
    """One line naming a few of the tensors that are ``missing`` from a weights file, ``unexpected``
    in it, or ``mismatched`` (``(name, shape in the file, shape expected)`` triples); "" if none."""
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing ({_few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({_few(unexpected)})")
    if mismatched:
        shapes = {name: (_shape(found), _shape(wanted)) for name, found, wanted in mismatched}
        named = [f"{name} {found} instead of {wanted}" for name, (found, wanted) in sorted(shapes.items())]
        parts.append(f"{len(mismatched)} of another shape ({_few(named, sort=False)})")
    return ", ".join(parts)


def _few(names, sort: bool = True) -> str:
    names = sorted(names) if sort else list(names)
    shown = ", ".join(names[:_SHOWN_KEYS])
    return shown if len(names) <= _SHOWN_KEYS else f"{shown} and {len(names) - _SHOWN_KEYS} more"


def _shape(shape) -> str:
    return "x".join(str(size) for size in shape) or "scalar"


def _mismatch_advice(location: str, unexpected) -> str:
    factors = lowrank.factor_names()
    if not any(factors.intersection(key.split(".")) for key in unexpected):  # quantized: u_t.values
        return "the weights file is incomplete or belongs to another model"
    if (Path(location) / "svdmlp.json").is_file():
        return (
            "it is an svdmlp checkpoint, not a dense model: compress its base model, "
            "or load it with svdmlp.checkpoint.load"
        )
    return (
        "this looks like an svdmlp checkpoint whose svdmlp.json is missing: restore svdmlp.json, "
        "or compress the base model again"
    )


def _unreadable_weights(location: str) -> str:
    """The first safetensors file of a model directory whose header cannot be read (for an error)."""
    root = Path(location)
    if root.is_dir():
        for path in sorted(root.glob("*.safetensors")):
            try:
                with safe_open(path, framework="pt"):
                    pass
            except (SafetensorError, OSError):
                return str(path)
    return f"of {location}"


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none), for one-line errors."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
