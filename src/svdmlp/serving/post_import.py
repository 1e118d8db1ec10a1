"""Run a function once a module has been imported, whenever that happens (a post-import hook, PEP 369).

``import svdmlp`` registers its transformers quantizer this way: at the moment transformers imports
its own registry, and not earlier, so that ``import svdmlp`` (and ``svdmlp --help``) stays free of
transformers' import time.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


def when_imported(name: str, hook: Callable[[], None]) -> None:
    """Call ``hook()`` right after module ``name`` is first executed; at once if it already was."""
    if name in sys.modules:
        hook()
        return
    sys.meta_path.insert(0, _Watcher(name, hook))


class _Watcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``name`` is looked up, it asks the other finders for its spec and
    wraps the spec's loader so that ``hook`` runs after the module's code. It then leaves
    ``sys.meta_path``: the hook runs once."""

    def __init__(self, name: str, hook: Callable[[], None]):
        self.name, self.hook = name, hook

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.hook()

        spec.loader.exec_module = exec_module
        return spec
