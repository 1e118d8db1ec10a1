import math

import pytest
import torch
import torch.nn.functional as F

from conftest import SAMPLE_TEXT, tiny_model
from svdmlp.evaluate import perplexity


def test_windows_follow_the_protocol(tokenizer):
    ids = tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"]
    windows = perplexity.text_windows(tokenizer, SAMPLE_TEXT, 50)
    assert windows.shape == (len(ids) // 50, 50)  # non-overlapping, incomplete tail dropped
    assert windows.flatten().tolist() == ids[: windows.numel()]  # no BOS inserted, contiguous
    assert perplexity.text_windows(tokenizer, SAMPLE_TEXT, 50, max_windows=3).tolist() == windows[:3].tolist()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seq_len": 1}, "seq_len must be >= 2"),
        ({"seq_len": 10**6}, "one evaluation window needs"),
        ({"seq_len": 8, "max_windows": 0}, "max_windows"),
    ],
)
def test_bad_protocol_arguments(tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        perplexity.text_windows(tokenizer, SAMPLE_TEXT, **kwargs)


def test_perplexity_is_exp_of_the_mean_token_nll(tokenizer):
    model = tiny_model("llama")
    windows = perplexity.text_windows(tokenizer, SAMPLE_TEXT, 24, max_windows=5)
    result = perplexity.perplexity(model, windows, batch_size=2, progress=False)
    with torch.no_grad():
        nlls = [
            F.cross_entropy(model(w[None]).logits[0, :-1], w[1:], reduction="sum").item() for w in windows
        ]
    assert result.predicted_tokens == 5 * 23 and result.windows == 5 and result.seq_len == 24
    assert result.perplexity == pytest.approx(math.exp(sum(nlls) / (5 * 23)), rel=1e-5)


class _Uniform(torch.nn.Module):
    """Predicts every token with equal probability: perplexity must equal the vocabulary size."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab
        self.anchor = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, use_cache=False):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        return type("Out", (), {"logits": logits})


def test_uniform_model_has_perplexity_equal_to_vocab():
    windows = torch.randint(0, 50, (3, 10))
    assert perplexity.perplexity(_Uniform(50), windows, progress=False).perplexity == pytest.approx(50.0)
