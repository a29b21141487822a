"""Bit-level comparison of floating tensors: equal bits, differing elements, ULP distances.

A ULP distance is the difference of the two bit patterns read as integers ordered like the
values (adjacent floats of the dtype differ by 1, +0 and -0 are both 0), so it is counted in
the ULPs of the tensors' own dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor

BITS_DTYPES = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # by element size in bytes
ULP_BUCKETS = ("0", "1", "2", "3-4", "5-8", "9-16", ">16")
ULP_BUCKET_UPPER = (0, 1, 2, 4, 8, 16)  # inclusive upper ends; the rest is ">16"


def raw_bits(x: Tensor) -> Tensor:
    """The bit patterns of a floating tensor as a signed integer tensor of the same width."""
    return x.contiguous().view(BITS_DTYPES[x.element_size()])


def same_bits(a: Tensor, b: Tensor) -> bool:
    """True when a and b have the same dtype, shape and bit pattern (NaN and -0 included).

    Tensors that are not 16, 32 or 64-bit floats are compared by value (``torch.equal``).
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if not a.is_floating_point() or a.element_size() not in BITS_DTYPES:
        return torch.equal(a, b)
    return torch.equal(raw_bits(a), raw_bits(b))


def differ(a: Tensor, b: Tensor) -> int:
    """How many elements' bit patterns differ.

    +0 and -0 differ; two NaNs of the same pattern do not, so an unwritten (NaN-poisoned) row
    counts only where the other side has a value.
    """
    return int((raw_bits(a) != raw_bits(b)).sum())


def ordered_bits(x: Tensor) -> Tensor:
    """Bit patterns as int64 ordered like the values: adjacent floats differ by 1, +0 == -0 == 0."""
    bits = raw_bits(x).to(torch.int64)
    magnitude_mask = (1 << (8 * x.element_size() - 1)) - 1
    magnitude = torch.bitwise_and(bits, magnitude_mask)
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(a: Tensor, b: Tensor) -> Tensor:
    """|ordered(a) - ordered(b)| per element; 0 when both are NaN, int64 max when one is."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{tuple(a.shape)} with {b.dtype}{tuple(b.shape)}")
    distance = (ordered_bits(a) - ordered_bits(b)).abs()
    a_nan, b_nan = torch.isnan(a), torch.isnan(b)
    distance = torch.where(a_nan & b_nan, 0, distance)
    return torch.where(a_nan ^ b_nan, torch.iinfo(torch.int64).max, distance)


def ulp_histogram(a: Tensor, b: Tensor) -> dict[str, int]:
    """Counts of ULP distances in the buckets 0, 1, 2, 3-4, 5-8, 9-16, >16."""
    distance = ulp_distance(a, b).flatten()
    counts, lower = {}, -1
    for label, upper in zip(ULP_BUCKETS, ULP_BUCKET_UPPER, strict=False):
        counts[label] = int(((distance > lower) & (distance <= upper)).sum())
        lower = upper
    counts[ULP_BUCKETS[-1]] = int((distance > lower).sum())
    return counts


def compare(a: Tensor, b: Tensor) -> dict:
    """Elements whose bits differ, total, max |a - b| over finite pairs, NaN mismatches, and the
    ULP histogram (a +0/-0 pair differs in bits at ULP distance 0)."""
    histogram = ulp_histogram(a, b)
    finite = torch.isfinite(a) & torch.isfinite(b)
    diff = (a.double() - b.double()).abs()[finite]
    return {
        "elements_differing": differ(a, b),
        "total_elements": a.numel(),
        "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
        "nan_mismatches": int((torch.isnan(a) ^ torch.isnan(b)).sum()),
        "ulp_histogram": histogram,
    }
