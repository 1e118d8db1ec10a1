"""How the next token is chosen: greedy, or sampled with temperature, top-k and top-p.

Selection runs on the device inside the captured decode step, so it has static shapes and no host
syncs: top-k and top-p work on sorted logits, and sampling draws ``argmax(p / q)`` with ``q ~ Exp(1)``
(the exponential race, equivalent to drawing from ``p``). The exponential noise is an input filled
from a seeded generator *outside* the graph, so a run is reproducible from its seed on every device
and the graph itself holds no random-number state.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Sampling:
    """Next-token selection. ``temperature == 0`` means greedy (top-k and top-p are then unused).

    Attributes:
        temperature: divides the logits; 0 selects the most likely token.
        top_k: sample among the k most likely tokens only (None: all).
        top_p: sample from the smallest set of most likely tokens whose probability reaches top_p.
        seed: seeds the noise of sampled runs.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)):
            raise ValueError(f"top_k must be an integer >= 1 or None, got {self.top_k!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def parse(cls, options: Sampling | dict | None) -> Sampling:
        """A ``Sampling`` from itself, None (greedy) or a dict; unknown keys are a ValueError."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        allowed = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(f"unknown sampling options {unknown}; allowed: {sorted(allowed)}")
        return cls(**options)

    @classmethod
    def of_generation_config(cls, config, seed: int = 0) -> Sampling:
        """The sampling a model's ``GenerationConfig`` asks for, as ``model.generate`` reads it: greedy
        unless ``do_sample``, else its temperature, top-k and top-p (transformers' defaults 1.0, 50
        and 1.0 where it sets none; a top-k of 0 means none)."""
        if config is None or not getattr(config, "do_sample", False):
            return cls(seed=seed)
        temperature = getattr(config, "temperature", None)
        top_k = getattr(config, "top_k", None)
        top_p = getattr(config, "top_p", None)
        return cls(
            temperature=1.0 if temperature is None else float(temperature),
            top_k=50 if top_k is None else (int(top_k) or None),
            top_p=1.0 if top_p is None else float(top_p),
            seed=seed,
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def check_vocab(self, vocab: int) -> None:
        if self.top_k is not None and self.top_k > vocab:
            raise ValueError(f"top_k {self.top_k} exceeds the vocabulary size {vocab}")


def select(logits: torch.Tensor, sampling: Sampling, noise: torch.Tensor | None) -> torch.Tensor:
    """Next tokens from last-position logits. logits (B, V); noise (B, V) ~ Exp(1) -> (B,) int64."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / sampling.temperature
    index = None
    if sampling.top_k is not None:
        logits, index = logits.topk(sampling.top_k, dim=-1)  # (B, k), most likely first
    elif sampling.top_p < 1.0:
        logits, index = logits.sort(dim=-1, descending=True)  # (B, V)
    if sampling.top_p < 1.0:
        probs = logits.softmax(dim=-1)
        # Drop a token when the more likely ones already reach top_p (the first one always stays).
        beyond = probs.cumsum(dim=-1) - probs >= sampling.top_p
        logits = logits.masked_fill(beyond, float("-inf"))
    probs = logits.softmax(dim=-1)
    choice = (probs / noise[:, : probs.shape[-1]]).argmax(dim=-1)  # (B,)
    return choice if index is None else index.gather(-1, choice[:, None])[:, 0]
