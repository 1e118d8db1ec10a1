"""Where svdmlp keeps its user cache (converted built-in models, corpora), and files' checksums."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SVDMLP_CACHE``, else ``$XDG_CACHE_HOME/svdmlp``, else ``~/.cache/svdmlp``."""
    explicit = os.environ.get("SVDMLP_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "svdmlp"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in chunks (checkpoint weights, packaged GGUF files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 24), b""):
            digest.update(chunk)
    return digest.hexdigest()


def under_umask(mode: int) -> int:
    """``mode`` less the process's umask: what ``mkdir`` (0o777) or ``open`` (0o666) would give a new
    file, for files made by ``mkstemp``/``mkdtemp`` (0600/0700) that are then renamed into place."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask
