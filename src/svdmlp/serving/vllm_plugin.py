"""svdmlp as a vLLM quantization method, registered by vLLM's plugin mechanism: ``pip install svdmlp``
beside vLLM, and ``vllm serve DIR`` or ``vllm.LLM(DIR)`` serve an svdmlp checkpoint.

vLLM builds its own model class for the checkpoint's architecture (Llama, Qwen2/3, Mistral, Gemma 1/2/3)
and asks the ``quantization_config``'s method how to run each linear layer. For a compressed layer's
``gate_up_proj`` (a ``MergedColumnParallelLinear``) and ``down_proj`` (a ``RowParallelLinear``) this
module answers with the low-rank factors; every other layer stays vLLM's own. The factors live in
vLLM's memory as the checkpoint stores them (float, or int8/int4 with their scales): no dense matrix
is ever rebuilt. Why a quantization method rather than a model class of our own, and what each GPU
holds under tensor parallelism: ``docs/architecture.md``, "Serving".

Tensor parallelism (exact, the shards' sums are the whole products):
- ``gate_up_proj`` is column-parallel: the shrink factor ``gate_up_u_t`` is replicated, the expand
  factors ``gate_v_t`` / ``up_v_t`` are split along their outputs, so each rank computes its own slice
  of ``[gate | up]``, as vLLM's dense layer does;
- ``down_proj`` is row-parallel: ``down_u_t`` is split along its inputs (the rank's slice of the
  intermediate), ``down_v_t`` is replicated; each rank's ``(x_i @ U_i) @ V`` is a partial sum that
  vLLM's layer all-reduces, as it does a dense layer's partial products.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    MergedColumnParallelLinear,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.models.utils import WeightsMapper
from vllm.model_executor.utils import set_weight_attrs

from svdmlp import backends
from svdmlp.backends import torch_ref
from svdmlp.int_weights import QuantizedMatrix, Scheme, factor_scheme
from svdmlp.serving import quant_config

# A compressed MLP's linear layers in vLLM's module names (the prefix vLLM passes, any model nesting).
_MLP_LINEAR = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.(gate_up_proj|down_proj)$")

# The checkpoint's names (svdmlp's LowRankGatedMLP: model.layers.3.mlp.gate_v_t, a quantized factor's
# model.layers.3.mlp.gate_v_t.values) to the parameters this module registers on vLLM's layers.
_NAMES = WeightsMapper(
    orig_to_new_regex={
        re.compile(r"\.mlp\.(gate_up_u_t|gate_v_t|up_v_t)$"): r".mlp.gate_up_proj.\1",
        re.compile(r"\.mlp\.(gate_up_u_t|gate_v_t|up_v_t)\.(values|scales)$"): r".mlp.gate_up_proj.\1_\2",
        re.compile(r"\.mlp\.down_(u_t|v_t)$"): r".mlp.down_proj.\1",
        re.compile(r"\.mlp\.down_(u_t|v_t)\.(values|scales)$"): r".mlp.down_proj.\1_\2",
    }
)


class SvdmlpConfig(QuantizationConfig):
    """vLLM's view of an svdmlp checkpoint's ``quantization_config``."""

    def __init__(self, spec: quant_config.QuantSpec):
        super().__init__()
        spec.require_whole_mlps()  # here, in the process that reads the config, before any worker starts
        self.spec = spec
        self.scheme = factor_scheme(spec.factor_bits)

    def get_name(self) -> str:
        return quant_config.QUANT_METHOD

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # plain PyTorch on any device; the Triton kernels where CUDA has them

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []  # everything is in config.json's quantization_config

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SvdmlpConfig:
        return cls(quant_config.parse(config))

    @staticmethod
    def get_checkpoint_weight_mapper() -> WeightsMapper:
        return _NAMES

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if not isinstance(layer, LinearBase):
            return None  # embeddings and the LM head: vLLM's own
        match = _MLP_LINEAR.search(prefix)
        if match is None or int(match.group(1)) not in self.spec.layers:
            return UnquantizedLinearMethod()
        ranks = self.spec.layers[int(match.group(1))]
        name = match.group(2)
        if name == "gate_up_proj" and isinstance(layer, MergedColumnParallelLinear):
            return GateUpMethod(ranks["gate"], ranks["up"], self.scheme)
        if name == "down_proj" and isinstance(layer, RowParallelLinear):
            return DownMethod(ranks["down"], self.scheme)
        raise ValueError(f"svdmlp cannot serve {prefix} ({type(layer).__name__}): not a gated MLP's layer")


class _FactorMethod(LinearMethodBase):
    """What both layers share: registering a factor, float or quantized, with the loader that copies
    this rank's slice of the stored tensor into it."""

    def __init__(self, scheme: Scheme | None):
        self.scheme = scheme

    def factors(self, inputs: int, outputs: list[int]) -> tuple:
        """``(name, rows, cols, split)`` of each factor, in the order :meth:`apply` multiplies by them,
        for a rank with ``inputs`` inputs and ``outputs`` outputs (see :meth:`_register`)."""
        raise NotImplementedError

    def create_weights(
        self,
        layer,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        layer.svdmlp_shapes = self.factors(input_size_per_partition, output_partition_sizes)
        for name, rows, cols, split in layer.svdmlp_shapes:
            self._register(layer, name, rows, cols, params_dtype, split)

    def process_weights_after_loading(self, layer) -> None:
        layer.svdmlp_factors = tuple(
            self._factor(layer, name, rows) for name, rows, _, _ in layer.svdmlp_shapes
        )

    def _register(self, layer, name: str, rows: int, cols: int, dtype: torch.dtype, split: str | None):
        """A factor ``(rows, cols)`` as used in ``x @ factor`` (``rows`` of its inputs local to this
        rank already), ``split`` "rows" or "cols" saying along which dimension the stored tensor is
        cut across ranks (None: replicated)."""
        if self.scheme is None:
            self._parameter(layer, name, torch.empty(rows, cols, dtype=dtype), split)
            return
        # Quantized, stored transposed, (N, K) = (cols, rows): values and scales, each cut the same way.
        matrix = QuantizedMatrix(rows, cols, self.scheme)
        cut = {"rows": "cols", "cols": "rows", None: None}[split]
        whole = self.scheme.group or 2  # int4 packs two inputs a byte and scales groups of 128
        if cut == "cols" and layer.tp_size > 1 and self.scheme.bits == 4 and rows % whole:
            raise ValueError(
                f"svdmlp: the int4 factor {layer.prefix}.{name} cannot be split across "
                f"{layer.tp_size} tensor-parallel ranks: {rows} inputs each, not a multiple of {whole}"
            )
        self._parameter(layer, f"{name}_values", matrix.values, cut)
        # int8's one scale per output channel covers every input: each rank holds it whole.
        per_channel = cut == "cols" and self.scheme.group is None
        self._parameter(layer, f"{name}_scales", matrix.scales, None if per_channel else cut)

    @staticmethod
    def _parameter(layer, name: str, data: torch.Tensor, split: str | None) -> None:
        parameter = torch.nn.Parameter(data, requires_grad=False)
        rank, ranks = layer.tp_rank, layer.tp_size
        dim = {"rows": 0, "cols": 1, None: None}[split]
        whole = tuple(n * ranks if d == dim else n for d, n in enumerate(data.shape))

        def load(param: torch.Tensor, stored: torch.Tensor, shard_id=None) -> None:
            # (vLLM's merged layer passes a shard id for the halves of a stacked dense weight; a factor
            # is one tensor of the checkpoint, never such a shard.)
            if tuple(stored.shape) != whole:
                raise ValueError(
                    f"svdmlp: {layer.prefix}.{name} is stored with shape {tuple(stored.shape)}, where the "
                    f"checkpoint's ranks say {whole}: its quantization_config and weights disagree"
                )
            if dim is not None:
                stored = stored.narrow(dim, rank * param.shape[dim], param.shape[dim])
            param.data.copy_(stored)

        set_weight_attrs(parameter, {"weight_loader": load})
        layer.register_parameter(name, parameter)

    def _factor(self, layer, name: str, rows: int):
        """The factor ``name`` of ``layer`` as the ops multiply by it: its tensor (on a CPU, laid out as
        vLLM's own layers are, :class:`_CpuFactor`), or a quantized matrix around its values and scales."""
        if self.scheme is None:
            factor = getattr(layer, name)
            return _CpuFactor(factor) if factor.device.type == "cpu" else factor
        values, scales = getattr(layer, f"{name}_values"), getattr(layer, f"{name}_scales")
        return QuantizedMatrix.around(values.data, scales.data, self.scheme, rows)


class _CpuFactor:
    """A float factor multiplied on a CPU as vLLM multiplies its dense layers there when oneDNN is not
    used: ``F.linear`` over ``(N, K)`` rows. In bf16 on a CPU without AMX that is 4-5x faster than
    ``x @ (K, N)`` (measured on SmolLM2-135M's factor shapes, BENCHMARKS.md session 25). The parameter's
    data is laid out anew in place: the same bytes, no second copy."""

    def __init__(self, parameter: torch.nn.Parameter):
        parameter.data = parameter.data.t().contiguous()
        self.weight, self.in_features = parameter, parameter.shape[1]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class GateUpMethod(_FactorMethod):
    """``[gate(x) | up(x)]`` for this rank's slice of the intermediate, from one read of ``x``."""

    def __init__(self, r_gate: int, r_up: int, scheme: Scheme | None):
        super().__init__(scheme)
        self.r_gate, self.r_up = r_gate, r_up

    def factors(self, inputs: int, outputs: list[int]) -> tuple:
        inter = outputs[0]
        return (
            ("gate_up_u_t", inputs, self.r_gate + self.r_up, None),
            ("gate_v_t", self.r_gate, inter, "cols"),
            ("up_v_t", self.r_up, inter, "cols"),
        )

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = torch_ref.gate_and_up(x, *layer.svdmlp_factors)
        out = torch.cat((gate, up), dim=-1)
        return out if bias is None else out + bias


class DownMethod(_FactorMethod):
    """``(x_i @ U_i) @ V``: this rank's partial sum of the down projection, which vLLM all-reduces."""

    def __init__(self, r_down: int, scheme: Scheme | None):
        super().__init__(scheme)
        self.r_down = r_down

    def factors(self, inputs: int, outputs: list[int]) -> tuple:
        return (("u_t", inputs, self.r_down, "rows"), ("v_t", self.r_down, sum(outputs), None))

    def process_weights_after_loading(self, layer) -> None:
        super().process_weights_after_loading(layer)
        # The fused kernel (x @ U kept on chip) where Triton runs, PyTorch's two products elsewhere;
        # chosen once here, so that the forward vLLM compiles is the product alone.
        device = next(layer.parameters()).device
        layer.svdmlp_lowrank_linear = backends.get(backends.resolve("auto", device)).lowrank_linear

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = layer.svdmlp_lowrank_linear(x, *layer.svdmlp_factors)
        return out if bias is None else out + bias


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM runs it in each of its processes before a model
    loads, so ``quant_method: "svdmlp"`` is known wherever the model is built."""
    if quant_config.QUANT_METHOD not in QUANTIZATION_METHODS:
        register_quantization_config(quant_config.QUANT_METHOD)(SvdmlpConfig)
