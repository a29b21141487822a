"""Patch: under batch-invariant mode with prefix caching (``mamba_cache_mode="align"``), a Qwen
GDN model's block size is a multiple of 64 tokens.

* **Target**: ``Platform._align_hybrid_block_size`` (``vllm/platforms/interface.py``), which
  sizes the attention block of a hybrid model so that its page holds a mamba state; in align
  mode the mamba block (the prefix-caching granularity of GDN states) is that block size.
  vLLM rounds it to the attention kernel's alignment (16 tokens on the usual backends): for
  Qwen3-Next at TP1 544 tokens with a bfloat16 state, 1056 with a float32 one.
* **Why**: in align mode prefills are cut at block boundaries and a prefix-cache hit resumes
  a prefill from the state cached at a block boundary. Off the GDN kernels' 64-token grid, a
  resumed or cut prompt would be chunked differently from the same prompt computed in one
  go. Making the grid compatible is cheaper than refusing: when the user did not choose a
  block size, the replacement raises the starting block size to a multiple of 64 before
  vLLM's sizing, whose result is then a multiple of it (1056 becomes 1088 for Qwen3-Next at
  TP1 with its float32 state: a few more tokens per page, the same number of mamba states).
  A block size the user chose is kept; the scheduler (``bi_chunk_grid.py``) refuses it at
  startup, saying why, if it is off the grid.
* **Upstream**: vLLM 0.33+ already aligns the block to 64 tokens when FlashInfer prefill
  checkpoints are on (``get_mamba_prefill_checkpoint_alignment``); under the mode the prefill
  is Triton (``bi_prefill.py``), which declares no such alignment.
* **Remove when**: vLLM aligns GDN mamba blocks to the chunk grid under batch-invariant mode.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import CHUNK_GRID, GROUP, is_qwen_gdn_model

PLATFORM_MODULE = "vllm.platforms.interface"

ALIGN_HYBRID_BLOCK = SourceTarget(PLATFORM_MODULE, "Platform._align_hybrid_block_size")
UPDATE_BLOCK_SIZE = SourceTarget(PLATFORM_MODULE, "Platform.update_block_size_for_backend")


def grid_block_size(block_size: int, grid: int = CHUNK_GRID) -> int:
    """The smallest multiple of ``grid`` that is also a multiple of ``block_size``."""
    return math.lcm(block_size, grid)


def make_align(original: Callable[..., None]) -> Callable[..., None]:
    """The replacement classmethod body (installed only under ``VLLM_BATCH_INVARIANT=1``)."""

    def _align_hybrid_block_size(cls: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        cache_config = vllm_config.cache_config
        if (
            cache_config.mamba_cache_mode == "align"
            and not cache_config.user_specified_block_size
            and is_qwen_gdn_model(vllm_config.model_config)
            and cache_config.block_size % CHUNK_GRID
        ):
            cache_config.block_size = grid_block_size(cache_config.block_size)
        original(cls, vllm_config, *args, **kwargs)

    return _align_hybrid_block_size


def align_block_patch() -> Patch:
    return Patch(
        target=ALIGN_HYBRID_BLOCK,
        replacement=make_align,
        why="align-mode block size on the 64-token grid for Qwen GDN models",
        relies_on=(UPDATE_BLOCK_SIZE,),  # calls it after choosing the backend's block size
        kind="classmethod",
        label="align-block-64",
        group=GROUP,
    )
