"""Self-generated calibration: token windows the dense model samples itself.

A user with no calibration text can still compress for what the model actually does: its own
samples show the activations its generations produce. A spread of starts keeps them from collapsing
onto one kind of text: short prompts of prose, an encyclopedia entry, a maths problem, code, a letter,
dialogue and a question; the user turns of its chat template when it has one; and nothing at all
(the model's unconditioned samples).

The generation runs on svdmlp's engine (batched, CUDA graphs on a GPU). It is slow on a CPU: 32
windows of 512 tokens took 14 minutes for SmolLM2-135M on one contended core (BENCHMARKS.md), so it is
an option (``--calib self``, or mixed: ``--calib general:3,self:1``), not the default.
"""

from __future__ import annotations

import hashlib

import torch
from tqdm.auto import tqdm

# Short openings of the kinds of text the model will meet; the model writes the rest of each window.
TEXT_PROMPTS = (
    "Once upon a time, in a small village by the sea,",
    "The old lighthouse keeper had not spoken to anyone in years. Then, one stormy night,",
    "Photosynthesis is the process by which",
    "The Roman Empire was",
    "A farmer has 24 apples. She gives a third of them to her neighbour and",
    "def ",
    "import ",
    "Dear Sarah,\n\nThank you for your letter.",
    "Subject: Meeting next week\n\nHi team,\n\n",
    '"Where were you last night?" asked Tom.\n"',
    "Q: What is the difference between a virus and a bacterium?\nA:",
    "# Introduction\n\n",
)

# User turns for a chat model: what people ask an assistant, one of each kind.
CHAT_QUESTIONS = (
    "Why is the sky blue?",
    "Write a short poem about autumn.",
    "How do I reverse a list in Python?",
    "What were the main causes of the First World War?",
    "A train travels 120 km in 1.5 hours. What is its average speed?",
    "Can you suggest a healthy dinner recipe?",
    "Explain what a neural network is to a ten-year-old.",
    "Translate 'Good morning, how are you?' into French.",
)


def _chat_turn(tokenizer, question: str) -> list[int]:
    """``question`` as a user turn in the chat template, up to where the assistant's answer starts."""
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _document_start(tokenizer) -> list[int]:
    """What an unconditioned sample starts from without a BOS token: the EOS token, which separates
    the documents of packed pretraining data (so what follows it is a fresh document), else a
    newline."""
    if tokenizer.eos_token_id is not None:
        return [tokenizer.eos_token_id]
    return tokenizer("\n", add_special_tokens=False)["input_ids"]


def window_starts(tokenizer, bos: int | None) -> list[list[int]]:
    """The tokens that start the windows, in the order rows cycle through them.

    The kinds (text prompts, chat turns if the tokenizer has a template, unconditioned) interleave, so
    each gets an equal share of the windows, and each kind's starts come in turn. ``bos`` is not in
    them: the caller puts it before each window. An unconditioned start is then empty (the model
    samples from its BOS alone); without a BOS it is :func:`_document_start`.
    """
    kinds = [[tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXT_PROMPTS]]
    if getattr(tokenizer, "chat_template", None) is not None:
        # A template that writes the BOS itself (Llama 3, Gemma) would put a second one after the caller's.
        turns = [_chat_turn(tokenizer, question) for question in CHAT_QUESTIONS]
        kinds.append([ids[1:] if bos is not None and ids[:1] == [bos] else ids for ids in turns])
    kinds.append([[] if bos is not None else _document_start(tokenizer)])
    longest = max(len(kind) for kind in kinds)
    return [kind[i % len(kind)] for i in range(longest) for kind in kinds]


def _batch_seed(seed: int, index: int) -> int:
    """The sampling seed of batch ``index``: a hash, so that no two (seed, batch) pairs share noise
    (with ``seed + index``, seed 1's first batch would repeat seed 0's second)."""
    digest = hashlib.sha256(f"{seed}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits: a valid torch seed


def self_windows(
    engine,
    tokenizer,
    num_samples: int,
    seq_len: int,
    seed: int,
    bos: int | None,
    *,
    batch_size: int = 8,
    temperature: float = 1.0,
    top_p: float = 0.95,
    progress: bool = True,
) -> torch.Tensor:
    """``num_samples`` windows of ``seq_len`` tokens sampled by the model of ``engine``.

    Args:
        engine: an ``svdmlp.engine.Engine`` of the dense model, ``max_batch >= batch_size``.
        bos: the model's BOS token (:func:`svdmlp.arch.bos_token_id`) or None. Generation starts
            after it, as the model will see the windows, but the windows leave it out: the caller
            puts it first (:func:`svdmlp.arch.with_bos`), as for windows of a text.
        batch_size: rows generated together.
        temperature, top_p: the sampling; the defaults draw the model's own distribution, only its
            long tail of unlikely tokens cut off.

    Row ``i`` starts with ``window_starts(tokenizer, bos)[i % len(...)]`` (cut to ``seq_len - 1``
    tokens) and the model writes the rest. An end-of-sequence token does not end a window: the model
    goes on after it as after a document boundary of its packed training data (a chat model writes
    the next turn), so every token is sampled in the very context the Grams will see it in, and each
    window is exactly ``seq_len`` tokens.

    The windows are a function of ``seed``, ``batch_size`` and the engine's device and dtype:
    each batch samples with its own seed derived from ``seed`` and its index, and draws its noise
    as one block per token, so another ``batch_size`` gives other (equally valid) windows.

    Returns:
        LongTensor (num_samples, seq_len) on the CPU.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    if not 1 <= batch_size <= engine.max_batch:
        raise ValueError(
            f"batch_size must be in [1, {engine.max_batch}] (the engine's max_batch), got {batch_size}"
        )
    lead = 0 if bos is None else 1
    positions = engine.model.config.get_text_config(decoder=True).max_position_embeddings
    with_bos = " + 1 for BOS" if lead else ""
    if seq_len + lead > positions:
        raise ValueError(f"seq_len {seq_len}{with_bos} exceeds the model's {positions} positions")
    if seq_len + lead > engine.max_seq_len:
        raise ValueError(f"seq_len {seq_len}{with_bos} exceeds the engine's max_seq_len {engine.max_seq_len}")

    starts = window_starts(tokenizer, bos)
    rows = [starts[i % len(starts)][: seq_len - 1] for i in range(num_samples)]  # >= 1 token to sample
    room = engine.max_seq_len - lead - seq_len  # cache slots left for a batch's longer starts
    plan = []
    for first in range(0, num_samples, batch_size):
        batch = rows[first : first + batch_size]
        shortest = min(len(row) for row in batch)
        # Every row gets as many new tokens as the shortest start needs; longer starts are cut so
        # that the batch fits the engine's cache (only ever near its limit).
        plan.append(([row[: shortest + room] for row in batch], seq_len - shortest))

    windows = torch.empty(num_samples, seq_len, dtype=torch.long)
    total = sum(len(batch) * new for batch, new in plan)
    with tqdm(total=total, desc="self-calibration", unit="tok", disable=not progress) as bar:
        for index, (batch, new) in enumerate(plan):
            result = engine.generate(
                [[bos] * lead + row for row in batch],
                new,
                {"temperature": temperature, "top_p": top_p, "seed": _batch_seed(seed, index)},
                on_tokens=lambda chunk: bar.update(sum(len(tokens) for tokens in chunk)),
            )
            for offset, (row, tokens) in enumerate(zip(batch, result.tokens, strict=True)):
                windows[index * batch_size + offset] = torch.tensor((row + tokens)[:seq_len])
    return windows
