"""Fast generation for dense and compressed models: static KV cache, graph-captured decode steps."""

from svdmlp.engine.engine import Engine, GenerationResult
from svdmlp.engine.sampling import Sampling

__all__ = ["Engine", "GenerationResult", "Sampling"]
