"""What the evidence tests share: a complete report of a clean commit, the cases of one op and
state dtype in a range of batch sizes, from a benchmark report's ``cases``, and a range of
values written as the docs write it."""

from __future__ import annotations

import json
from pathlib import Path


def clean_report(path: Path, commit: str) -> dict:
    """The report at ``path``, asserted complete and run at ``commit`` (its short hash) from a
    clean working tree."""
    report = json.loads(path.read_text())
    assert report["provenance"]["git_commit"][: len(commit)] == commit and report["complete"]
    assert not report["provenance"]["git_dirty"]
    return report


def cells(cases: list[dict], op: str, state: str, low: int = 1, high: int = 1024) -> list[dict]:
    """The cases of ``op`` with a ``state`` state and ``low <= B <= high``, in their order."""
    return [
        c for c in cases if (c["op"], c["state_dtype"]) == (op, state) and low <= c["batch"] <= high
    ]


def span(values: list[float], fmt: str = ".3f", unit: str = "") -> str:
    """``lo–hi`` of ``values`` in ``fmt``, then ``unit`` (``0.951–0.971x``)."""
    return f"{min(values):{fmt}}–{max(values):{fmt}}{unit}"


def fastest_pipelined(ratios: dict[str, float]) -> float:
    """The highest of a variant set's ratios (vLLM's time over each arm's) among its pipelined
    variants (``pipelined_*``): the fastest of them."""
    return max(v for k, v in ratios.items() if k.startswith("pipelined_"))
