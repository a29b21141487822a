"""Puts the checkout that holds this ``scripts/`` folder first on ``sys.path``.

A script run as ``python scripts/NAME.py`` has ``scripts/`` on ``sys.path``, not the checkout
it measures; each script imports this module before the project's own modules, so that they
come from this checkout whether or not (and wherever) the package is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
