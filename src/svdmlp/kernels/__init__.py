"""Fused Triton kernels for the low-rank MLP (CUDA, or CPU under ``TRITON_INTERPRET=1``).

Same signatures, shapes and semantics as :mod:`svdmlp.backends.torch_ref` (``quantized_gated_mlp``: the
gated MLP at decode sizes on factors stored quantized). Importing this package
only defines the kernels; launchers pick block sizes from the shape on each call
(:mod:`svdmlp.kernels.configs`).
"""

from svdmlp.kernels.gated_mlp import lowrank_gated_mlp
from svdmlp.kernels.lowrank_linear import lowrank_linear
from svdmlp.kernels.quantized_gated_mlp import quantized_gated_mlp

__all__ = ["lowrank_gated_mlp", "lowrank_linear", "quantized_gated_mlp"]
