"""Float stepping shared by the harness tests."""

import math

import torch


def next_up(x: torch.Tensor, steps: int = 1) -> torch.Tensor:
    """x moved ``steps`` representable values towards +inf, in its own dtype."""
    for _ in range(steps):
        x = torch.nextafter(x, torch.full_like(x, math.inf))
    return x
