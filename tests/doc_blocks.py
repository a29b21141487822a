"""Marked blocks of the docs: what sits between ``<!-- NAME -->`` and ``<!-- /NAME -->``, which
tests compare with what a script prints from an evidence file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def marked_block(text: str, name: str) -> str:
    """The lines between the ``<!-- name -->`` line and the ``<!-- /name -->`` line of ``text``,
    without the newline before the closing marker."""
    return text.split(f"<!-- {name} -->\n", 1)[1].split(f"\n<!-- /{name} -->")[0]


def printed(script: str, flag: str, evidence: Path) -> str:
    """What ``scripts/<script> <flag> <evidence>`` prints (a table of an evidence file),
    stripped."""
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), flag, str(evidence)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.strip()
