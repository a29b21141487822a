"""Non-final prefill chunks of a Qwen GDN model end on the 64-token grid under batch-invariant
mode: vLLM's real ``Scheduler`` class, synthetic requests, no model."""

from __future__ import annotations

import pytest

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_align_block import grid_block_size
from vllm_gdn_invariant.patches.bi_chunk_grid import (
    GRID_ATTR,
    grid_limited,
    scheduler_patches,
)
from vllm_gdn_invariant.patches.bi_patch import CHUNK_GRID, BatchInvarianceConfigError

from .helpers import chunk_ends, model_folder, prefill_chunks, scheduler, vllm_config

# Prompts that share the token budget so that the scheduler cuts them mid-way.
PROMPTS = {"target": 300, "a": 100, "b": 37, "c": 250, "d": 64, "e": 5}


@pytest.fixture
def grid():
    with applied(scheduler_patches()):
        yield


def non_final_ends(chunks):
    return {r: chunk_ends(sizes)[:-1] for r, sizes in chunks.items()}


@pytest.mark.parametrize(
    "computed, new, end, expected",
    [
        (0, 100, 300, 64),  # cut to the grid
        (64, 100, 300, 64),  # from a grid point to the next one inside the chunk
        (0, 50, 300, 0),  # no grid point inside: the request waits
        (0, 300, 300, 300),  # the final chunk is never cut
        (256, 44, 300, 44),  # the final chunk of a prompt off the grid
        (300, 1, 300, 1),  # decode
        (10, 100, 300, 54),  # off-grid start: to the next grid point
    ],
)
def test_grid_limited_cuts_only_non_final_chunks(computed, new, end, expected):
    assert grid_limited(computed, new, end) == expected


@pytest.mark.parametrize("budget", [128, 100, 200, 77])
def test_every_non_final_chunk_ends_on_the_grid(folder, grid, budget):
    sched = scheduler(vllm_config(folder, budget=budget))
    assert getattr(sched, GRID_ATTR) == CHUNK_GRID and sched.need_mamba_block_aligned_split
    chunks = prefill_chunks(sched, PROMPTS)
    for request_id, ends in non_final_ends(chunks).items():
        assert all(e % CHUNK_GRID == 0 for e in ends), (request_id, chunks[request_id])
    assert {r: sum(c) for r, c in chunks.items()} == PROMPTS


def test_vllm_alone_cuts_chunks_off_the_grid(folder):
    """Negative control: the same prompts and budgets without the patch."""
    off_grid = []
    for budget in (128, 100, 200, 77):
        sched = scheduler(vllm_config(folder, budget=budget))
        assert not sched.need_mamba_block_aligned_split
        ends = non_final_ends(prefill_chunks(sched, PROMPTS))
        off_grid += [e for es in ends.values() for e in es if e % CHUNK_GRID]
    assert off_grid


def test_the_target_is_cut_at_the_same_grid_points_alone_and_among_others(folder, grid):
    alone = prefill_chunks(scheduler(vllm_config(folder, budget=128)), {"target": 300})
    among = prefill_chunks(scheduler(vllm_config(folder, budget=128)), PROMPTS)
    # Alone it is cut by the budget only (on the grid: 128 is a multiple of 64); among others
    # at other grid points. Both sets lie on the grid, which is what the kernels need.
    assert set(chunk_ends(alone["target"])[:-1]) <= set(range(0, 300, CHUNK_GRID))
    assert set(chunk_ends(among["target"])[:-1]) <= set(range(0, 300, CHUNK_GRID))


def test_align_mode_keeps_block_boundaries_and_the_grid(folder, grid):
    block = grid_block_size(192)
    sched = scheduler(vllm_config(folder, budget=256, align_block=block))
    assert sched.cache_config.mamba_cache_mode == "align"
    chunks = prefill_chunks(sched, {"target": 700, "a": 90, "b": 450})
    for request_id, ends in non_final_ends(chunks).items():
        assert all(e % CHUNK_GRID == 0 for e in ends), (request_id, chunks[request_id])


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(budget=48), "max_num_batched_tokens=48 is below 64"),
        (dict(budget=512, threshold=40), "long_prefill_token_threshold=40 is below 64"),
        (dict(budget=1024, align_block=528), "block_size (the mamba block size in align mode)"),
    ],
    ids=["budget", "threshold", "align-block"],
)
def test_configurations_the_grid_cannot_serve_are_refused(folder, grid, kwargs, words):
    config = vllm_config(folder, **kwargs)
    with pytest.raises(BatchInvarianceConfigError, match="VLLM_BATCH_INVARIANT=1") as info:
        scheduler(config)
    assert words in str(info.value)


def test_models_without_qwen_gdn_layers_keep_vllms_scheduler(grid):
    folder = model_folder()
    config = vllm_config(folder, budget=48)
    config.model_config.hf_text_config.model_type = "olmo_hybrid"
    config.model_config.hf_config.model_type = "olmo_hybrid"
    sched = scheduler(config)  # no refusal: the grid is not for this model
    assert getattr(sched, GRID_ATTR, None) is None
    assert not sched.need_mamba_block_aligned_split
