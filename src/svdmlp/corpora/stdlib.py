"""Source code and expository prose that every Python installation carries.

- Code: modules of the standard library, read from this interpreter's own files (so the exact text
  follows the Python version; the calibration hash records it). Two fixed, disjoint module lists.
- Prose: ``pydoc_data.topics``, the English text of the Python language reference that ``help()``
  shows (about 460 kB on Python 3.11), one topic per document.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

CALIBRATION_MODULES = (
    "functools", "typing", "inspect", "subprocess", "logging", "tarfile",
    "json.decoder", "json.encoder", "collections", "enum", "shutil", "threading",
)  # fmt: skip
HELDOUT_MODULES = (
    "argparse", "dataclasses", "fractions", "textwrap", "statistics", "heapq",
    "csv", "ipaddress", "configparser",
)  # fmt: skip


def module_source(name: str) -> str:
    """The source text of standard-library module ``name`` (a package: its ``__init__.py``)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ValueError(f"the standard library module {name} has no Python source on this machine")
    return Path(spec.origin).read_text(encoding="utf-8")


def code_documents(heldout: bool) -> list[str]:
    """One module's source per document."""
    return [module_source(name) for name in (HELDOUT_MODULES if heldout else CALIBRATION_MODULES)]


def prose_topics() -> list[tuple[str, str]]:
    """``(topic, text)`` of the language reference's help topics, sorted by name."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ValueError(
            "this Python has no pydoc_data (the language reference's help text), which the built-in "
            "'prose' domain reads; install the Python standard library's documentation data"
        ) from None
    return sorted(topics.items())
