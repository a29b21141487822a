"""Served and reference tensors for the compare tests: 0-40 ULPs apart in places, with the
special cases the statistics must tell apart."""

from __future__ import annotations

import torch

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def pair(dtype: torch.dtype, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(served, reference)``, flat, of ``n`` elements: an eighth of them moved 0-40 ULPs,
    and at the start and at the very end (the last program's tail in compare_kernel.py) the
    special cases."""
    g = torch.Generator().manual_seed(seed)
    reference = torch.randn(n, generator=g).to(dtype)
    served = reference.clone()
    bits = served.view(BITS[dtype])
    where = torch.randperm(n, generator=g)[: n // 8]
    bits[where] += torch.randint(-40, 41, (where.numel(),), generator=g).to(bits.dtype)
    served[0], reference[0] = 0.0, -0.0  # differ in bits, 0 ULPs
    served[1] = float("nan")  # one side NaN: int64 max
    served[2], reference[2] = float("inf"), float("inf")  # equal, not finite
    served[3], reference[3] = 1.0, -1.0  # across zero
    served[4], reference[4] = float("nan"), -float("nan")  # both NaN: 0 ULPs, bits differ
    served[-1], reference[-1] = 2.0, 3.0  # the last element
    return served, reference
