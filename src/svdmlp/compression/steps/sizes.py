"""The sizes every step's cost is made of: a model's shapes, a config and this machine's rates turned
into bytes and seconds once (:class:`Sizes`), and the bytes of the pieces the steps hold."""

from __future__ import annotations

import math
from dataclasses import dataclass

from svdmlp import ranks
from svdmlp.compression.gram import GRAM_BLOCKS
from svdmlp.compression.layer_inputs import LOGIT_BLOCK_BYTES
from svdmlp.config import CompressConfig

GB = 1e9
F32, F64 = 4, 8
# The interpreter with torch, transformers and svdmlp imported, a hollow model and its tokenizer
# (measured: 0.53 GB after the imports, 0.60 GB with a hollow Llama-3.2-1B-shaped model loaded).
BASE_BYTES = 0.6 * GB
# Once the model's layers have run on calibration windows: what glibc's heap keeps of the
# freed blocks under runtime.MMAP_THRESHOLD (a layer's activations, attention probabilities, the loaded
# layers' small tensors), reused but not returned. Measured beside Qwen2.5-Coder-0.5B's distillation: its
# main arena 0.57-0.67 GB with 0.31-0.41 GB free between windows, malloc_trim returning 0.3-0.4 GB until
# the next window took it back (BENCHMARKS.md, session 17). A model loaded whole for distillation is
# predicted without it: its terms (the weights, the autograd record) already exceed its measured peaks.
HEAP_RETAINED = 0.4 * GB
# Live float32 copies of a window's logits while its loss and gradient are formed (logits, softmax,
# log-softmax, gradient).
LOGIT_COPIES = 4
# The share of a full product's work that a Gram update does: the block upper triangle.
GRAM_WORK = (GRAM_BLOCKS + 1) / (2 * GRAM_BLOCKS)


@dataclass(frozen=True)
class Sizes:
    """What the steps' costs share: ``compressed`` decoder layers of a model of ``shapes`` (a
    :class:`~svdmlp.compression.footprint.Shapes`) compressed as ``config`` says, at the achieved
    ``speed`` (a :class:`~svdmlp.compression.footprint.Rates`)."""

    shapes: object
    config: CompressConfig
    compressed: int
    speed: object

    @property
    def h(self) -> int:
        return self.shapes.hidden

    @property
    def i(self) -> int:
        return self.shapes.inter

    @property
    def tokens(self) -> int:
        """The calibration windows' tokens."""
        return self.config.calibration.num_samples * self.window

    @property
    def window(self) -> int:
        return self.config.calibration.seq_len + 1

    @property
    def layer(self) -> float:
        """One dense decoder layer's bytes in float32."""
        return self.shapes.layer_params * F32

    @property
    def model(self) -> float:
        """What a compression holds whatever its step: the interpreter, a hollow model, the heap kept."""
        return BASE_BYTES + HEAP_RETAINED

    @property
    def hidden_states(self) -> float:
        return self.tokens * self.h * F32

    @property
    def rank(self) -> int:
        """The rank rule's rank of a projection at the config's keep."""
        return ranks.rank_for_keep(self.h, self.i, self.config.keep, self.config.align)

    @property
    def compressed_layer(self) -> int:
        """A compressed decoder layer's parameters: its attention and its factors at :attr:`rank`."""
        return self.shapes.layer_params - 3 * self.h * self.i + 3 * (self.h + self.i) * self.rank

    @property
    def forward(self) -> float:
        """FLOPs of one pass over the calibration windows."""
        return 2 * self.shapes.params * self.tokens

    @property
    def walk(self) -> float:
        """FLOPs of a walk that carries the windows through the decoder layers, up to the last one to
        compress."""
        walked = max(self.config.layers) + 1 if self.config.layers else self.shapes.layers
        return 2 * walked * self.shapes.layer_params * self.tokens

    @property
    def per_layer(self) -> float:
        """A layer's turn: the model, the layer, its input Grams and the windows' hidden states."""
        return self.model + self.layer + (self.h * self.h + self.i * self.i) * F64 + self.hidden_states

    @property
    def decomposing(self) -> float:
        """One projection's root of an inter² Gram and its SVD."""
        return root_bytes(self.i) + svd_bytes(self.h, self.i)

    def grams(self, *widths: int) -> float:
        """Seconds of Grams of these widths over the calibration tokens."""
        return self.tokens * 2 * sum(n * n for n in widths) * GRAM_WORK / self.speed.f32

    @property
    def factorise(self) -> float:
        """Seconds of one layer's factorising: its input Grams' accumulation, the roots of its Grams
        (input, and output with fisher), and each projection's weighting, SVD and return through the
        roots."""
        h, i, speed = self.h, self.i, self.speed
        fisher = self.config.needs_output_grams
        roots = speed.root(i) + speed.root(h) + (2 * speed.root(i) + speed.root(h) if fisher else 0)
        products = 12 * h * h * i + 3 * h * i * i + 6 * h * h * i + (6 * h * i * i if fisher else 0)
        return self.grams(h, i) + products / speed.f64 + roots


def root_bytes(n: int) -> float:
    """Making a float64 Cholesky root: the copy that becomes the root (or, for a Gram read from its
    file, the Gram itself)."""
    return n * n * F64


def svd_bytes(rows: int, cols: int) -> float:
    """Decomposing one weighted ``rows × cols`` projection in float64 (``decompose.Decomposition.of``):
    the weight, its weighted copy, the copy LAPACK's SVD (gesdd) overwrites and its left factor, four
    m·n buffers, and the SVD's workspace and right factor, about 8·n² (n the smaller side). At
    Llama-3.1-8B's MLP (4096 × 14336) that is 3.0 GB beside the root: the allocation's and
    factorisation's peaks (BENCHMARKS.md, session 13)."""
    m, n = max(rows, cols), min(rows, cols)
    return (4 * m * n + 8 * n * n) * F64


def logit_block(tokens: int, vocab: int) -> float:
    """One float32 copy of a block of logits (``layer_inputs.block_rows``): at most a window's whole."""
    return min(LOGIT_BLOCK_BYTES, tokens * vocab * F32)


def layer_record(shapes, seq: int) -> float:
    """What autograd keeps of one ``seq``-token window through a decoder layer for its backward pass:
    the attention probabilities and a few activations per width."""
    return (shapes.heads * seq * seq + 8 * seq * (shapes.hidden + shapes.inter)) * F32


def strip_bytes(n: int) -> float:
    """One strip of a Gram's update (``gram.accumulate_gram``): its float32 product and float64 copy."""
    return n * math.ceil(n / GRAM_BLOCKS) * (F32 + F64)
