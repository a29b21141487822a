"""Prefix-cache hits under the history replay, on vLLM's real ``Scheduler`` and KV cache
manager in align mode: a prompt never finds a block whose GDN state came from decode steps
(the next turn of a conversation gets the bits it gets without the cache); a preempted
request finds its own decode-built blocks again and replays its history from there."""

from __future__ import annotations

import pytest

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_chunk_grid import scheduler_patches
from vllm_gdn_invariant.patches.history_cache_key import (
    DECODE_KEY,
    cache_key_patches,
    decode_key,
    salting,
)

from .helpers import run_until_computed, scheduler, vllm_config

PROMPT = 500
GENERATED = 300


def replay_patches(salt: bool):
    """The scheduler's replay rule, with or without the cache key."""
    return scheduler_patches(history=True) + (cache_key_patches() if salt else [])


def new_request(request_id: str, tokens: list[int], hasher):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    return Request(
        request_id, list(tokens), SamplingParams(max_tokens=4), None, block_hasher=hasher
    )


def answered(sched, request_id: str, prompt: list[int]):
    """A request of ``prompt`` that generated ``GENERATED`` tokens and finished; its blocks are
    back in the pool, cached."""
    from vllm.v1.request import RequestStatus

    first = new_request(request_id, prompt, sched.gdn_test_block_hasher)
    sched.add_request(first)
    run_until_computed(sched, [first], {request_id: GENERATED})
    tokens = list(first.all_token_ids)
    sched.finish_requests(request_id, RequestStatus.FINISHED_STOPPED)
    return tokens


def hit_tokens(sched, req) -> int:
    return sched.kv_cache_manager.get_computed_blocks(req)[1]


def preempt_keeping_the_cache(sched, req) -> None:
    """Preempt the running requests as KV pressure does: blocks freed, the prefix cache kept
    (vLLM's ``reset_prefix_cache(reset_running_requests=True)`` without the reset)."""
    assert req in sched.running
    manager = sched.kv_cache_manager
    manager.reset_prefix_cache = lambda: True
    try:
        assert sched.reset_prefix_cache(reset_running_requests=True)
    finally:
        del manager.reset_prefix_cache
    assert req.num_preemptions == 1 and req.num_computed_tokens == 0


def prompt_tokens(n: int) -> list[int]:
    return [1 + i % 400 for i in range(n)]


def next_turn_hit(folder, block, salt: bool) -> int:
    with applied(replay_patches(salt)):
        sched = scheduler(vllm_config(folder, budget=256, align_block=block))
        assert salting() or not salt
        answer = answered(sched, "first", prompt_tokens(PROMPT))
        turn = new_request("turn", answer + [9] * 50, sched.gdn_test_block_hasher)
        return hit_tokens(sched, turn)


def test_the_next_turn_finds_no_block_past_the_previous_prompt(folder, block):
    hit = next_turn_hit(folder, block, salt=True)
    assert hit == PROMPT // block * block  # the previous prompt's blocks, no further


def test_without_the_key_the_next_turn_starts_from_decode_built_state(folder, block):
    """Negative control: vLLM keys blocks by their tokens alone, so the next turn's prompt
    finds the blocks the previous answer's decode steps filled."""
    hit = next_turn_hit(folder, block, salt=False)
    assert hit > PROMPT


def test_a_preempted_request_finds_its_own_decode_built_blocks(folder, block):
    with applied(replay_patches(salt=True)):
        sched = scheduler(vllm_config(folder, budget=256, align_block=block))
        target = new_request("target", prompt_tokens(PROMPT), sched.gdn_test_block_hasher)
        sched.add_request(target)
        run_until_computed(sched, [target], {"target": GENERATED})
        preempt_keeping_the_cache(sched, target)
        hit = hit_tokens(sched, target)
        chunks = run_until_computed(sched, [target])
    assert hit > PROMPT and hit % block == 0
    assert chunks["target"][-1][0] + chunks["target"][-1][1] == target.num_tokens
    # Recomputed from the hit on: every chunk is past the prompt (history, replayed).
    resumed = [c for c in chunks["target"] if c[0] >= hit]
    assert resumed and resumed[0][0] == hit


def test_blocks_past_a_prompt_hash_apart_from_the_same_tokens_in_a_prompt(folder, block):
    """A preempted request never resumes from another request's prefill-built state: its
    blocks past its prompt and a longer prompt's blocks over the same tokens differ in hash,
    its prompt blocks do not."""
    tokens = prompt_tokens(PROMPT + GENERATED)
    with applied(replay_patches(salt=True)):
        sched = scheduler(vllm_config(folder, budget=256, align_block=block))
        hasher = sched.gdn_test_block_hasher
        longer = new_request("longer", tokens, hasher)
        decoded = new_request("decoded", tokens[:PROMPT], hasher)
        for token in tokens[PROMPT:]:
            decoded.append_output_token_ids(token)
    within = PROMPT // block
    assert len(decoded.block_hashes) == len(longer.block_hashes) > within
    assert decoded.block_hashes[:within] == longer.block_hashes[:within]
    past = zip(decoded.block_hashes[within:], longer.block_hashes[within:], strict=True)
    assert all(a != b for a, b in past)


@pytest.mark.parametrize(
    "prompt, end, expected",
    [
        (500, 384, None),
        (500, 500, None),
        (500, 501, (DECODE_KEY, 500)),
        (64, 4096, (DECODE_KEY, 64)),
    ],
)
def test_decode_key_marks_blocks_ending_past_the_prompt(prompt, end, expected):
    assert decode_key(prompt, end) == expected
