"""A cached prompt on vLLM's real ``Scheduler`` in align mode under batch-invariant mode: a
prefix-cache hit never leaves it a single token to compute (a one-token chunk after computed
tokens runs the GDN decode kernels, where the prompt without the cache runs the chunk
kernels)."""

from __future__ import annotations

import pytest

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_cache_hit import cache_hit_patch, hit_limit
from vllm_gdn_invariant.patches.bi_chunk_grid import scheduler_patches
from vllm_gdn_invariant.patches.bi_patch import CHUNK_GRID

from .helpers import request, run_until_computed, scheduler, vllm_config


def second_run_chunks(folder, block, patches, prompt_len):
    """The chunks of a prompt computed after a longer prompt that starts with it (cached in
    blocks, their states at the block boundaries)."""
    from vllm.v1.request import RequestStatus

    with applied(patches):
        sched = scheduler(vllm_config(folder, budget=512, align_block=block))
        hasher = sched.gdn_test_block_hasher
        first = request("first", 2 * block + 50, block_hasher=hasher)
        sched.add_request(first)
        run_until_computed(sched, [first])
        sched.finish_requests("first", RequestStatus.FINISHED_STOPPED)
        again = request("again", prompt_len, block_hasher=hasher)
        sched.add_request(again)
        return run_until_computed(sched, [again])["again"]


def chunks_of(folder, block, prompt_len):
    with applied(scheduler_patches()):
        sched = scheduler(vllm_config(folder, budget=512, align_block=block))
        target = request("target", prompt_len, block_hasher=sched.gdn_test_block_hasher)
        sched.add_request(target)
        return run_until_computed(sched, [target])["target"]


def test_a_prompt_one_token_past_a_block_finishes_in_one_chunk(folder, block):
    """vLLM stops the chunk at the last block boundary (to cache its state) and leaves one
    token; under the grid the chunk runs to the prompt's end instead (the tail rule alone
    would hold the prompt at 0 tokens for ever)."""
    assert chunks_of(folder, block, 2 * block + 1) == [(0, 2 * block + 1)]


def test_vllm_alone_leaves_the_last_token_of_such_a_prompt_alone(folder, block):
    """Negative control: vLLM's align-mode sizing cuts at the last block boundary."""
    sched = scheduler(vllm_config(folder, budget=512, align_block=block))
    target = request("target", 2 * block + 1, block_hasher=sched.gdn_test_block_hasher)
    sched.add_request(target)
    chunks = run_until_computed(sched, [target])["target"]
    assert chunks == [(0, 2 * block), (2 * block, 1)]


def test_a_cached_prompt_keeps_at_least_two_tokens_on_the_prefill_path(folder, block):
    prompt_len = 2 * block + 1
    chunks = second_run_chunks(folder, block, scheduler_patches() + [cache_hit_patch()], prompt_len)
    start, n = chunks[-1]
    assert start + n == prompt_len and n > 1, chunks
    assert all((s + k) % CHUNK_GRID == 0 for s, k in chunks[:-1]), chunks


def test_vllm_alone_leaves_a_cached_prompt_one_token(folder, block):
    """Negative control: vLLM's hit stops one token before the end; that token then runs
    alone (a decode row for the GDN layers)."""
    prompt_len = 2 * block + 1
    chunks = second_run_chunks(folder, block, scheduler_patches(), prompt_len)
    assert chunks == [(2 * block, 1)]  # the hit: 2 * block tokens


def test_other_prompts_keep_vllms_hit(folder, block):
    prompt_len = 2 * block + 7
    chunks = second_run_chunks(folder, block, scheduler_patches() + [cache_hit_patch()], prompt_len)
    assert chunks == [(2 * block, 7)]


@pytest.mark.parametrize("limit, expected", [(384, 383), (1, 0), (0, 0)])
def test_hit_limit_is_one_token_short_of_vllms(limit, expected):
    assert hit_limit(limit) == expected
