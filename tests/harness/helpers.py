"""What the harness tests share: float stepping, a script run in Triton's interpreter."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def next_up(x: torch.Tensor, steps: int = 1) -> torch.Tensor:
    """x moved ``steps`` representable values towards +inf, in its own dtype."""
    for _ in range(steps):
        x = torch.nextafter(x, torch.full_like(x, math.inf))
    return x


def run_interpreted(code: str, *arguments: str) -> dict:
    """The JSON that ``code`` prints on its last line, run with ``arguments`` (its
    ``sys.argv[1:]``) by a new Python in Triton's interpreter (``TRITON_INTERPRET=1`` must be
    set before Triton is imported)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code, *arguments], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
