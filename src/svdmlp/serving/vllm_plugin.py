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

A checkpoint whose MLP weights are stored quantized (``svdmlp compress --quantize``) is served the same
way: each projection's packed integers, scales and zero points split as vLLM splits a dense weight
(gate and up, stored apart, held as one matrix of both), and its low-rank correction beside it as
the factors above are (gate's and up's shrink factors side by side, one read of ``x``).
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
from svdmlp.int_weights import STORED, QuantizedMatrix, Scheme, factor_scheme
from svdmlp.serving import quant_config

# A compressed MLP's linear layers in vLLM's module names (the prefix vLLM passes, any model nesting).
_MLP_LINEAR = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.(gate_up_proj|down_proj)$")

# The checkpoint's names (svdmlp's LowRankGatedMLP: model.layers.3.mlp.gate_v_t, a quantized factor's
# model.layers.3.mlp.gate_v_t.values) to the parameters this module registers on vLLM's layers. A
# quantized weight's (model.layers.3.mlp.gate_proj.quantized.values, its correction's .u_t, .v_t) keep
# their projection's name, which vLLM's own stacking then maps to gate_up_proj with the shard id of
# gate (0) or up (1).
_NAMES = WeightsMapper(
    orig_to_new_regex={
        re.compile(r"\.mlp\.(gate_up_u_t|gate_v_t|up_v_t)$"): r".mlp.gate_up_proj.\1",
        re.compile(r"\.mlp\.(gate_up_u_t|gate_v_t|up_v_t)\.(values|scales)$"): r".mlp.gate_up_proj.\1_\2",
        re.compile(r"\.mlp\.down_(u_t|v_t)$"): r".mlp.down_proj.\1",
        re.compile(r"\.mlp\.down_(u_t|v_t)\.(values|scales)$"): r".mlp.down_proj.\1_\2",
        re.compile(
            r"\.mlp\.(gate|up|down)_proj\.quantized\.(values|scales|zeros)$"
        ): r".mlp.\1_proj.weight_\2",
        re.compile(r"\.mlp\.(gate|up)_proj\.u_t$"): r".mlp.\1_proj.gate_up_u_t",
        re.compile(r"\.mlp\.(gate|up)_proj\.u_t\.(values|scales)$"): r".mlp.\1_proj.gate_up_u_t_\2",
        re.compile(r"\.mlp\.(gate|up)_proj\.v_t$"): r".mlp.\1_proj.\1_v_t",
        re.compile(r"\.mlp\.(gate|up)_proj\.v_t\.(values|scales)$"): r".mlp.\1_proj.\1_v_t_\2",
        re.compile(r"\.mlp\.down_proj\.(u_t|v_t)\.(values|scales)$"): r".mlp.down_proj.\1_\2",
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
        weights = self.spec.weights
        if match is None or (weights is None and int(match.group(1)) not in self.spec.layers):
            return UnquantizedLinearMethod()
        ranks = self.spec.layers.get(int(match.group(1)), {})
        name = match.group(2)
        if name == "gate_up_proj" and isinstance(layer, MergedColumnParallelLinear):
            if weights is not None:
                return QuantizedGateUpMethod(
                    STORED[weights], ranks.get("gate", 0), ranks.get("up", 0), self.scheme
                )
            return GateUpMethod(ranks["gate"], ranks["up"], self.scheme)
        if name == "down_proj" and isinstance(layer, RowParallelLinear):
            if weights is not None:
                return QuantizedDownMethod(STORED[weights], ranks.get("down", 0), self.scheme)
            return DownMethod(ranks["down"], self.scheme)
        raise ValueError(f"svdmlp cannot serve {prefix} ({type(layer).__name__}): not a gated MLP's layer")


class _FactorMethod(LinearMethodBase):
    """What both layers share: registering a factor, float or quantized, with the loader that copies
    this rank's slice of the stored tensor into it."""

    def __init__(self, scheme: Scheme | None):
        self.scheme = scheme

    def factors(self, inputs: int, outputs: list[int]) -> tuple:
        """``(name, rows, cols, split, shards)`` of each factor, in the order :meth:`apply` multiplies
        by them, for a rank with ``inputs`` inputs and ``outputs`` outputs (see :meth:`_register`)."""
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
        for name, rows, cols, split, shards in layer.svdmlp_shapes:
            self._register(layer, name, rows, cols, params_dtype, split, shards=shards)

    def process_weights_after_loading(self, layer) -> None:
        layer.svdmlp_factors = tuple(
            self._factor(layer, name, rows) for name, rows, _, _, _ in layer.svdmlp_shapes
        )

    def _register(
        self,
        layer,
        name: str,
        rows: int,
        cols: int,
        dtype: torch.dtype,
        split: str | None,
        scheme: Scheme | None = None,
        shards: tuple[int, ...] | None = None,
    ):
        """A factor ``(rows, cols)`` as used in ``x @ factor`` (``rows`` of its inputs local to this
        rank already), ``split`` "rows" or "cols" saying along which dimension the stored tensor is
        cut across ranks (None: replicated), quantized by ``scheme`` (default: the factors' own).
        ``shards``: the checkpoint holds it as tensors this many columns wide each, which vLLM hands
        in with shard ids 0, 1, ... (gate's and up's, held side by side)."""
        scheme = scheme or self.scheme
        if scheme is None:
            self._parameter(layer, name, torch.empty(rows, cols, dtype=dtype), split, shards, 1)
            return
        # Quantized, stored transposed, (N, K) = (cols, rows): values and scales, each cut the same way.
        matrix = QuantizedMatrix(rows, cols, scheme)
        cut = {"rows": "cols", "cols": "rows", None: None}[split]
        # int4 packs two inputs a byte and scales groups of 128; zero points pack two groups a byte
        whole = (scheme.group or 2) * (2 if scheme.zero_point else 1)
        if cut == "cols" and layer.tp_size > 1 and scheme.bits == 4 and rows % whole:
            raise ValueError(
                f"svdmlp: the int4 matrix {layer.prefix}.{name} cannot be split across "
                f"{layer.tp_size} tensor-parallel ranks: {rows} inputs each, not a multiple of {whole}"
            )
        self._parameter(layer, f"{name}_values", matrix.values, cut, shards, 0)
        # int8's one scale per output channel covers every input: each rank holds it whole.
        per_channel = cut == "cols" and scheme.group is None
        self._parameter(layer, f"{name}_scales", matrix.scales, None if per_channel else cut, shards, 0)
        if scheme.zero_point:
            self._parameter(layer, f"{name}_zeros", matrix.zeros, cut, shards, 0)

    @staticmethod
    def _parameter(
        layer,
        name: str,
        data: torch.Tensor,
        split: str | None,
        shards: tuple[int, ...] | None,
        shard_dim: int,
    ) -> None:
        parameter = torch.nn.Parameter(data, requires_grad=False)
        rank, ranks = layer.tp_rank, layer.tp_size
        dim = {"rows": 0, "cols": 1, None: None}[split]

        def load(param: torch.Tensor, stored: torch.Tensor, shard_id=None) -> None:
            # vLLM's stacking passes the shard id of gate (0) or up (1) for their tensors; only those
            # held side by side (``shards``) use it, the others are one tensor each in the checkpoint.
            target = param.data
            if shards is not None:
                if shard_id not in range(len(shards)):
                    raise ValueError(f"svdmlp: {layer.prefix}.{name} was handed shard {shard_id!r}")
                target = target.narrow(shard_dim, sum(shards[:shard_id]), shards[shard_id])
            whole = tuple(n * ranks if d == dim else n for d, n in enumerate(target.shape))
            if tuple(stored.shape) != whole:
                raise ValueError(
                    f"svdmlp: {layer.prefix}.{name} is stored with shape {tuple(stored.shape)}, where the "
                    f"checkpoint's ranks say {whole}: its quantization_config and weights disagree"
                )
            if dim is not None:
                stored = stored.narrow(dim, rank * target.shape[dim], target.shape[dim])
            target.copy_(stored)

        set_weight_attrs(parameter, {"weight_loader": load})
        layer.register_parameter(name, parameter)

    def _factor(self, layer, name: str, rows: int, scheme: Scheme | None = None):
        """The factor ``name`` of ``layer`` as the ops multiply by it: its tensor (on a CPU, laid out as
        vLLM's own layers are, :class:`_CpuFactor`), or a quantized matrix around its values and scales."""
        scheme = scheme or self.scheme
        if scheme is None:
            factor = getattr(layer, name)
            return _CpuFactor(factor) if factor.device.type == "cpu" else factor
        values, scales = getattr(layer, f"{name}_values"), getattr(layer, f"{name}_scales")
        zeros = getattr(layer, f"{name}_zeros").data if scheme.zero_point else None
        return QuantizedMatrix.around(values.data, scales.data, scheme, rows, zeros)


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
            ("gate_up_u_t", inputs, self.r_gate + self.r_up, None, None),
            ("gate_v_t", self.r_gate, inter, "cols", None),
            ("up_v_t", self.r_up, inter, "cols", None),
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
        return (("u_t", inputs, self.r_down, "rows", None), ("v_t", self.r_down, sum(outputs), None, None))

    def process_weights_after_loading(self, layer) -> None:
        super().process_weights_after_loading(layer)
        # The fused kernel (x @ U kept on chip) where Triton runs, PyTorch's two products elsewhere;
        # chosen once here, so that the forward vLLM compiles is the product alone.
        device = next(layer.parameters()).device
        layer.svdmlp_lowrank_linear = backends.get(backends.resolve("auto", device)).lowrank_linear

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = layer.svdmlp_lowrank_linear(x, *layer.svdmlp_factors)
        return out if bias is None else out + bias


class _QuantizedMethod(_FactorMethod):
    """A projection stored quantized, with its low-rank correction when it has one: the weight's
    packed integers, scales and zero points registered as a factor of the weight's scheme would be,
    split as vLLM splits the dense weight, and the correction's factors as a low-rank layer's."""

    def __init__(self, how: Scheme, factors_how: Scheme | None):
        super().__init__(factors_how)
        self.how = how

    def weight(self, inputs: int, outputs: list[int]) -> tuple:
        """``(rows, cols, split, shards)`` of the quantized weight as used in ``x @ W``."""
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
        rows, cols, split, shards = self.weight(input_size_per_partition, output_partition_sizes)
        self._register(layer, "weight", rows, cols, params_dtype, split, self.how, shards)
        layer.svdmlp_weight_rows = rows
        super().create_weights(
            layer, input_size_per_partition, output_partition_sizes, input_size, output_size, params_dtype
        )

    def process_weights_after_loading(self, layer) -> None:
        super().process_weights_after_loading(layer)
        layer.svdmlp_weight = self._factor(layer, "weight", layer.svdmlp_weight_rows, self.how)


class QuantizedGateUpMethod(_QuantizedMethod):
    """``[gate(x) | up(x)]`` for this rank's slice of the intermediate: gate's and up's quantized rows
    as one matrix, plus their corrections from one read of ``x``."""

    def __init__(self, how: Scheme, r_gate: int, r_up: int, factors_how: Scheme | None):
        super().__init__(how, factors_how)
        self.r_gate, self.r_up = r_gate, r_up

    def weight(self, inputs: int, outputs: list[int]) -> tuple:
        return inputs, sum(outputs), "cols", tuple(outputs)

    def factors(self, inputs: int, outputs: list[int]) -> tuple:
        if not self.r_gate:
            return ()
        inter = outputs[0]
        return (
            ("gate_up_u_t", inputs, self.r_gate + self.r_up, None, (self.r_gate, self.r_up)),
            ("gate_v_t", self.r_gate, inter, "cols", None),
            ("up_v_t", self.r_up, inter, "cols", None),
        )

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = layer.svdmlp_weight.matmul(x)
        if layer.svdmlp_factors:
            out = out + torch.cat(torch_ref.gate_and_up(x, *layer.svdmlp_factors), dim=-1)
        return out if bias is None else out + bias


class QuantizedDownMethod(_QuantizedMethod):
    """This rank's partial sum of the down projection, ``Q_i(x_i) + (x_i @ U_i) @ V``, which vLLM
    all-reduces."""

    def __init__(self, how: Scheme, r_down: int, factors_how: Scheme | None):
        super().__init__(how, factors_how)
        self.r_down = r_down

    def weight(self, inputs: int, outputs: list[int]) -> tuple:
        return inputs, sum(outputs), "rows", None

    def factors(self, inputs: int, outputs: list[int]) -> tuple:
        if not self.r_down:
            return ()
        return (("u_t", inputs, self.r_down, "rows", None), ("v_t", self.r_down, sum(outputs), None, None))

    def apply(self, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = layer.svdmlp_weight.matmul(x)
        if layer.svdmlp_factors:
            out = out + torch_ref.lowrank_linear(x, *layer.svdmlp_factors)
        return out if bias is None else out + bias


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM runs it in each of its processes before a model
    loads, so ``quant_method: "svdmlp"`` is known wherever the model is built."""
    if quant_config.QUANT_METHOD not in QUANTIZATION_METHODS:
        register_quantization_config(quant_config.QUANT_METHOD)(SvdmlpConfig)
