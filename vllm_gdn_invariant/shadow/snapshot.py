"""Copies of the sampled decode rows' inputs and state blocks, taken before the step.

A snapshot holds, for ``m`` sampled decode rows: their positions in the step, their state
block indices (and which of them are active), copies of their inputs (``mixed_qkv`` before the
conv, ``b``, ``a``) and copies of their conv and recurrent state blocks exactly as the cache
stores them (storage layout: whatever transposition the serving path uses is applied only when
a reference reads them). The blocks are copied into scratch caches of ``m + 1`` blocks, block 0
a zero null block and row ``i`` in block ``i + 1``, the shape the references run on
(reference.py). Taking it never waits for the device: on CUDA it is one launch of
snapshot_kernel.py (positions, indices and copies), elsewhere a handful of torch gathers over
a window of positions built on the device. Rows whose index marks them inactive (<= 0, the
goldens' contract) are gathered from block 0 and left out of the comparison (compare.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from vllm_gdn_invariant.shadow.snapshot_kernel import copy_window, kernel_applies

POSITION_BYTES = 8 + 1  # a row's position (int64) and whether it is active (bool)


@dataclass
class Snapshot:
    """The sampled rows of one layer in one step (all tensors on the cache's device)."""

    rows: Tensor  # int64 [m], positions of the rows in the step's token order
    blocks: Tensor  # [m], their state blocks, inactive ones clamped to 0
    active: Tensor  # bool [m], whether the row's state index was > 0
    mixed_qkv: Tensor  # [m, conv_dim], before the conv
    b: Tensor  # [m, HV]
    a: Tensor  # [m, HV]
    conv_scratch: Tensor  # [m + 1, *conv block], storage layout, block 0 zeros
    ssm_scratch: Tensor  # [m + 1, *recurrent block], storage layout, block 0 zeros

    @property
    def num_rows(self) -> int:
        return int(self.rows.numel())

    @property
    def conv_blocks(self) -> Tensor:
        """The rows' conv blocks ``[m, ...]`` (a view of the scratch cache)."""
        return self.conv_scratch[1:]

    @property
    def ssm_blocks(self) -> Tensor:
        """The rows' recurrent blocks ``[m, ...]`` (a view of the scratch cache)."""
        return self.ssm_scratch[1:]

    @property
    def nbytes(self) -> int:
        """Bytes held by the copies."""
        return sum(getattr(self, f.name).nbytes for f in fields(self))

    def clone(self) -> Snapshot:
        """A copy for a reference that updates its scratch blocks in place."""
        return Snapshot(*(getattr(self, f.name).clone() for f in fields(self)))


@dataclass(frozen=True)
class SnapshotSize:
    """Bytes of a snapshot of a layer: ``fixed + rows * per_row``."""

    fixed: int  # the scratch caches' null blocks
    per_row: int

    @classmethod
    def of(
        cls,
        state_indices: Tensor,
        conv_cache: Tensor,
        ssm_cache: Tensor,
        mixed_qkv: Tensor,
        b: Tensor,
        a: Tensor,
    ) -> SnapshotSize:
        """From shapes and dtypes alone."""

        def row(t: Tensor) -> int:
            return math.prod(t.shape[1:]) * t.element_size()

        fixed = row(conv_cache) + row(ssm_cache)
        inputs = sum(row(t) for t in (mixed_qkv, b, a))
        return cls(fixed, fixed + inputs + state_indices.element_size() + POSITION_BYTES)

    def rows_within(self, max_bytes: int) -> int:
        """The most rows whose snapshot fits in ``max_bytes``."""
        return max(0, (max_bytes - self.fixed) // self.per_row)


def window(start: int, count: int, num_rows: int, device: torch.device) -> Tensor:
    """Positions ``start, start + 1, ...`` (``count`` of them) modulo ``num_rows``, built on
    ``device`` without a host-to-device copy."""
    rows = torch.arange(start, start + count, dtype=torch.int64, device=device)
    return rows.remainder_(num_rows) if start + count > num_rows else rows


def gather_blocks(cache: Tensor, blocks: Tensor) -> Tensor:
    """``cache``'s ``blocks`` behind a zero null block: ``[len(blocks) + 1, ...]``."""
    shape = (blocks.numel() + 1, *cache.shape[1:])
    scratch = torch.empty(shape, dtype=cache.dtype, device=cache.device)
    scratch[0].zero_()
    torch.index_select(cache, 0, blocks, out=scratch[1:])
    return scratch


Sources = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]  # mixed_qkv, b, a, conv, ssm caches


def take_snapshot(
    start: int,
    count: int,
    state_indices: Tensor,
    conv_cache: Tensor,
    ssm_cache: Tensor,
    mixed_qkv: Tensor,
    b: Tensor,
    a: Tensor,
) -> Snapshot:
    """Copy the inputs and state blocks of the decode rows at positions ``start, start + 1,
    ...`` (``count`` of them, modulo ``len(state_indices)``, the step's decode rows; decode row
    ``i`` owns ``state_indices[i]``). Inactive indices are gathered from block 0 and dropped
    later. On CUDA one launch of snapshot_kernel.py, else torch gathers (the same bits)."""
    sources = (mixed_qkv, b, a, conv_cache, ssm_cache)
    if mixed_qkv.is_cuda and kernel_applies(*sources):
        return snapshot_by_kernel(start, count, state_indices, sources)
    return snapshot_by_torch(start, count, state_indices, sources)


def snapshot_by_kernel(start: int, count: int, state_indices: Tensor, sources: Sources) -> Snapshot:
    """:func:`take_snapshot` by snapshot_kernel.py's one launch."""
    device = state_indices.device
    inputs, caches = sources[:3], sources[3:]
    copies = tuple(
        torch.empty((count + null, *t.shape[1:]), dtype=t.dtype, device=device)
        for null, group in ((0, inputs), (1, caches))  # the caches' copies: a null block
        for t in group
    )
    rows = torch.empty(count, dtype=torch.int64, device=device)
    blocks = torch.empty(count, dtype=state_indices.dtype, device=device)
    active = torch.empty(count, dtype=torch.bool, device=device)
    copy_window(start, count, state_indices, sources, rows, blocks, active, copies)
    return Snapshot(rows, blocks, active, *copies)


def snapshot_by_torch(start: int, count: int, state_indices: Tensor, sources: Sources) -> Snapshot:
    """:func:`take_snapshot` by torch gathers."""
    mixed_qkv, b, a, conv_cache, ssm_cache = sources
    rows = window(start, count, state_indices.numel(), mixed_qkv.device)
    indices = state_indices.index_select(0, rows)
    blocks = indices.clamp(min=0)
    return Snapshot(
        rows=rows,
        blocks=blocks,
        active=indices > 0,
        mixed_qkv=mixed_qkv.index_select(0, rows),
        b=b.index_select(0, rows),
        a=a.index_select(0, rows),
        conv_scratch=gather_blocks(conv_cache, blocks),
        ssm_scratch=gather_blocks(ssm_cache, blocks),
    )
