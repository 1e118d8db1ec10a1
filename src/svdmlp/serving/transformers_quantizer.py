"""svdmlp as a transformers quantization method: after ``import svdmlp``,
``AutoModelForCausalLM.from_pretrained(DIR)`` loads an svdmlp checkpoint as the compressed model
:func:`svdmlp.load` gives, through transformers' own loader (``dtype``, ``device_map``, ``save_pretrained``,
``generate``, pipelines and PEFT adapters all work as for any quantized model).

transformers calls the quantizer registered under the checkpoint's ``quant_method`` ("svdmlp") before
the weights load: it swaps the MLPs the ``quantization_config`` names for empty low-rank modules on the
meta device, which the checkpoint's factors then fill by name. It cannot quantize a dense model on load:
compression needs calibration (``svdmlp compress``).
"""

from __future__ import annotations

from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer
from transformers.utils.quantization_config import QuantizationConfigMixin

from svdmlp.serving import quant_config


class SvdmlpConfig(QuantizationConfigMixin):
    """The ``quantization_config`` of an svdmlp checkpoint (:mod:`svdmlp.serving.quant_config`), as
    transformers holds it; validated when made, so a record this svdmlp cannot read fails here."""

    def __init__(
        self,
        layers: dict | None = None,
        align: int = 1,
        factor_bits: int = 16,
        format_version: int = quant_config.VERSION,
        quant_method: str = quant_config.QUANT_METHOD,
        weights: str | None = None,
        **kwargs,
    ):
        self.quant_method = quant_method
        self.format_version = format_version
        self.align = align
        self.factor_bits = factor_bits
        self.layers = {} if layers is None else layers
        if weights is not None:  # only quantized-weight records carry it (format 5)
            self.weights = weights
        self.spec = quant_config.parse(self.to_dict())

    def to_dict(self) -> dict:
        return {key: value for key, value in self.__dict__.items() if key != "spec"}


class SvdmlpQuantizer(HfQuantizer):
    """Builds the low-rank skeleton before transformers loads the weights into it."""

    requires_calibration = True  # only checkpoints svdmlp made: a dense model is compressed by svdmlp

    def __init__(self, quantization_config: SvdmlpConfig, **kwargs):
        super().__init__(quantization_config, **kwargs)
        self.spec = quantization_config.spec

    def update_tp_plan(self, config):
        # transformers calls this after it has found the quantizer and before it looks for the weights
        # file: the moment to lift the guard that makes transformers without svdmlp refuse the checkpoint.
        if getattr(config, "transformers_weights", None) == quant_config.WEIGHTS_GUARD:
            delattr(config, "transformers_weights")
        return config

    def _process_model_before_weight_loading(self, model, **kwargs):
        from svdmlp.serving import skeleton

        dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        skeleton.install(model, self.spec, dtype)
        return model

    def _process_model_after_weight_loading(self, model, **kwargs):
        from svdmlp import lowrank

        lowrank.set_backend(model, "auto")
        return model

    def is_serializable(self) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return True  # adapters (PEFT LoRA) train on top; the factors themselves stay frozen


def register() -> None:
    """Register the config and the quantizer with transformers under ``quant_method`` "svdmlp" (once)."""
    name = quant_config.QUANT_METHOD
    if name not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(name)(SvdmlpConfig)
    if name not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(name)(SvdmlpQuantizer)


# On import: ``import svdmlp`` imports this module once transformers' registry exists (a post-import
# hook), and this module may itself be what first imports that registry, so it registers here, last.
register()
