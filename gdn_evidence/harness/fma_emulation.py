"""fp32 fused multiply-add on CPU tensors, correctly rounded: what a golden with FMAs would
compute where a GPU kernel issues ``FFMA`` (one rounding of the exact ``a * b + c``).

    p = a * b            in float64, exact (24 + 24 significant bits)
    s = p + c            in float64, rounded to nearest
    e = TwoSum error     exact: p + c == s + e
    s' = round-to-odd(p + c)   s truncated toward zero (one float64 step when |s| overshot),
                               last significand bit set when e != 0
    fma(a, b, c) = float32(s')  one rounding to nearest

Rounding the float64 sum straight to float32 rounds twice and misses the correctly rounded
result near float32 midpoints; rounding to odd first keeps the one bit that decides a tie, and
float64 has more than 24 + 2 bits, so the last rounding is the only one that counts. Domain:
finite fp32 inputs whose exact result is a normal fp32 number (no subnormals, no overflow).
Groundwork for a cheaper golden (docs/kernels.md, where the no-FMA rule's cost is counted); no
golden uses it yet.
"""

from __future__ import annotations

import torch
from torch import Tensor


def two_sum(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(s, e) with s = round(x + y) and x + y == s + e exactly (float64)."""
    s = x + y
    y_part = s - x
    return s, (x - (s - y_part)) + (y - y_part)


def round_to_odd(s: Tensor, error: Tensor) -> Tensor:
    """The float64 value of s + error (rounded to nearest as s) rounded to odd instead: toward
    zero, with the last significand bit set when the sum is not exact."""
    inexact = error != 0
    overshot = inexact & ((error < 0) != (s < 0))
    toward_zero = torch.where(overshot, torch.nextafter(s, torch.zeros_like(s)), s)
    bits = toward_zero.view(torch.int64)
    return torch.where(inexact, bits | 1, bits).view(torch.float64)


def fma_fp32(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Correctly rounded fp32 ``a * b + c`` of fp32 tensors (module docstring's domain)."""
    for name, value in (("a", a), ("b", b), ("c", c)):
        if value.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {value.dtype}")
    s, error = two_sum(a.double() * b.double(), c.double())
    return round_to_odd(s, error).float()
