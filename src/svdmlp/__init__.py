"""svdmlp: compress LLM MLP layers with block-aligned, activation-aware SVD; run them with fused kernels.

Public API::

    import svdmlp
    svdmlp.compress_to("smollm2-135m", "out/")       # the default recipe, bounded memory, resumable
    model, tokenizer = svdmlp.load("out/", backend="auto")

    # or a model in memory, any config:
    model, tokenizer, base = svdmlp.load_dense("smollm2-135m")
    config = svdmlp.CompressConfig.preset("fast", keep=0.8)
    report = svdmlp.compress(model, tokenizer, config)
    svdmlp.save("out/", model, tokenizer, config, report, base_model=base)

``keep`` is the fraction of MLP parameters kept; the NeuronMLP paper's compression ratio is 1 − keep.

After ``import svdmlp``, ``transformers.AutoModelForCausalLM.from_pretrained(DIR)`` loads a checkpoint
too (:mod:`svdmlp.serving.transformers_quantizer`); vLLM finds svdmlp's plugin by itself.
"""

from __future__ import annotations

from importlib import import_module

from svdmlp.serving.post_import import when_imported

__version__ = "0.1.0"

# Heavy imports (torch, transformers) happen on first use, so `svdmlp --help` stays quick.
_API = {
    "CompressConfig": "svdmlp.config",
    "CalibrationSpec": "svdmlp.config",
    "compress": "svdmlp.compression.pipeline",
    "compress_to": "svdmlp.compress_on_disk",
    "save": "svdmlp.checkpoint",
    "load": "svdmlp.checkpoint",
    "load_dense": "svdmlp.models",
    "set_backend": "svdmlp.lowrank",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str):
    if name in _API:
        return getattr(import_module(_API[name]), name)
    raise AttributeError(f"module 'svdmlp' has no attribute {name!r}")


def _register_with_transformers() -> None:
    import_module("svdmlp.serving.transformers_quantizer")  # registers itself as it is imported


# When transformers imports its registry of quantization methods (the first from_pretrained), not now.
when_imported("transformers.quantizers.auto", _register_with_transformers)
