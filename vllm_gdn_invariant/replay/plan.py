"""Where each sequence's tokens lie in a packed batch, and the order the replay steps them in.

Sequence ``s`` owns tokens ``cu_seqlens[s] .. cu_seqlens[s+1] - 1``. The replay steps all
sequences together, one token of each per step: step ``t`` takes token ``t`` of every sequence
longer than ``t``. With the sequences ranked by length, longest first (ties in sequence order),
the sequences of step ``t`` are the first ``step_sizes[t]`` of the ranking, so a step's rows are
always a prefix of the ranked batch and the ones that have finished fall off its end.

The state pools of the replay put a null block (block 0, the goldens' inactive index) before
the sequences' blocks (``with_null_block``), so sequence blocks are numbered from 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor


@dataclass(frozen=True)
class SequencePlan:
    """The host-side layout of a packed batch (from the values of ``cu_seqlens``)."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    @classmethod
    def from_offsets(cls, offsets: list[int]) -> SequencePlan:
        """The plan of ``cu_seqlens`` values ``offsets`` (checked by the caller)."""
        pairs = zip(offsets[:-1], offsets[1:], strict=True)
        return cls(starts=tuple(offsets[:-1]), lengths=tuple(end - start for start, end in pairs))

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def max_length(self) -> int:
        return max(self.lengths, default=0)

    @cached_property
    def ranking(self) -> tuple[int, ...]:
        """Sequence ids by length, longest first; equal lengths in sequence order."""
        return tuple(sorted(range(self.num_sequences), key=lambda s: -self.lengths[s]))

    def ranking_on(self, device: torch.device) -> Tensor:
        """``ranking`` as an int64 tensor on ``device``: ``index_select`` with it puts the
        sequences in ranking order, with its ``argsort`` back in sequence order."""
        return torch.tensor(self.ranking, dtype=torch.int64, device=device)

    @cached_property
    def step_sizes(self) -> tuple[int, ...]:
        """How many sequences step ``t`` advances, for t = 0 .. max_length - 1 (non-increasing)."""
        ranked = [self.lengths[s] for s in self.ranking]
        sizes, n = [], len(ranked)
        for t in range(self.max_length):
            while ranked[n - 1] <= t:
                n -= 1
            sizes.append(n)
        return tuple(sizes)

    def step_tokens(self, t: int) -> list[int]:
        """The token index of step ``t`` in each of its sequences, in ranking order."""
        ranking = self.ranking[: self.step_sizes[t]]
        return [self.starts[s] + t for s in ranking]

    def step_major_tokens(self) -> list[int]:
        """Every token once, step after step (step 0's tokens first, each in ranking order)."""
        ranking = self.ranking
        return [self.starts[s] + t for t, n in enumerate(self.step_sizes) for s in ranking[:n]]


def with_null_block(blocks: Tensor) -> Tensor:
    """``blocks`` after a zero block 0 (the goldens' null block), in a new tensor."""
    pool = torch.zeros((1 + blocks.shape[0], *blocks.shape[1:]), dtype=blocks.dtype,
                       device=blocks.device)  # fmt: skip
    pool[1:] = blocks
    return pool
