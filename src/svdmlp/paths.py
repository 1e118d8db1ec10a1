"""Where svdmlp keeps its user cache (converted built-in models, corpora), files' checksums, and the one
way a command writes a file the user named."""

from __future__ import annotations

import hashlib
import os
import tempfile
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


def check_output(target: str | os.PathLike) -> Path:
    """Where :func:`write_output` would write ``target`` (a link's target), or a ValueError if what is
    there is not a regular file: commands check their output before they start work."""
    path = Path(target).expanduser().resolve()
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ValueError(f"cannot write {target}: {path} is {kind}; name a file")
    return path


def write_output(target: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to the file the user named (``--json FILE``, a report), atomically, and return where.

    A symbolic link is written through, not replaced: the file it points to gets the text. Anything
    there that is not a regular file (a directory, a FIFO, a device) is refused with a ValueError
    rather than replaced. The text goes to a temporary file beside the target, reaches the disk
    (fsync) and is renamed over it, so a reader never sees half of it.
    """
    path = check_output(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        mode = path.stat().st_mode & 0o777 if path.exists() else under_umask(0o666)
        os.chmod(staging, mode)  # mkstemp's 0600 would hide the result from its other users
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return path
