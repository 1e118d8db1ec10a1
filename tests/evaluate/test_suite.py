"""One evaluation run: every architecture's perplexity is what a plain transformers loop over the
same windows and special tokens computes, and the BOS token follows the model's convention."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import ARCH_CONFIGS, SAMPLE_TEXT, tiny_model
from svdmlp import arch
from svdmlp.evaluate import suite

SEQ_LEN, WINDOWS = 24, 3


def _plain_perplexity(model, ids: list[int], bos: int | None) -> float:
    """transformers' own loss (``labels=``) over each window, weighted by its predicted tokens."""
    total, count = 0.0, 0
    for index in range(WINDOWS):
        window = ([] if bos is None else [bos]) + ids[index * SEQ_LEN : (index + 1) * SEQ_LEN]
        inputs = torch.tensor([window])
        with torch.no_grad():
            loss = model(input_ids=inputs, labels=inputs).loss
        total += float(loss) * (len(window) - 1)
        count += len(window) - 1
    return math.exp(total / count)


@pytest.mark.parametrize("model_type", sorted(ARCH_CONFIGS))
def test_perplexity_equals_a_plain_transformers_loop(model_type, tokenizer):
    model = tiny_model(model_type)
    settings = suite.EvalSettings(seq_len=SEQ_LEN, max_windows=WINDOWS)
    result = suite.score(model, tokenizer, [("sample", SAMPLE_TEXT)], settings, "dense")
    bos = tokenizer.bos_token_id if arch.resolve(model_type).bos else None  # Gemma: always
    assert result["bos"] == {"token_id": bos, "convention": bos}
    ids = tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    assert result["perplexity"]["sample"] == pytest.approx(_plain_perplexity(model, ids, bos), rel=1e-5)


def test_bos_can_be_forced_or_left_out_and_the_protocol_says_so(tokenizer):
    gemma, llama = tiny_model("gemma3_text"), tiny_model("llama")
    bos = tokenizer.bos_token_id
    texts = [("sample", SAMPLE_TEXT)]
    without = suite.score(
        gemma, tokenizer, texts, suite.EvalSettings(seq_len=SEQ_LEN, max_windows=1, bos="no"), "x"
    )
    assert without["bos"] == {"token_id": None, "convention": bos}
    forced = suite.score(
        llama, tokenizer, texts, suite.EvalSettings(seq_len=SEQ_LEN, max_windows=1, bos="yes"), "x"
    )
    assert forced["bos"] == {"token_id": bos, "convention": None}
    settings = suite.EvalSettings(seq_len=SEQ_LEN)
    assert ", no BOS, " in settings.protocol(torch.float32, "cpu", None, None)
    assert f"no BOS (against the model's convention: BOS {bos})" in settings.protocol(
        torch.float32, "cpu", None, bos
    )
    assert f"BOS {bos} first (the model's convention)" in settings.protocol(torch.float32, "cpu", bos, bos)
    assert f"BOS {bos} first (asked)" in settings.protocol(torch.float32, "cpu", bos, None)
    with pytest.raises(ValueError, match="bos must be one of"):
        suite.EvalSettings(bos="sometimes")


def test_a_perplexity_that_is_not_finite_is_a_failure():
    rows = [
        {"kind": "dense", "perplexity": {"a": 3.0, "b": 4.0}, "tasks": {}},
        {"kind": "compressed", "perplexity": {"a": math.nan, "b": math.inf}, "tasks": {}},
    ]
    lines = suite.failures(rows)
    assert [line.split(":")[0] for line in lines] == [
        "perplexity of a on compressed is nan",
        "perplexity of b on compressed is inf",
    ]
    assert all(line.endswith("try --dtype float32") for line in lines)
    assert suite.failures(rows[:1]) == []
