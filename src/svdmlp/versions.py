"""Library versions for the records svdmlp writes (checkpoints, evaluation and benchmark JSON)."""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version


def installed_versions(packages: Iterable[str]) -> dict[str, str | None]:
    """Each package's installed version, None where it is not installed.

    Never raises: a record must not cost the work it records (a checkpoint is saved after the whole
    compression). svdmlp run from a checkout on PYTHONPATH, as on the GPU machines, has no installed
    metadata; its own ``__version__`` stands in.
    """
    versions = {}
    for package in packages:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = _source_version() if package == "svdmlp" else None
    return versions


def _source_version() -> str:
    from svdmlp import __version__  # late: the package's __init__ imports modules that import this one

    return __version__
