"""Served rows against a reference, field by field, in the terms of shadow/bits.py.

For each field (``output``, ``recurrent_state``, ``conv_state``) the statistics are those of
:func:`vllm_gdn_invariant.shadow.bits.compare`: elements compared, elements whose bits differ
(+0 and -0 differ), max |diff| over pairs where both are finite, NaN mismatches, and the ULP
histogram in the buckets of ``bits.ULP_BUCKETS``; plus the max ULP distance (int64 max when
one side is NaN). Each field's statistics are computed on its device into one int64 row of
compare_kernel.py's layout (``STATS_WIDTH`` values: three counts and maxima, the six counts
``distance <= upper`` of ``bits.ULP_BUCKET_UPPER``, the float64 max |diff| as bits): on CUDA,
for float32 and bfloat16, by compare_kernel.py in one pass, otherwise by torch ops with
``bits.raw_bits`` and ``bits.ulp_distance``. The rows of all fields are one tensor brought to
the host in one transfer, so a check synchronizes once; tests/shadow/test_compare.py pins them
equal to ``bits.compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from vllm_gdn_invariant.shadow.bits import (
    ULP_BUCKET_UPPER,
    ULP_BUCKETS,
    buckets_from_bounds,
    raw_bits,
    ulp_distance,
)
from vllm_gdn_invariant.shadow.compare_kernel import STATS_WIDTH, field_stats, fused_applies
from vllm_gdn_invariant.shadow.record import FIELDS

__all__ = [
    "FIELDS",
    "STATS_WIDTH",
    "FieldStats",
    "at_most_by_bincount",
    "at_most_by_bounds",
    "device_stats",
    "summarize",
    "torch_stats",
]


@dataclass(frozen=True)
class FieldStats:
    """One field of one check."""

    compared: int
    differing: int
    max_abs_diff: float
    max_ulp: int
    nan_mismatches: int
    ulp_histogram: dict[str, int]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def of_row(cls, row: list[int], compared: int) -> FieldStats:
        """From a host row of the ``STATS_WIDTH`` layout and the number of elements."""
        buckets = buckets_from_bounds(torch.tensor(row[3:9], dtype=torch.int64), compared)
        max_abs_diff = torch.tensor([row[9]], dtype=torch.int64).view(torch.float64).item()
        return cls(
            compared=compared,
            differing=row[0],
            max_abs_diff=max_abs_diff,
            max_ulp=row[1],
            nan_mismatches=row[2],
            ulp_histogram=dict(zip(ULP_BUCKETS, buckets.tolist(), strict=True)),
        )


def at_most_by_bincount(distance: Tensor) -> Tensor:
    """Counts of ``distance <= upper`` for each bucket bound (flat int64 distances): bucket
    indices, ``bincount``, running sum."""
    bounds = torch.tensor(ULP_BUCKET_UPPER, dtype=torch.int64, device=distance.device)
    counts = torch.bincount(torch.bucketize(distance, bounds), minlength=len(ULP_BUCKETS))
    return counts.cumsum(0)[: len(ULP_BUCKET_UPPER)]


def at_most_by_bounds(distance: Tensor) -> Tensor:
    """The same counts, one comparison per bound."""
    return torch.stack([(distance <= upper).sum() for upper in ULP_BUCKET_UPPER])


def at_most(distance: Tensor) -> Tensor:
    """The bound counts by the faster way on the tensor's device: on CUDA ``bincount``'s kernel
    contends for a handful of bins with every element (4.6 ms of a 64-row check of Qwen3-Next's
    recurrent state on an H200), on CPU it is the faster one (2-3x)."""
    if distance.device.type == "cuda":
        return at_most_by_bounds(distance)
    return at_most_by_bincount(distance)


def torch_stats(served: Tensor, reference: Tensor, out: Tensor) -> None:
    """Write one field's row (int64 ``[STATS_WIDTH]``) by torch ops, on any device and float
    dtype."""
    distance = ulp_distance(served, reference).flatten()
    differing = (raw_bits(served) != raw_bits(reference)).sum()
    nan_mismatches = (torch.isnan(served) ^ torch.isnan(reference)).sum()
    finite = torch.isfinite(served) & torch.isfinite(reference)
    diff = torch.where(finite, (served.double() - reference.double()).abs(), 0.0)
    out.copy_(
        torch.cat(
            [
                torch.stack([differing, distance.max(), nan_mismatches]),
                at_most(distance),
                diff.max().reshape(1).view(torch.int64),
            ]
        )
    )


def device_stats(served: Tensor, reference: Tensor, out: Tensor) -> None:
    """Write one field's row on its device: on CUDA, float32 and bfloat16 fields take
    compare_kernel.py's one pass (``out`` must hold zeros), the rest :func:`torch_stats`."""
    if served.dtype != reference.dtype or served.shape != reference.shape:
        raise ValueError(
            f"served {served.dtype}{tuple(served.shape)} and reference "
            f"{reference.dtype}{tuple(reference.shape)} differ in dtype or shape"
        )
    if served.is_cuda and fused_applies(served, reference):
        field_stats(served, reference, out)
    else:
        torch_stats(served, reference, out)


def summarize(
    pairs: Mapping[str, tuple[Tensor, Tensor]],
    stats_of: Callable[[Tensor, Tensor, Tensor], None] = device_stats,
) -> dict[str, FieldStats]:
    """``{field: (served, reference)}`` -> ``{field: FieldStats}``, with one host transfer;
    ``stats_of`` writes each field's row on its device (:func:`device_stats`, or
    :func:`torch_stats` to time the torch ops against the one pass)."""
    names = list(pairs)
    if not names:
        return {}
    device = pairs[names[0]][0].device
    rows = torch.zeros((len(names), STATS_WIDTH), dtype=torch.int64, device=device)
    for row, name in zip(rows, names, strict=True):
        stats_of(*pairs[name], row)
    host = rows.tolist()  # the one synchronization
    return {
        name: FieldStats.of_row(host[i], pairs[name][0].numel()) for i, name in enumerate(names)
    }
