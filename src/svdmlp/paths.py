"""Where svdmlp keeps its user cache (the converted default model, the built-in corpora)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$SVDMLP_CACHE``, else ``$XDG_CACHE_HOME/svdmlp``, else ``~/.cache/svdmlp``."""
    explicit = os.environ.get("SVDMLP_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "svdmlp"
