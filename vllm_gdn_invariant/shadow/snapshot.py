"""Copies of the sampled decode rows' inputs and state blocks, taken before the step.

A snapshot holds, for ``m`` sampled decode rows: their positions in the step, their state
block indices, copies of their inputs (``mixed_qkv`` before the conv, ``b``, ``a``) and copies
of their conv and recurrent state blocks exactly as the cache stores them (storage layout:
whatever transposition the serving path uses is applied only when a reference reads them).
Taking it launches a handful of gathers and never waits for the device: the row positions
are a window built on the device, and rows whose index marks them inactive (<= 0, the
goldens' contract) are gathered from block 0 and left out of the comparison (compare.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

INDEX_BYTES = 8  # a row's position and block, int64


@dataclass
class Snapshot:
    """The sampled rows of one layer in one step (all tensors on the cache's device)."""

    rows: Tensor  # int64 [m], positions of the rows in the step's token order
    blocks: Tensor  # int64 [m], their state blocks
    mixed_qkv: Tensor  # [m, conv_dim], before the conv
    b: Tensor  # [m, HV]
    a: Tensor  # [m, HV]
    conv_blocks: Tensor  # [m, *conv block], storage layout
    ssm_blocks: Tensor  # [m, *recurrent block], storage layout

    @property
    def num_rows(self) -> int:
        return int(self.rows.numel())

    @property
    def nbytes(self) -> int:
        """Bytes held by the copies."""
        return sum(getattr(self, f.name).nbytes for f in fields(self))


def row_bytes(
    conv_cache: Tensor, ssm_cache: Tensor, mixed_qkv: Tensor, b: Tensor, a: Tensor
) -> int:
    """Bytes one sampled row adds to a snapshot (from shapes alone: this runs in every step)."""
    per_row = sum(
        math.prod(t.shape[1:]) * t.element_size() for t in (conv_cache, ssm_cache, mixed_qkv, b, a)
    )
    return per_row + 2 * INDEX_BYTES


def window(start: int, count: int, num_rows: int, device: torch.device) -> Tensor:
    """Positions ``start, start + 1, ...`` (``count`` of them) modulo ``num_rows``, built on
    ``device`` without a host-to-device copy."""
    return (torch.arange(count, dtype=torch.int64, device=device) + start) % num_rows


def take_snapshot(
    rows: Tensor,
    state_indices: Tensor,
    conv_cache: Tensor,
    ssm_cache: Tensor,
    mixed_qkv: Tensor,
    b: Tensor,
    a: Tensor,
) -> Snapshot:
    """Copy the inputs and state blocks of decode rows ``rows`` (positions; decode row ``i``
    owns ``state_indices[i]``). Inactive indices are gathered from block 0 and dropped later."""
    blocks = state_indices.index_select(0, rows).to(torch.int64)
    safe = blocks.clamp(min=0)
    return Snapshot(
        rows=rows,
        blocks=blocks,
        mixed_qkv=mixed_qkv.index_select(0, rows),
        b=b.index_select(0, rows),
        a=a.index_select(0, rows),
        conv_blocks=conv_cache.index_select(0, safe),
        ssm_blocks=ssm_cache.index_select(0, safe),
    )
