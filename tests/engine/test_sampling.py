"""Next-token selection on hand-made distributions."""

from __future__ import annotations

import math

import pytest
import torch

from svdmlp.engine.sampling import Sampling, select

# Probabilities 0.5, 0.3, 0.15, 0.05 over tokens 2, 0, 3, 1.
LOGITS = torch.tensor([[math.log(0.3), math.log(0.05), math.log(0.5), math.log(0.15)]])


def draws(sampling: Sampling, n: int = 400) -> set[int]:
    generator = torch.Generator().manual_seed(0)
    logits = LOGITS.expand(n, -1)
    noise = torch.empty(n, 4).exponential_(generator=generator)
    return set(select(logits, sampling, noise).tolist())


def test_greedy_is_argmax():
    assert select(LOGITS, Sampling(), None).tolist() == [2]


@pytest.mark.parametrize(
    ("sampling", "allowed"),
    [
        (Sampling(temperature=1.0), {0, 1, 2, 3}),
        (Sampling(temperature=1.0, top_k=2), {2, 0}),
        (Sampling(temperature=1.0, top_p=0.5), {2}),  # the first token alone reaches 0.5
        (Sampling(temperature=1.0, top_p=0.79), {2, 0}),
        (Sampling(temperature=1.0, top_p=0.9), {2, 0, 3}),
        (Sampling(temperature=1.0, top_k=2, top_p=0.9), {2, 0}),
    ],
)
def test_top_k_and_top_p_keep_the_right_tokens(sampling, allowed):
    assert draws(sampling) == allowed


def test_sampled_frequencies_follow_the_distribution():
    generator = torch.Generator().manual_seed(1)
    n = 20000
    noise = torch.empty(n, 4).exponential_(generator=generator)
    tokens = select(LOGITS.expand(n, -1), Sampling(temperature=1.0), noise)
    frequencies = torch.bincount(tokens, minlength=4).float() / n
    assert torch.allclose(frequencies, LOGITS.softmax(-1)[0], atol=0.015)


def test_parse_accepts_a_dict_and_refuses_unknown_keys():
    assert Sampling.parse({"temperature": 0.7, "top_k": 5}) == Sampling(temperature=0.7, top_k=5)
    assert Sampling.parse(None).greedy
    with pytest.raises(ValueError, match=r"unknown sampling options \['beam'\]"):
        Sampling.parse({"beam": 2})
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        Sampling(temperature=float("nan"))
    with pytest.raises(ValueError, match="top_k must be an integer"):
        Sampling(temperature=1.0, top_k=2.5)
