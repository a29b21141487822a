"""A script of ``scripts/`` imported as a module, the way it imports when it runs: ``scripts/`` on
``sys.path`` for its ``checkout`` import, the module registered under its name (dataclasses
resolve a module's annotations through ``sys.modules``)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """Import the script at ``path`` as ``name``; the caller deletes ``sys.modules[name]``
    when done."""
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@contextlib.contextmanager
def loaded_script(path: Path, name: str) -> Iterator[ModuleType]:
    """``load_script`` for the length of a ``with`` block (a module fixture's body)."""
    module = load_script(path, name)
    try:
        yield module
    finally:
        del sys.modules[name]
