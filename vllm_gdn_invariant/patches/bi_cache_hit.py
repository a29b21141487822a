"""Patch: under batch-invariant mode a prefix-cache hit never leaves a Qwen GDN prompt a single
token to compute.

* **Target**: ``HybridKVCacheCoordinator.find_longest_cache_hit``
  (``vllm/v1/core/kv_cache_coordinator.py``), which ``KVCacheManager.get_computed_blocks``
  asks for the longest cached prefix of at most ``num_tokens - 1`` tokens (vLLM recomputes at
  least the last token, for its logits).
* **Why**: when a prompt is cached up to one token before its end (its length is one more
  than a multiple of the block size, and the same prompt ran before: parallel sampling, a
  retried request, a repeated evaluation), vLLM computes the last token alone. A one-token
  chunk after computed tokens is a decode row for the GDN metadata builder, so that token runs
  the decode kernels (conv update, packed decode) where the same prompt without the cache runs
  the chunk kernels: other bits for the token that gives the first logits. With the patch the
  hit is at most ``num_tokens - 2`` tokens, so the rest of the prompt (one block and one token
  in that case) is a prefill chunk that starts on a block boundary, on the 64-token grid.
* **Upstream**: none.
* **Remove when**: vLLM computes the rest of a cached prompt on the prefill path whatever its
  length, or GDN decode reproduces the chunk kernels' bits.
* **Applies**: modes route and golden, with VLLM_BATCH_INVARIANT=1.

The shorter hit applies only to the coordinator of a scheduler that serves a Qwen GDN model
(:func:`shorten_hits`, called by the chunk grid's ``Scheduler.__init__``, which knows the
model); other models keep vLLM's hits. It costs at most one block of recomputation, only for
a prompt whose length is one more than a multiple of the block size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_gdn_invariant.patches.base import Patch, SourceTarget
from vllm_gdn_invariant.patches.bi_patch import GROUP

COORDINATOR_MODULE = "vllm.v1.core.kv_cache_coordinator"
HYBRID_HIT = SourceTarget(COORDINATOR_MODULE, "HybridKVCacheCoordinator.find_longest_cache_hit")
COMPUTED_BLOCKS = SourceTarget(
    "vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks"
)
REQUEST_MAX_HIT = SourceTarget("vllm.v1.request", "Request.get_max_cache_hit_length")
SHORT_HITS_ATTR = "gdn_invariant_short_hits"
LABEL = "no-one-token-tail-hit"


def shorten_hits(coordinator: Any) -> None:
    """This coordinator's hits leave at least two tokens to compute."""
    setattr(coordinator, SHORT_HITS_ATTR, True)


def hit_limit(max_cache_hit_length: int) -> int:
    """The longest hit allowed: one token short of vLLM's limit (``num_tokens - 1``)."""
    return max(max_cache_hit_length - 1, 0)


def make_find_longest_cache_hit(original: Callable[..., Any]) -> Callable[..., Any]:
    """``find_longest_cache_hit`` that stops two tokens before a Qwen GDN prompt's end."""

    def find_longest_cache_hit(
        self: Any, block_hashes: Any, max_cache_hit_length: int, *args: Any, **kwargs: Any
    ) -> Any:
        if getattr(self, SHORT_HITS_ATTR, False):
            max_cache_hit_length = hit_limit(max_cache_hit_length)
        return original(self, block_hashes, max_cache_hit_length, *args, **kwargs)

    return find_longest_cache_hit


def cache_hit_patch() -> Patch:
    return Patch(
        target=HYBRID_HIT,
        replacement=make_find_longest_cache_hit,
        why="a prefix-cache hit leaves a Qwen GDN prompt at least two tokens to compute",
        # they ask for at most num_tokens - 1 cached tokens
        relies_on=(COMPUTED_BLOCKS, REQUEST_MAX_HIT),
        label=LABEL,
        group=GROUP,
    )
