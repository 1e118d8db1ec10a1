"""Version records never raise, also when svdmlp runs uninstalled from a checkout."""

from importlib.metadata import PackageNotFoundError

import torch

import svdmlp
from svdmlp import versions


def test_installed_and_missing_packages():
    found = versions.installed_versions(("torch", "no-such-package-svdmlp-test"))
    assert torch.__version__.startswith(found["torch"])  # metadata may lack the local tag (+cpu, +cu130)
    assert found["no-such-package-svdmlp-test"] is None


def test_uninstalled_svdmlp_reports_its_source_version(monkeypatch):
    def not_installed(package):
        raise PackageNotFoundError(package)

    monkeypatch.setattr(versions, "version", not_installed)
    assert versions.installed_versions(("svdmlp", "torch")) == {"svdmlp": svdmlp.__version__, "torch": None}
