"""Scratch folders of the evidence code: a new folder under the temporary directory, removed
when the interpreter exits (test runs and benchmarks leave nothing in /tmp)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path


def scratch_folder(prefix: str) -> Path:
    """A new folder named from ``prefix`` under the temporary directory, removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder
