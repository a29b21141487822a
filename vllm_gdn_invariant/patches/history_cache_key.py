"""Patch: a cached block whose GDN state came from decode steps is found only by a request that
decoded it from the same prompt end.

* **Targets**: ``generate_block_hash_extra_keys`` (``vllm/v1/core/kv_cache_utils.py``), the
  extra keys of every block hash, and its ``from ... import`` binding in
  ``vllm/v1/core/block_pool.py`` (the extra keys reported with KV cache events).
* **Why**: with prefix caching in align mode a full block keeps the GDN state at its end. A
  block that ends past its request's prompt holds a state built by decode steps, one token at
  a time; a prompt that covers the same tokens builds that state with the chunk kernels,
  which round differently. Without the patch the block hash is the tokens' alone, so a new
  request whose prompt extends a finished response (the next turn of a conversation) starts
  from decode-built state when that response is still cached and from chunk-built state when
  it is not: its bits depend on what the server ran before. And a preempted request could
  resume from another request's chunk-built state past its own prompt. The patch adds
  ``("gdn_invariant_decode_from", num_prompt_tokens)`` to the extra keys of every block that
  ends past its request's prompt; hashes chain, so every later block differs too. A block
  inside the prompt keeps vLLM's hash. Then a prompt is only ever served prefill-built state
  (the same bits as without the cache), and a recomputed request finds its own decode-built
  blocks again (same tokens, same prompt end) and replays its history from there.
* **Upstream**: none; vLLM PR #54993 (open, Mamba2) recomputes preempted requests without
  touching the cache keys.
* **Remove when**: vLLM keys cached mamba states by how they were computed, or GDN decode
  reproduces the chunk kernels' bits.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1, and mode golden; with
  VLLM_GDN_INVARIANT_REPLAY=on.

The key is added only in a process whose scheduler serves a Qwen GDN model
(:func:`salt_generated_blocks`, called by the scheduler's replay rule in ``bi_chunk_grid.py``),
so other models served with the plugin installed keep vLLM's hashes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget

KV_CACHE_UTILS = "vllm.v1.core.kv_cache_utils"
EXTRA_KEYS = SourceTarget(KV_CACHE_UTILS, "generate_block_hash_extra_keys")
REQUEST_BLOCK_HASHER = SourceTarget(KV_CACHE_UTILS, "get_request_block_hasher")
BLOCK_POOL_MODULE = "vllm.v1.core.block_pool"
DECODE_KEY = "gdn_invariant_decode_from"
LABEL = "history-cache-key"

_salting = {"on": False}


def salt_generated_blocks(on: bool = True) -> None:
    """Whether this process adds :data:`DECODE_KEY` to the hashes of blocks past a prompt
    (on once a scheduler for a Qwen GDN model is built with the replay's rule)."""
    _salting["on"] = on


def salting() -> bool:
    """Whether this process adds :data:`DECODE_KEY` (``salt_generated_blocks``)."""
    return _salting["on"]


def salt_nothing_yet() -> None:
    """Installing the patch: no key until a Qwen GDN scheduler turns it on."""
    salt_generated_blocks(False)


def decode_key(num_prompt_tokens: int, end_token_idx: int) -> tuple[str, int] | None:
    """The extra key of a block ending at ``end_token_idx``: None inside the prompt."""
    if end_token_idx > num_prompt_tokens:
        return (DECODE_KEY, num_prompt_tokens)
    return None


def make_extra_keys(original: Callable[..., Any]) -> Callable[..., Any]:
    """``generate_block_hash_extra_keys`` with the decode key of blocks past the prompt."""

    def generate_block_hash_extra_keys(
        request: Any, start_token_idx: int, end_token_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[tuple[Any, ...] | None, int]:
        keys, next_mm_idx = original(request, start_token_idx, end_token_idx, *args, **kwargs)
        if not _salting["on"]:
            return keys, next_mm_idx
        key = decode_key(request.num_prompt_tokens, end_token_idx)
        if key is None:
            return keys, next_mm_idx
        return (*(keys or ()), key), next_mm_idx

    return generate_block_hash_extra_keys


def cache_key_patches() -> list[Patch]:
    """The extra keys where block hashes are made, and where KV cache events report them."""
    return [
        Patch(
            target=EXTRA_KEYS,
            replacement=make_extra_keys,
            why="blocks past a prompt carry the prompt's length in their hash",
            relies_on=(REQUEST_BLOCK_HASHER,),  # calls it by its module-level name
            prepare=salt_nothing_yet,
            label=LABEL,
        ),
        Patch(
            target=EXTRA_KEYS,
            replacement=make_extra_keys,
            why="KV cache events report the same extra keys",
            binding=BLOCK_POOL_MODULE,
            label=LABEL,
        ),
    ]
