"""The correctly rounded fp32 fused multiply-add, on any device: what a GPU's FFMA computes.

``fma(a, b, c)`` is the exact ``a * b + c`` rounded once to fp32 (nearest even), computed in
float64 so that every step but the last is exact or keeps what the last rounding needs:

    p  = a * b           float64, exact (24 + 24 significant bits)
    s  = p + c           float64, rounded to nearest
    e  = (p + c) - s     exact, by TwoSum
    s' = s rounded to odd: toward zero (one float64 step when s overshot p + c), its last
         significand bit set when e != 0
    fma(a, b, c) = fp32(s')   one rounding to nearest even

Rounding ``s`` straight to fp32 would round twice and miss the correctly rounded result next to
fp32 midpoints; a value rounded to odd with at least two more bits than the target rounds to
the target as the exact value would, and float64 has 53 bits against fp32's 24 (fewer for its
subnormals). fp32 products and sums never leave float64's normal range, so the steps above hold
for every finite fp32 input, subnormal results and overflow to inf included. Where ``s`` is not
finite (an inf or NaN input, or inf - inf), the result is ``s`` rounded to fp32, as the unfused
``a * b + c`` gives. Each step is its own elementwise tensor op, so the bits do not depend on
the device, the shape or the batch.
"""

import torch
from torch import Tensor


def two_sum(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(s, e) with s = x + y rounded and x + y == s + e exactly (finite float64 x, y)."""
    s = x + y
    y_part = s - x
    return s, (x - (s - y_part)) + (y - y_part)


def round_to_odd(s: Tensor, error: Tensor) -> Tensor:
    """``s + error`` (``s`` its rounding to nearest, float64) rounded to odd instead: toward
    zero, with the last significand bit set when the sum is inexact."""
    inexact = error != 0
    overshot = inexact & ((error < 0) != (s < 0))
    toward_zero = torch.where(overshot, torch.nextafter(s, torch.zeros_like(s)), s)
    bits = toward_zero.view(torch.int64)
    return torch.where(inexact, bits | 1, bits).view(torch.float64)


def fma(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Correctly rounded fp32 ``a * b + c`` of fp32 tensors (broadcast), as the module
    docstring computes it."""
    for name, value in (("a", a), ("b", b), ("c", c)):
        if not isinstance(value, Tensor) or value.dtype != torch.float32:
            kind = value.dtype if isinstance(value, Tensor) else type(value).__name__
            raise TypeError(f"fma: {name} must be a float32 tensor, got {kind}")
    s, error = two_sum(a.double() * b.double(), c.double())
    return torch.where(torch.isfinite(s), round_to_odd(s, error), s).float()
