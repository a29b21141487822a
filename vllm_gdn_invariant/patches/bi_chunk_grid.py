"""Patch: under batch-invariant mode every non-final prefill chunk of a Qwen GDN model ends on
the 64-token grid of the GDN chunk kernels.

* **Targets**: ``Scheduler.__init__`` and ``Scheduler._mamba_block_aligned_split``
  (``vllm/v1/core/sched/scheduler.py``). The scheduler calls ``_mamba_block_aligned_split``
  on every prefill chunk it sizes (running and waiting requests) when
  ``need_mamba_block_aligned_split`` is set, which vLLM sets for ``mamba_cache_mode="align"``.
* **Why**: the scheduler cuts a prompt where the step's token budget, shared with the other
  requests, runs out. The GDN prefill kernels work in 64-token chunks counted from the start
  of each sequence in the step, so a cut at token 100 gives chunks [64, 100) and [100, 164)
  where the uncut prompt has [64, 128): other arithmetic, other bits. After vLLM's own sizing
  (the align-mode block boundaries stay as they are: they lie on the grid, see
  ``bi_align_block.py``) the replacement floors the end of every chunk that does not finish
  the prefill to a multiple of 64 tokens from the prompt's start. A chunk that cannot reach
  the next grid point waits for a later step (0 tokens), as align mode already does for its
  blocks. With the float32 recurrent state (``bi_ssm_state.py``) a prompt then gives the same
  bits however the budget splits it.
  ``__init__`` turns the split on for Qwen GDN models in every cache mode, and refuses
  configurations the grid cannot serve: a per-step prefill limit below 64 tokens
  (``max_num_batched_tokens``, ``long_prefill_token_threshold``) would never advance a long
  prompt; in align mode a block size or prefix-match unit that is not a multiple of 64 would
  start prefills from cached states off the grid.
  A prompt whose last chunk would be a single token (a cut one token before the end) is cut
  one grid step earlier instead, when the scheduler can ever give the longer tail in one
  chunk: vLLM counts a one-token chunk after computed tokens as a decode row, so that token
  would take the decode kernels where the uncut prompt takes the chunk kernels. In align mode
  vLLM itself stops a prompt's chunk at its last block boundary to cache the state there,
  which leaves a one-token chunk when the prompt is one token longer than a multiple of the
  block; that chunk runs to the prompt's end instead (vLLM exempts a prefill's last chunk from
  block alignment), or the tail rule would hold the prompt back for ever. For the same reason
  ``__init__`` tells the KV cache coordinator to leave a cached prompt at least two tokens
  (``bi_cache_hit.py``).
* **History replay** (``history_replay.py``): a request recomputed after preemption has
  generated tokens after its prompt. With the replay on, the grid is the prompt's own (chunks
  end on it and at the prompt's end, never across it), and the chunks over the generated
  tokens are left as vLLM sizes them: the GDN layers replay those tokens one decode step at
  a time, whatever the chunk. ``make_history_init`` installs only this rule (mode golden
  without batch-invariant mode). Both turn on the cache key of ``history_cache_key.py`` for
  the process.
* **Upstream**: vllm-project/vllm PR #49827 (open) aligns chunked prefill for Qwen GDN under
  batch-invariant mode; PR #54993 (open) keeps a preempted Mamba2 request's prompt chunks for
  its recovery.
* **Remove when**: vLLM aligns GDN prefill chunks to the kernel grid under the mode and ends a
  recomputed request's chunks at its prompt's end.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_cache_hit import shorten_hits
from vllm_gdn_invariant.patches.bi_patch import (
    CHUNK_GRID,
    GROUP,
    BatchInvarianceConfigError,
    is_qwen_gdn_model,
)
from vllm_gdn_invariant.patches.history_cache_key import salt_generated_blocks

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"

SCHEDULER_INIT = SourceTarget(SCHEDULER_MODULE, "Scheduler.__init__")
ALIGNED_SPLIT = SourceTarget(SCHEDULER_MODULE, "Scheduler._mamba_block_aligned_split")
SCHEDULE = SourceTarget(SCHEDULER_MODULE, "Scheduler.schedule")

GRID_ATTR = "gdn_invariant_chunk_grid"
HISTORY_ATTR = "gdn_invariant_history_replay"
TAIL_ATTR = "gdn_invariant_tail_step"


def grid_limited(
    num_computed: int,
    num_new_tokens: int,
    prefill_end: int,
    grid: int = CHUNK_GRID,
    tail_step: int = 0,
) -> int:
    """How many of ``num_new_tokens`` to schedule from position ``num_computed``: all of them
    when the chunk finishes the prefill (or is not a prefill), else up to the last multiple of
    ``grid`` (from the sequence's start) inside the chunk, 0 when there is none. With a
    ``tail_step`` (a multiple of ``grid``) a chunk that would leave one token to the end of
    the prefill ends ``tail_step`` tokens earlier."""
    if num_computed >= prefill_end:
        return num_new_tokens
    end = num_computed + num_new_tokens
    if end >= prefill_end:
        return num_new_tokens
    end = end // grid * grid
    if tail_step and prefill_end - end == 1:
        end -= tail_step
    return max(end - num_computed, 0)


def history_limited(num_computed: int, num_new_tokens: int, prompt_len: int) -> int:
    """A chunk that starts inside the prompt ends at the prompt's end at the latest."""
    if num_computed < prompt_len:
        return min(num_new_tokens, prompt_len - num_computed)
    return num_new_tokens


def longest_chunk(scheduler: Any) -> int:
    """The most tokens the scheduler ever gives one prefill chunk."""
    limit = scheduler.max_num_scheduled_tokens
    threshold = scheduler.scheduler_config.long_prefill_token_threshold
    return min(limit, threshold) if threshold > 0 else limit


def tail_step(scheduler: Any, grid: int = CHUNK_GRID) -> int:
    """How far before a one-token tail a chunk ends instead: the grid, or in align mode the
    mamba block (chunk ends stay on block boundaries there); 0 when the scheduler can never
    give the longer tail in one chunk (the one-token tail then stays)."""
    step = (
        scheduler.cache_config.block_size
        if scheduler.cache_config.mamba_cache_mode == "align"
        else grid
    )
    return step if longest_chunk(scheduler) > step else 0


def grid_violations(scheduler: Any, grid: int = CHUNK_GRID) -> list[str]:
    """What in the scheduler's configuration the grid cannot serve, in words."""
    problems = []
    limits = {"max_num_batched_tokens": scheduler.max_num_scheduled_tokens}
    threshold = scheduler.scheduler_config.long_prefill_token_threshold
    if threshold > 0:
        limits["long_prefill_token_threshold"] = threshold
    for name, value in limits.items():
        if value < grid:
            problems.append(
                f"{name}={value} is below {grid}: a prompt longer than that could never "
                f"advance to a multiple of {grid} tokens"
            )
    if scheduler.cache_config.mamba_cache_mode == "align":
        sizes = {
            "block_size (the mamba block size in align mode)": scheduler.cache_config.block_size,
            "the prefix-match unit (hash block size)": scheduler.hash_block_size,
        }
        for name, value in sizes.items():
            if value % grid:
                problems.append(
                    f"{name} is {value}, not a multiple of {grid}: cached states would start "
                    f"prefills off the {grid}-token grid of the GDN chunk kernels"
                )
    return problems


def grid_init(original: Callable[..., None], history: bool) -> Callable[..., None]:
    """``Scheduler.__init__`` that turns the grid (and with ``history`` the replay's rule) on
    for Qwen GDN models and refuses what the grid cannot serve."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not (self.has_mamba_layers and is_qwen_gdn_model(self.vllm_config.model_config)):
            return
        problems = grid_violations(self)
        if problems:
            raise BatchInvarianceConfigError(
                "VLLM_BATCH_INVARIANT=1 with a Qwen GDN model: every non-final prefill chunk "
                f"must end on the {CHUNK_GRID}-token grid of the GDN chunk kernels, and "
                + "; ".join(problems)
                + f". Use multiples of {CHUNK_GRID} (--block-size, --prefix-match-unit) and "
                f"a token budget of at least {CHUNK_GRID}."
            )
        setattr(self, GRID_ATTR, CHUNK_GRID)
        setattr(self, TAIL_ATTR, tail_step(self))
        self.need_mamba_block_aligned_split = True
        shorten_hits(self.kv_cache_manager.coordinator)
        if history:
            setattr(self, HISTORY_ATTR, True)
            salt_generated_blocks()

    return __init__


def make_init(original: Callable[..., None]) -> Callable[..., None]:
    """The replacement ``Scheduler.__init__`` (installed only under ``VLLM_BATCH_INVARIANT=1``)."""
    return grid_init(original, history=False)


def make_grid_history_init(original: Callable[..., None]) -> Callable[..., None]:
    """``make_init`` with the history replay's rule (batch-invariant mode with the replay)."""
    return grid_init(original, history=True)


def make_history_init(original: Callable[..., None]) -> Callable[..., None]:
    """The replacement ``Scheduler.__init__`` of the history replay alone (mode golden without
    batch-invariant mode): a recomputed request's chunks end at its prompt's end."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not (self.has_mamba_layers and is_qwen_gdn_model(self.vllm_config.model_config)):
            return
        setattr(self, HISTORY_ATTR, True)
        salt_generated_blocks()
        self.need_mamba_block_aligned_split = True

    return __init__


def whole_tail(start: int, sized: int, asked: int, prefill_end: int) -> int:
    """A chunk vLLM's align-mode sizing stopped one token before the prefill's end (at the last
    block boundary, to cache its state) runs to the end when the tokens asked for reach it:
    vLLM exempts the prefill's last chunk from ending on a block boundary, and a one-token
    chunk would run the decode kernels."""
    if start + sized == prefill_end - 1 and start + asked >= prefill_end:
        return prefill_end - start
    return sized


def make_split(original: Callable[..., int]) -> Callable[..., int]:
    """The replacement ``_mamba_block_aligned_split``: vLLM's align-mode sizing where it
    applies, then the grid for Qwen GDN models."""

    def _mamba_block_aligned_split(
        self: Any,
        request: Any,
        num_new_tokens: int,
        num_new_local_computed_tokens: int = 0,
        num_external_computed_tokens: int = 0,
    ) -> int:
        start = (
            request.num_computed_tokens
            + num_new_local_computed_tokens
            + num_external_computed_tokens
        )
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        if getattr(self, HISTORY_ATTR, False):
            prefill_end = request.num_prompt_tokens
        grid = getattr(self, GRID_ATTR, None)
        if self.cache_config.mamba_cache_mode == "align":
            asked = num_new_tokens
            num_new_tokens = original(
                self,
                request,
                num_new_tokens,
                num_new_local_computed_tokens,
                num_external_computed_tokens,
            )
            if grid is not None:
                num_new_tokens = whole_tail(start, num_new_tokens, asked, prefill_end)
        if getattr(self, HISTORY_ATTR, False):
            num_new_tokens = history_limited(start, num_new_tokens, request.num_prompt_tokens)
        if grid is None:
            return num_new_tokens
        return grid_limited(start, num_new_tokens, prefill_end, grid, getattr(self, TAIL_ATTR, 0))

    return _mamba_block_aligned_split


def scheduler_patches(history: bool = False) -> list[Patch]:
    """The grid's two patches; ``history``: with the history replay's rule."""
    return [
        Patch(
            target=SCHEDULER_INIT,
            replacement=make_grid_history_init if history else make_init,
            why="turn the prefill split on for Qwen GDN models; refuse what the grid cannot serve",
            relies_on=(SCHEDULE,),  # calls _mamba_block_aligned_split where the flag is set
            label="chunk-grid-64",
            group=GROUP,
        ),
        Patch(
            target=ALIGNED_SPLIT,
            replacement=make_split,
            why="non-final prefill chunks end on the 64-token grid of the GDN chunk kernels",
            label="chunk-grid-64",
            group=GROUP,
        ),
    ]
