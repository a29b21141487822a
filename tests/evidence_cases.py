"""What the evidence tests share: the cases of one op and state dtype in a range of batch sizes,
from a benchmark report's ``cases``."""

from __future__ import annotations


def cells(cases: list[dict], op: str, state: str, low: int = 1, high: int = 1024) -> list[dict]:
    """The cases of ``op`` with a ``state`` state and ``low <= B <= high``, in their order."""
    return [
        c for c in cases if (c["op"], c["state_dtype"]) == (op, state) and low <= c["batch"] <= high
    ]


def fastest_pipelined(ratios: dict[str, float]) -> float:
    """The highest of a variant set's ratios (vLLM's time over each arm's) among its pipelined
    variants (``pipelined_*``): the fastest of them."""
    return max(v for k, v in ratios.items() if k.startswith("pipelined_"))
