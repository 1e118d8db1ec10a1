"""Self-generated calibration windows on a tiny random Llama: shape, seeding, the starts and the BOS."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import VOCAB, untied_model
from svdmlp.compression.self_calibration import CHAT_QUESTIONS, TEXT_PROMPTS, self_windows, window_starts
from svdmlp.engine import Engine

SEQ_LEN = 32
CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="module")
def engine():
    return Engine(untied_model("llama"), max_batch=4)


@pytest.fixture
def chat_tokenizer(tokenizer):
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = CHAT_TEMPLATE
    return chat


def windows(engine, tokenizer, num_samples=6, seed=0, bos=None, **kwargs):
    return self_windows(
        engine, tokenizer, num_samples, SEQ_LEN, seed, bos, batch_size=4, progress=False, **kwargs
    )


def recorded_generate(monkeypatch, engine) -> list:
    """Wrap ``engine.generate``: each call appends (prompts, new tokens) to the returned list."""
    calls, real = [], engine.generate

    def generate(prompts, max_new_tokens, *args, **kwargs):
        result = real(prompts, max_new_tokens, *args, **kwargs)
        calls.append((prompts, result.tokens))
        return result

    monkeypatch.setattr(engine, "generate", generate)
    return calls


def test_shape_dtype_and_ids_within_the_vocabulary(engine, tokenizer):
    w = windows(engine, tokenizer, num_samples=7)  # two batches, the last one short
    assert w.shape == (7, SEQ_LEN) and w.dtype == torch.long
    assert 0 <= w.min() and w.max() < VOCAB


def test_same_seed_same_windows_other_seed_other_windows(engine, tokenizer):
    first = windows(engine, tokenizer, seed=3)
    assert torch.equal(windows(engine, tokenizer, seed=3), first)
    assert torch.equal(windows(Engine(engine.model, max_batch=4), tokenizer, seed=3), first)
    assert not torch.equal(windows(engine, tokenizer, seed=4), first)


def test_batches_draw_their_own_noise(engine, tokenizer):
    """Rows ``len(starts)`` apart share their start and their place in a batch (24 starts, batches of
    4): only each batch's own seed tells them apart."""
    starts = window_starts(tokenizer, None)
    w = windows(engine, tokenizer, num_samples=len(starts) + 4)
    for row in range(4):
        assert not torch.equal(w[row], w[len(starts) + row])


def test_rows_cycle_through_the_starts_text_and_unconditioned_interleaved(engine, tokenizer):
    starts = window_starts(tokenizer, None)
    assert len(starts) == 2 * len(TEXT_PROMPTS)
    assert starts[0] == tokenizer(TEXT_PROMPTS[0], add_special_tokens=False)["input_ids"]
    assert starts[1] == [tokenizer.eos_token_id]  # no BOS: unconditioned samples start a fresh document
    w = windows(engine, tokenizer, num_samples=len(starts) + 2)
    for i, row in enumerate(w.tolist()):
        start = starts[i % len(starts)][: SEQ_LEN - 1]  # a longer start leaves one token to sample
        assert row[: len(start)] == start


def test_generation_starts_after_bos_which_the_windows_leave_out(engine, tokenizer, monkeypatch):
    bos = tokenizer.bos_token_id
    unconditioned = windows(engine, tokenizer)
    calls = recorded_generate(monkeypatch, engine)
    w = windows(engine, tokenizer, bos=bos)
    assert w.shape == (6, SEQ_LEN) and bos not in w[:, 0].tolist()
    assert window_starts(tokenizer, bos)[1] == []  # the BOS alone
    rows = [(prompt, new) for prompts, tokens in calls for prompt, new in zip(prompts, tokens, strict=True)]
    assert len(rows) == 6
    for (prompt, new), window in zip(rows, w.tolist(), strict=True):
        assert prompt[0] == bos and bos not in prompt[1:]
        assert window == (prompt[1:] + new)[:SEQ_LEN]
    assert not torch.equal(w, unconditioned)


def test_chat_template_turns_are_a_third_of_the_starts(engine, chat_tokenizer):
    starts = window_starts(chat_tokenizer, None)
    assert len(starts) == 3 * len(TEXT_PROMPTS)
    text = f"[user] {CHAT_QUESTIONS[0]}\n[assistant]"
    assert starts[1] == chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    w = windows(engine, chat_tokenizer, num_samples=4)
    turn = starts[1][: SEQ_LEN - 1]
    assert w[1].tolist()[: len(turn)] == turn
    assert w[2, 0] == chat_tokenizer.eos_token_id


def test_a_template_that_writes_the_bos_gets_no_second_one(chat_tokenizer):
    chat_tokenizer.chat_template = "{{ bos_token }}" + CHAT_TEMPLATE
    bos = chat_tokenizer.bos_token_id
    with_bos = window_starts(chat_tokenizer, bos)[1]
    assert with_bos[0] != bos
    assert window_starts(chat_tokenizer, None)[1] == [bos, *with_bos]


def test_starts_longer_than_the_window_are_cut(engine, chat_tokenizer):
    w = self_windows(engine, chat_tokenizer, 3, 4, 0, None, batch_size=4, progress=False)
    assert w.shape == (3, 4)
    assert w[1, :3].tolist() == window_starts(chat_tokenizer, None)[1][:3]  # one token is sampled


def test_windows_as_long_as_the_engine_allows(engine, tokenizer):
    """A batch's starts differ in length; at the engine's limit the longer ones are cut to fit."""
    small = Engine(engine.model, max_batch=4, max_seq_len=SEQ_LEN)
    assert windows(small, tokenizer).shape == (6, SEQ_LEN)


def test_progress_bar(engine, tokenizer, capsys):
    self_windows(engine, tokenizer, 2, 8, 0, None, batch_size=2, progress=True)
    assert "self-calibration" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_samples": 0}, "num_samples must be >= 1, got 0"),
        ({"seq_len": 1}, "seq_len must be >= 2, got 1"),
        ({"seq_len": 257}, "seq_len 257 exceeds the model's 256 positions"),
        ({"seq_len": 256, "bos": 1}, r"seq_len 256 \+ 1 for BOS exceeds the model's 256 positions"),
        ({"batch_size": 0}, r"batch_size must be in \[1, 4\]"),
        ({"batch_size": 5}, r"batch_size must be in \[1, 4\]"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"top_p": 0.0}, "top_p must be in"),
    ],
)
def test_bad_arguments(engine, tokenizer, kwargs, message):
    arguments = dict(num_samples=2, seq_len=8, seed=0, bos=None, batch_size=4, progress=False) | kwargs
    with pytest.raises(ValueError, match=message):
        self_windows(engine, tokenizer, **arguments)


def test_windows_longer_than_the_engine_allows(engine, tokenizer):
    small = Engine(engine.model, max_batch=4, max_seq_len=16)
    with pytest.raises(ValueError, match="seq_len 32 exceeds the engine's max_seq_len 16"):
        windows(small, tokenizer)
