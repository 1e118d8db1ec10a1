"""The post-import hook: it runs once, right after the watched module's code, or at once if that module
was imported already."""

from __future__ import annotations

import sys

from svdmlp.serving.post_import import when_imported


def test_the_hook_runs_after_the_module_and_once(tmp_path, monkeypatch):
    (tmp_path / "watched_module_x.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    when_imported("watched_module_x", lambda: seen.append(sys.modules["watched_module_x"].VALUE))
    assert seen == []
    import watched_module_x  # noqa: F401

    assert seen == [41]
    del sys.modules["watched_module_x"]
    import watched_module_x  # noqa: F401, F811

    assert seen == [41]
    del sys.modules["watched_module_x"]


def test_an_imported_module_runs_the_hook_at_once():
    seen = []
    when_imported("json", lambda: seen.append(1))
    assert seen == [1]


def test_importing_svdmlp_imports_no_transformers():
    import subprocess

    code = "import sys, svdmlp; print('transformers' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    )
