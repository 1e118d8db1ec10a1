"""Calibration text beyond the five domains: other languages, and web code and markup.

The five domains are English text, math, Python, prose and chat; calibrated on them alone, a compressed
model lost the most on what they lack (SmolLM2-135M at keep 0.8: other languages ×3.6-4.5 of dense
perplexity against ×1.35 in-domain; BENCHMARKS.md, sessions 27-28). Two calibration sources widen the
mixture, each from a pinned PyPI package that neither unseen-text suite (:mod:`svdmlp.corpora.unseen`)
nor any domain draws on (the tests hash every paragraph of each against the suites):

| source | what | where from |
|---|---|---|
| ``languages`` | sentences and quotations of 27 non-English locales (22 languages), one document each | ``mimesis`` 22.2.0's ``text.json`` of its non-English locales |
| ``web`` | HTML templates, JavaScript, CSS, a README and licences | Django 5.2.8 (its vendored libraries left out) |

They are calibration sources only (no held-out part: nothing is scored on them).
"""

from __future__ import annotations

import json

from svdmlp.corpora.fetch import Package

MIMESIS = Package("mimesis==22.2.0", "mimesis-*.whl", "calibration")
DJANGO = Package("django==5.2.8", "django-*.whl", "calibration")
_LOCALES = "mimesis/datasets/"


def languages() -> list[str]:
    """One document per non-English locale: its sentences, then its quotations (a text that two
    locales share, as regional variants of Arabic do, once)."""
    chosen = MIMESIS.read(
        lambda names: [n for n in names if n.startswith(_LOCALES) and n.endswith("/text.json")]
    )
    documents, seen = [], set()
    for name, data in chosen:
        if name[len(_LOCALES) :].startswith("en"):
            continue
        record = json.loads(data.decode("utf-8"))
        parts = [" ".join(record.get(key) or []) for key in ("text", "quotes")]
        parts = [part for part in parts if part and part not in seen]
        seen.update(parts)
        if parts:
            documents.append("\n\n".join(parts))
    return documents


def _web_members(names: list[str]) -> list[str]:
    """Every template, script and style sheet (not vendored, not minified), then the README and licences."""
    code = [
        n
        for n in names
        if n.endswith((".html", ".js", ".css")) and "/vendor/" not in n and not n.endswith(".min.js")
    ]
    return code + [n for n in names if n.endswith("/METADATA")] + [n for n in names if n.endswith("/LICENSE")]


def web() -> list[str]:
    """Django's templates, scripts and style sheets, one document a file, then its README (the
    METADATA's body) and its licences."""
    return [
        data.decode("utf-8").partition("\n\n")[2] if name.endswith("/METADATA") else data.decode("utf-8")
        for name, data in DJANGO.read(_web_members)
    ]


SOURCES = {"languages": languages, "web": web}
