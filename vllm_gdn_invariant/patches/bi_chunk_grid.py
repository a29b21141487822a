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
* **Upstream**: vllm-project/vllm PR #49827 (open) aligns chunked prefill for Qwen GDN under
  batch-invariant mode.
* **Remove when**: vLLM aligns GDN prefill chunks to the kernel grid under the mode.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import (
    CHUNK_GRID,
    GROUP,
    BatchInvarianceConfigError,
    is_qwen_gdn_model,
)

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"

SCHEDULER_INIT = SourceTarget(SCHEDULER_MODULE, "Scheduler.__init__")
ALIGNED_SPLIT = SourceTarget(SCHEDULER_MODULE, "Scheduler._mamba_block_aligned_split")
SCHEDULE = SourceTarget(SCHEDULER_MODULE, "Scheduler.schedule")

GRID_ATTR = "gdn_invariant_chunk_grid"


def grid_limited(
    num_computed: int, num_new_tokens: int, prefill_end: int, grid: int = CHUNK_GRID
) -> int:
    """How many of ``num_new_tokens`` to schedule from position ``num_computed``: all of them
    when the chunk finishes the prefill (or is not a prefill), else up to the last multiple of
    ``grid`` (from the sequence's start) inside the chunk, 0 when there is none."""
    if num_computed >= prefill_end:
        return num_new_tokens
    end = num_computed + num_new_tokens
    if end >= prefill_end:
        return num_new_tokens
    return max(end // grid * grid - num_computed, 0)


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


def make_init(original: Callable[..., None]) -> Callable[..., None]:
    """The replacement ``Scheduler.__init__`` (installed only under ``VLLM_BATCH_INVARIANT=1``)."""

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
        self.need_mamba_block_aligned_split = True

    return __init__


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
        if self.cache_config.mamba_cache_mode == "align":
            num_new_tokens = original(
                self,
                request,
                num_new_tokens,
                num_new_local_computed_tokens,
                num_external_computed_tokens,
            )
        grid = getattr(self, GRID_ATTR, None)
        if grid is None:
            return num_new_tokens
        start = (
            request.num_computed_tokens
            + num_new_local_computed_tokens
            + num_external_computed_tokens
        )
        prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
        return grid_limited(start, num_new_tokens, prefill_end, grid)

    return _mamba_block_aligned_split


def scheduler_patches() -> list[Patch]:
    return [
        Patch(
            target=SCHEDULER_INIT,
            replacement=make_init,
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
