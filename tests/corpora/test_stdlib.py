"""Python source and the language reference's prose, read from this interpreter's standard library."""

from __future__ import annotations

import sys

import pytest

from svdmlp import corpora
from svdmlp.corpora import stdlib


def test_module_lists_are_disjoint_and_all_present():
    assert set(stdlib.CALIBRATION_MODULES).isdisjoint(stdlib.HELDOUT_MODULES)
    for heldout in (False, True):
        documents = stdlib.code_documents(heldout)
        assert all(len(d) > 5000 for d in documents)
    assert "class ArgumentParser" in corpora.read_text("python-heldout")
    assert "class ArgumentParser" not in corpora.read_text("python")


def test_a_module_without_source_is_a_clear_error():
    with pytest.raises(ValueError, match="the standard library module sys has no Python source"):
        stdlib.module_source("sys")


def test_prose_is_the_language_reference_split_by_topic():
    topics = stdlib.prose_topics()
    assert [name for name, _ in topics] == sorted(name for name, _ in topics)
    heldout, calibration = corpora.documents("prose-heldout"), corpora.documents("prose")
    assert len(heldout) == len(topics) // 4 and len(heldout) + len(calibration) == len(topics)
    assert heldout[0] == topics[3][1]


def test_missing_pydoc_data_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)
    with pytest.raises(ValueError, match="this Python has no pydoc_data"):
        stdlib.prose_topics()
