"""A preempted request's recomputation on vLLM's real ``Scheduler``: its chunks end on its
prompt's grid and at its prompt's end, never across it; the generated tokens after it are
scheduled as vLLM sizes them (the GDN layers replay them). Synthetic requests, no model."""

from __future__ import annotations

import pytest

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_align_block import grid_block_size
from vllm_gdn_invariant.patches.bi_chunk_grid import (
    HISTORY_ATTR,
    grid_limited,
    history_limited,
    scheduler_patches,
)
from vllm_gdn_invariant.patches.bi_patch import CHUNK_GRID
from vllm_gdn_invariant.patches.history_replay import history_scheduler_patches

from .helpers import request, run_until_computed, scheduler, vllm_config


def preempt_and_recompute(sched, requests):
    """Preempt every running request (as ``reset_prefix_cache(reset_running_requests=True)``
    does, the way vLLM's own preemption test forces it) and schedule them again."""
    assert sched.reset_prefix_cache(reset_running_requests=True)
    assert all(r.num_preemptions == 1 and r.num_computed_tokens == 0 for r in requests)
    return run_until_computed(sched, requests)


def straddles(chunks, prompt_len):
    return [(s, n) for s, n in chunks if s < prompt_len < s + n]


def prompt_chunk_ends(chunks, prompt_len):
    return [s + n for s, n in chunks if s + n <= prompt_len]


@pytest.mark.parametrize(
    "computed, new, prompt, expected",
    [(0, 400, 300, 300), (256, 200, 300, 44), (300, 80, 300, 80), (310, 5, 300, 5)],
)
def test_history_limited_ends_a_chunk_at_the_prompt_end(computed, new, prompt, expected):
    assert history_limited(computed, new, prompt) == expected


@pytest.mark.parametrize(
    "computed, new, end, step, expected",
    [(0, 128, 129, 64, 64), (0, 128, 129, 0, 128), (64, 64, 129, 64, 0), (0, 200, 129, 64, 200)],
)
def test_grid_limited_never_leaves_a_one_token_tail(computed, new, end, step, expected):
    assert grid_limited(computed, new, end, CHUNK_GRID, step) == expected


@pytest.mark.parametrize("budget, prompt_len, generated", [(128, 300, 40), (200, 333, 90)])
def test_a_recomputed_request_is_cut_at_its_prompt_end(folder, budget, prompt_len, generated):
    with applied(scheduler_patches(history=True)):
        sched = scheduler(vllm_config(folder, budget=budget))
        assert getattr(sched, HISTORY_ATTR)
        target = request("target", prompt_len)
        other = request("other", 150, 5)
        for r in (target, other):
            sched.add_request(r)
        first = run_until_computed(sched, [target, other], {"target": generated, "other": 9})
        again = preempt_and_recompute(sched, [target, other])
    for chunks, r in ((first, target), (again, target), (again, other)):
        prompt = r.num_prompt_tokens
        ends = prompt_chunk_ends(chunks[r.request_id], prompt)
        assert prompt in ends, chunks[r.request_id]
        assert all(e % CHUNK_GRID == 0 for e in ends if e != prompt), chunks[r.request_id]
        assert not straddles(chunks[r.request_id], prompt)
    # The recomputation covers the prompt and every generated token.
    assert sum(n for _, n in again["target"]) == prompt_len + generated


def test_without_the_rule_the_recomputation_crosses_the_prompt_end(folder):
    """Negative control: the grid alone treats prompt and history as one prefill."""
    with applied(scheduler_patches(history=False)):
        sched = scheduler(vllm_config(folder, budget=128))
        target = request("target", 300)
        sched.add_request(target)
        run_until_computed(sched, [target], {"target": 40})
        again = preempt_and_recompute(sched, [target])
    assert straddles(again["target"], 300)


def test_mode_golden_alone_cuts_at_the_prompt_end_without_the_grid(folder):
    with applied(history_scheduler_patches()):
        sched = scheduler(vllm_config(folder, budget=100))
        target = request("target", 300)
        sched.add_request(target)
        first = run_until_computed(sched, [target], {"target": 40})
        again = preempt_and_recompute(sched, [target])
    assert not straddles(again["target"], 300)
    assert 300 in prompt_chunk_ends(again["target"], 300)
    # No grid: the budget alone cuts the prompt.
    assert any(e % CHUNK_GRID for e in prompt_chunk_ends(first["target"], 300) if e != 300)


def test_align_mode_cuts_at_the_prompt_end_and_keeps_block_boundaries(folder):
    block = grid_block_size(192)
    with applied(scheduler_patches(history=True)):
        sched = scheduler(vllm_config(folder, budget=256, align_block=block))
        target = request("target", 500, block_hasher=sched.gdn_test_block_hasher)
        sched.add_request(target)
        run_until_computed(sched, [target], {"target": 300})
        again = preempt_and_recompute(sched, [target])
    chunks = again["target"]
    assert not straddles(chunks, 500) and 500 in prompt_chunk_ends(chunks, 500)
    total = target.num_tokens
    last_cache_position = total - total % block
    for start, n in chunks:
        end = start + n
        if end < last_cache_position and end != 500:
            assert end % block == 0, chunks  # vLLM's align-mode boundaries


@pytest.mark.parametrize("history", [False, True])
def test_a_prompt_is_never_left_with_a_one_token_chunk(folder, history):
    with applied(scheduler_patches(history=history)):
        sched = scheduler(vllm_config(folder, budget=128))
        target = request("target", 129)
        sched.add_request(target)
        chunks = run_until_computed(sched, [target])
    assert [n for _, n in chunks["target"]] == [64, 65]


def test_vllm_alone_leaves_a_one_token_chunk(folder):
    """Negative control: vLLM's scheduler cuts a 129-token prompt at 128 under a budget of
    128; the one-token chunk then runs on the decode kernels."""
    sched = scheduler(vllm_config(folder, budget=128))
    target = request("target", 129)
    sched.add_request(target)
    chunks = run_until_computed(sched, [target])
    assert [n for _, n in chunks["target"]] == [128, 1]
