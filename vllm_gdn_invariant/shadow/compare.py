"""Served rows against a reference, field by field, in the terms of shadow/bits.py.

For each field (``output``, ``recurrent_state``, ``conv_state``) the statistics are those of
:func:`vllm_gdn_invariant.shadow.bits.compare`: elements compared, elements whose bits differ
(+0 and -0 differ), max |diff| over pairs where both are finite, NaN mismatches, and the ULP
histogram in the buckets of ``bits.ULP_BUCKETS``; plus the max ULP distance (int64 max when
one side is NaN). A field is a :class:`FieldPair`: the reference's rows and where the served
rows are (on CUDA read in place from the live cache and output, without a gathered copy);
rows marked invalid (inactive state index) are left out. Each field's statistics are computed
on its device into one int64 row of compare_kernel.py's layout (``STATS_WIDTH`` values): on
CUDA, for float32 and bfloat16, by compare_kernel.py in one pass, otherwise by torch ops with
``bits.raw_bits`` and ``bits.ulp_distance``. :func:`start` launches them and one transfer of
all rows to the host behind a CUDA event, waiting for nothing; :class:`PendingStats` turns the
rows into :class:`FieldStats` once they are there. tests/shadow/test_compare.py pins them equal
to ``bits.compare``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from vllm_gdn_invariant.shadow.bits import ULP_BUCKET_UPPER, ULP_BUCKETS, raw_bits, ulp_distance
from vllm_gdn_invariant.shadow.compare_kernel import (
    STATS_WIDTH,
    field_stats,
    fused_applies,
    three_fields_apply,
    three_fields_stats,
)
from vllm_gdn_invariant.shadow.record import FIELDS

INT64_MAX = torch.iinfo(torch.int64).max

__all__ = [
    "FIELDS",
    "STATS_WIDTH",
    "FieldPair",
    "FieldStats",
    "PendingStats",
    "all_device_stats",
    "all_torch_stats",
    "at_most_by_bincount",
    "at_most_by_bounds",
    "device_stats",
    "start",
    "summarize",
    "torch_stats",
]


@dataclass(frozen=True)
class FieldPair:
    """One field of a check: the served rows and the reference's.

    ``reference`` is ``[m, ...]``; served row ``i`` is ``served[rows[i]]`` (the live cache or
    output, read in place) or, without ``rows``, ``served[i]``."""

    served: Tensor
    reference: Tensor
    rows: Tensor | None = None

    @property
    def row_elements(self) -> int:
        return math.prod(self.reference.shape[1:])

    def served_rows(self) -> Tensor:
        return self.served if self.rows is None else self.served.index_select(0, self.rows)


@dataclass(frozen=True)
class FieldStats:
    """One field of one check."""

    compared: int
    differing: int
    max_abs_diff: float
    max_ulp: int
    nan_mismatches: int
    ulp_histogram: dict[str, int]
    rows: int

    def to_json(self) -> dict:
        """The record's entry of the field (the record has the check's rows once)."""
        return {
            "compared": self.compared,
            "differing": self.differing,
            "max_abs_diff": self.max_abs_diff,
            "max_ulp": self.max_ulp,
            "nan_mismatches": self.nan_mismatches,
            "ulp_histogram": dict(self.ulp_histogram),
        }

    @classmethod
    def of_row(cls, row: list[int], row_elements: int) -> FieldStats:
        """From a host row of the ``STATS_WIDTH`` layout and the elements per row."""
        compared = row[10] * row_elements
        at_most = row[3:9]
        buckets = [b - a for a, b in zip([0, *at_most], [*at_most, compared], strict=True)]
        return cls(
            compared=compared,
            differing=row[0],
            max_abs_diff=struct.unpack("<d", struct.pack("<q", row[9]))[0],
            max_ulp=INT64_MAX if row[2] else row[1],
            nan_mismatches=row[2],
            ulp_histogram=dict(zip(ULP_BUCKETS, buckets, strict=True)),
            rows=row[10],
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


def torch_stats(pair: FieldPair, out: Tensor, valid: Tensor | None = None) -> None:
    """Write one field's row (int64 ``[STATS_WIDTH]``) by torch ops, on any device and float
    dtype; rows where ``valid`` is False are left out."""
    served, reference = pair.served_rows(), pair.reference
    if served.dtype != reference.dtype or served.shape != reference.shape:
        raise ValueError(
            f"served {served.dtype}{tuple(served.shape)} and reference "
            f"{reference.dtype}{tuple(reference.shape)} differ in dtype or shape"
        )
    if valid is not None:
        keep = valid.bool()
        served, reference = served[keep], reference[keep]
    if reference.numel() == 0:
        out.zero_()
        return
    distance = ulp_distance(served, reference).flatten()
    differing = (raw_bits(served) != raw_bits(reference)).sum()
    one_nan = (torch.isnan(served) ^ torch.isnan(reference)).flatten()
    largest = torch.where(one_nan, 0, distance).max()  # the layout's item 1 (compare_kernel.py)
    finite = torch.isfinite(served) & torch.isfinite(reference)
    diff = torch.where(finite, (served.double() - reference.double()).abs(), 0.0)
    rows = torch.tensor([reference.shape[0]], dtype=torch.int64, device=out.device)
    out.copy_(
        torch.cat(
            [
                torch.stack([differing, largest, one_nan.sum()]),
                at_most(distance),
                diff.max().reshape(1).view(torch.int64),
                rows,
            ]
        )
    )


def device_stats(pair: FieldPair, out: Tensor, valid: Tensor | None = None) -> None:
    """Write one field's row on its device: on CUDA, float32 and bfloat16 fields take
    compare_kernel.py's one pass (``out`` must hold zeros), the rest :func:`torch_stats`."""
    served, reference = pair.served, pair.reference
    if served.is_cuda and fused_applies(served, reference, pair.rows):
        field_stats(served, reference, out, pair.rows, valid)
    else:
        torch_stats(pair, out, valid)


def all_torch_stats(pairs: list[FieldPair], out: Tensor, valid: Tensor | None = None) -> None:
    """Each field's row of ``out`` (``[len(pairs), STATS_WIDTH]``) by :func:`torch_stats`."""
    for pair, row in zip(pairs, out, strict=True):
        torch_stats(pair, row, valid)


def all_device_stats(pairs: list[FieldPair], out: Tensor, valid: Tensor | None = None) -> None:
    """Each field's row of ``out`` (zeros) on the fields' device: three fields the one pass
    takes in one launch (compare_kernel.py's ``three_fields_stats``), else field by field
    (:func:`device_stats`)."""
    triples = [(p.served, p.reference, p.rows) for p in pairs]
    if out.is_cuda and three_fields_apply(triples):
        three_fields_stats(triples, out, valid)
        return
    for pair, row in zip(pairs, out, strict=True):
        device_stats(pair, row, valid)


FieldsStats = Callable[[list[FieldPair], Tensor, "Tensor | None"], None]


@dataclass
class PendingStats:
    """A check's statistics on their way to the host (``result`` waits for them)."""

    names: list[str]
    row_elements: list[int]
    host: Tensor
    event: torch.cuda.Event | None

    def ready(self) -> bool:
        """Whether the statistics are on the host."""
        return self.event is None or self.event.query()

    def result(self) -> dict[str, FieldStats]:
        """The statistics (waits for them if they have not arrived)."""
        if self.event is not None and not self.event.query():
            self.event.synchronize()
        rows = self.host.tolist()
        return {
            name: FieldStats.of_row(rows[i], self.row_elements[i])
            for i, name in enumerate(self.names)
        }


def as_pair(value: FieldPair | tuple[Tensor, Tensor]) -> FieldPair:
    return value if isinstance(value, FieldPair) else FieldPair(*value)


def start(
    pairs: Mapping[str, FieldPair | tuple[Tensor, Tensor]],
    valid: Tensor | None = None,
    fields_stats: FieldsStats = all_device_stats,
) -> PendingStats:
    """Launch the statistics of every field and their transfer to the host; on CUDA nothing
    waits for the device (the transfer goes to pinned memory behind an event)."""
    fields = [as_pair(value) for value in pairs.values()]
    names = list(pairs)
    if not names:
        raise ValueError("no field to compare")
    device = fields[0].reference.device
    rows = torch.zeros((len(names), STATS_WIDTH), dtype=torch.int64, device=device)
    fields_stats(fields, rows, valid)
    elements = [pair.row_elements for pair in fields]
    if device.type != "cuda":
        return PendingStats(names, elements, rows, None)
    host = torch.empty(rows.shape, dtype=torch.int64, pin_memory=True)
    host.copy_(rows, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return PendingStats(names, elements, host, event)


def summarize(
    pairs: Mapping[str, FieldPair | tuple[Tensor, Tensor]],
    valid: Tensor | None = None,
    fields_stats: FieldsStats = all_device_stats,
) -> dict[str, FieldStats]:
    """``{field: FieldPair or (served, reference)}`` -> ``{field: FieldStats}``, waiting for
    the one host transfer; ``fields_stats`` writes the fields' rows on their device
    (:func:`all_device_stats`, or :func:`all_torch_stats` to time the torch ops against the
    one pass)."""
    return start(pairs, valid, fields_stats).result()
