"""Served rows against a reference, field by field, in the terms of shadow/bits.py.

For each field (``output``, ``recurrent_state``, ``conv_state``) the statistics are those of
:func:`vllm_gdn_invariant.shadow.bits.compare`: elements compared, elements whose bits differ
(+0 and -0 differ), max |diff| over pairs where both are finite, NaN mismatches, and the ULP
histogram in the buckets of ``bits.ULP_BUCKETS``; plus the max ULP distance (int64 max when
one side is NaN). They are computed on the tensors' device with ``bits.raw_bits`` and
``bits.ulp_distance`` (on CUDA, for float32 and bfloat16, by compare_kernel.py in one pass) and
brought to the host in one transfer for all fields, so a check synchronizes once;
tests/shadow/test_compare.py pins them equal to ``bits.compare``.
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
from vllm_gdn_invariant.shadow.compare_kernel import field_stats, fused_applies
from vllm_gdn_invariant.shadow.record import FIELDS

__all__ = [
    "FIELDS",
    "FieldStats",
    "device_stats",
    "histogram",
    "histogram_by_bincount",
    "histogram_by_bounds",
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


def histogram_by_bincount(distance: Tensor) -> Tensor:
    """ULP-bucket counts of a flat int64 distance tensor: bucket indices, then ``bincount``."""
    bounds = torch.tensor(ULP_BUCKET_UPPER, dtype=torch.int64, device=distance.device)
    return torch.bincount(torch.bucketize(distance, bounds), minlength=len(ULP_BUCKETS))


def histogram_by_bounds(distance: Tensor) -> Tensor:
    """The same counts from one count per bucket bound (``distance <= upper``)."""
    at_most = torch.stack([(distance <= upper).sum() for upper in ULP_BUCKET_UPPER])
    return buckets_from_bounds(at_most, distance.numel())


def histogram(distance: Tensor) -> Tensor:
    """ULP-bucket counts, by the faster way on the tensor's device: on CUDA ``bincount``'s
    kernel contends for a handful of bins with every element (4.6 ms of a 64-row check of
    Qwen3-Next's recurrent state on an H200), on CPU it is the faster one (2-3x)."""
    if distance.device.type == "cuda":
        return histogram_by_bounds(distance)
    return histogram_by_bincount(distance)


def torch_stats(served: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """(int64 [3 + buckets]: differing, max ULP, NaN mismatches, histogram; float64 max |diff|)
    by torch ops, on any device and float dtype."""
    distance = ulp_distance(served, reference).flatten()
    differing = (raw_bits(served) != raw_bits(reference)).sum()
    nan_mismatches = (torch.isnan(served) ^ torch.isnan(reference)).sum()
    ints = torch.cat(
        [torch.stack([differing, distance.max(), nan_mismatches]), histogram(distance)]
    )
    finite = torch.isfinite(served) & torch.isfinite(reference)
    diff = torch.where(finite, (served.double() - reference.double()).abs(), 0.0)
    return ints, diff.max().reshape(1)


def device_stats(served: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """One field's statistics on its device: on CUDA, float32 and bfloat16 fields take
    compare_kernel.py's one pass, the rest :func:`torch_stats`."""
    if served.dtype != reference.dtype or served.shape != reference.shape:
        raise ValueError(
            f"served {served.dtype}{tuple(served.shape)} and reference "
            f"{reference.dtype}{tuple(reference.shape)} differ in dtype or shape"
        )
    if served.is_cuda and fused_applies(served, reference):
        return field_stats(served, reference)
    return torch_stats(served, reference)


def summarize(
    pairs: Mapping[str, tuple[Tensor, Tensor]],
    stats_of: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] = device_stats,
) -> dict[str, FieldStats]:
    """``{field: (served, reference)}`` -> ``{field: FieldStats}``, with one host transfer;
    ``stats_of`` computes each field's statistics on its device (:func:`device_stats`, or
    :func:`torch_stats` to time the torch ops against the one pass)."""
    names = list(pairs)
    stats = [stats_of(*pairs[name]) for name in names]
    floats_as_ints = [s[1].view(torch.int64) for s in stats]
    host = torch.cat([s[0] for s in stats] + floats_as_ints).cpu()  # the one synchronization
    ints = host[: -len(names)].tolist()
    floats = host[-len(names) :].view(torch.float64).tolist()
    width = 3 + len(ULP_BUCKETS)
    out = {}
    for i, name in enumerate(names):
        row = ints[i * width : (i + 1) * width]
        out[name] = FieldStats(
            compared=pairs[name][0].numel(),
            differing=row[0],
            max_abs_diff=floats[i],
            max_ulp=row[1],
            nan_mismatches=row[2],
            ulp_histogram=dict(zip(ULP_BUCKETS, row[3:], strict=True)),
        )
    return out
