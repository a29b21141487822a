"""Which rows of a step replay generated history, found when the step's GDN metadata is built.

A request that vLLM preempted and now recomputes is scheduled as prefill chunks over its
prompt and then over the tokens it had generated (its history). With the scheduler rule of
``bi_chunk_grid.py`` a chunk never straddles the prompt's end, so a non-speculative prefill
row is a history row exactly when its request is past its prompt. vLLM's V1 model runner
says that per row in ``CommonAttentionMetadata.is_prefilling`` (``num_computed_tokens <
num_prompt_tokens``, ``GPUModelRunner._build_attention_metadata``). Model Runner V2 computes
``is_prefilling`` against the recomputed length; there the mamba model state's patch
(``history_replay.py``) says which rows are past their prompt for the step it prepares
(:func:`step_past_prompt`), and the builder reads that instead.

:func:`history_plan` reads only CPU tensors (no device sync) and lays the history tokens out
step-major: the replay's step ``t`` takes token ``t`` of every history row still that long,
as one contiguous slice (rows ordered longest first). ``history_replay.py``'s wrapper of
vLLM's ``GDNAttentionMetadataBuilder.build`` attaches the plan to the metadata it returns
(``PLAN_ATTR``); ``replayed_forward_core.py`` carries it out.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

PLAN_ATTR = "gdn_invariant_history"
_step = threading.local()


@contextlib.contextmanager
def step_past_prompt(flags: Sequence[bool]) -> Iterator[None]:
    """Within the block, the metadata being built is for a step whose row ``i`` is past its
    prompt when ``flags[i]`` (Model Runner V2's mamba model state sets it)."""
    saved = getattr(_step, "flags", None)
    _step.flags = flags
    try:
        yield
    finally:
        _step.flags = saved


def current_past_prompt() -> Sequence[bool] | None:
    """The flags of :func:`step_past_prompt` for the step being prepared, or None."""
    return getattr(_step, "flags", None)


@dataclass(frozen=True)
class HistoryPlan:
    """The history rows of one step and their tokens, step-major.

    ``rows``: the rows' indices among the step's non-speculative rows, longest first.
    ``lengths``: their token counts. ``order`` (device, int64): the step's token index of
    every history token, step ``t``'s tokens at ``offsets[t]:offsets[t] + counts[t]``.
    ``state_indices`` (device): the rows' state blocks, in ``rows`` order.
    ``sequence_order`` (device, int64): the same tokens row after row, in ``rows`` order, and
    ``cu_seqlens`` (device, int32): where each row's tokens start in it (the layout of a replay
    that runs every token of a row in one call).
    """

    rows: tuple[int, ...]
    lengths: tuple[int, ...]
    offsets: tuple[int, ...]
    counts: tuple[int, ...]
    order: torch.Tensor
    state_indices: torch.Tensor
    sequence_order: torch.Tensor
    cu_seqlens: torch.Tensor
    views: dict[int, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_steps(self) -> int:
        return len(self.counts)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


def history_rows(
    common_attn_metadata: Any, num_decodes: int, past_prompt: Sequence[bool] | None = None
) -> list[int]:
    """The non-speculative prefill rows whose request is past its prompt.

    Rows ``num_decodes`` and later are the step's prefills (the builder's decode-first order);
    a row with no tokens is padding. ``past_prompt`` (Model Runner V2) says per row whether
    its request is past its prompt; without it ``is_prefilling`` (V1) does, and metadata that
    carries neither has no history row.
    """
    if past_prompt is None:
        prefilling = getattr(common_attn_metadata, "is_prefilling", None)
        if prefilling is None:
            return []
        past_prompt = [not flag for flag in prefilling.tolist()]
    num_reqs = min(common_attn_metadata.num_reqs, len(past_prompt))
    query_lens = common_attn_metadata.query_start_loc_cpu[: num_reqs + 1].diff().tolist()
    return [row for row in range(num_decodes, num_reqs) if query_lens[row] > 0 and past_prompt[row]]


def history_plan(
    common_attn_metadata: Any, metadata: Any, past_prompt: Sequence[bool] | None = None
) -> HistoryPlan | None:
    """The replay plan of a step, or None when no row replays history (or the step has
    speculative rows, which are left to vLLM)."""
    if metadata.spec_sequence_masks is not None or metadata.num_prefills == 0:
        return None
    rows = history_rows(common_attn_metadata, metadata.num_decodes, past_prompt)
    if not rows:
        return None
    qsl = common_attn_metadata.query_start_loc_cpu.tolist()
    starts = {row: qsl[row] for row in rows}
    lengths = {row: qsl[row + 1] - qsl[row] for row in rows}
    rows.sort(key=lambda row: -lengths[row])  # stable: equal lengths keep batch order
    counts, offsets, order = [], [], []
    for t in range(lengths[rows[0]]):
        alive = [row for row in rows if lengths[row] > t]
        offsets.append(len(order))
        counts.append(len(alive))
        order.extend(starts[row] + t for row in alive)
    device = metadata.non_spec_state_indices_tensor.device
    order_cpu = torch.tensor(order, dtype=torch.int64)
    rows_cpu = torch.tensor(rows, dtype=torch.int64)
    row_lengths = [lengths[row] for row in rows]
    sequence_cpu = torch.tensor(
        [starts[row] + t for row in rows for t in range(lengths[row])], dtype=torch.int64
    )
    cu_seqlens_cpu = torch.tensor([0, *itertools.accumulate(row_lengths)], dtype=torch.int32)
    return HistoryPlan(
        rows=tuple(rows),
        lengths=tuple(row_lengths),
        offsets=tuple(offsets),
        counts=tuple(counts),
        order=order_cpu.to(device, non_blocking=True),
        state_indices=metadata.non_spec_state_indices_tensor.index_select(
            0, rows_cpu.to(device, non_blocking=True)
        ),
        sequence_order=sequence_cpu.to(device, non_blocking=True),
        cu_seqlens=cu_seqlens_cpu.to(device, non_blocking=True),
    )
