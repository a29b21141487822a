"""Prefix caching (``mamba_cache_mode="align"``) under batch-invariant mode: vLLM's real block
sizing for the tiny Qwen3-Next ends on a multiple of the 64-token grid."""

from __future__ import annotations

import pytest
from vllm.platforms.interface import Platform

from vllm_gdn_invariant.patches import applied
from vllm_gdn_invariant.patches.bi_align_block import align_block_patch, grid_block_size
from vllm_gdn_invariant.patches.bi_patch import CHUNK_GRID

from .helpers import model_folder, vllm_config


class TritonLikeBackend:
    """The attention backend's answers the sizing asks for: 16-token kernel blocks."""

    @staticmethod
    def get_supported_kernel_block_sizes():
        return [16]

    @staticmethod
    def customize_spec(spec):
        return spec


def sized(align: bool, user_block: int | None = None) -> tuple[int, int | None]:
    """(block_size, mamba_block_size) after vLLM's sizing of the tiny model (float32 state)."""
    config = vllm_config(model_folder(), budget=2048, align_block=16 if align else None)
    cache = config.cache_config
    cache.mamba_ssm_cache_dtype = "float32"
    cache.block_size = 16 if user_block is None else user_block
    cache.user_specified_block_size = user_block is not None
    Platform._align_hybrid_block_size(config, TritonLikeBackend)
    return cache.block_size, cache.mamba_block_size


def test_vllm_alone_sizes_the_block_off_the_grid():
    block, mamba_block = sized(align=True)
    assert block == mamba_block and block % 16 == 0 and block % CHUNK_GRID  # negative control


def test_the_block_is_on_the_grid_with_the_plugin():
    alone, _ = sized(align=True)
    with applied([align_block_patch()]):
        block, mamba_block = sized(align=True)
    assert block == mamba_block and block % CHUNK_GRID == 0
    assert alone < block < alone + CHUNK_GRID  # the next multiple of 64, no more


def test_a_block_size_the_user_chose_is_kept_for_the_scheduler_to_judge():
    with applied([align_block_patch()]):
        block, _ = sized(align=True, user_block=528)
    assert block == 528


def test_without_prefix_caching_the_sizing_is_vllms():
    alone = sized(align=False)
    with applied([align_block_patch()]):
        assert sized(align=False) == alone


@pytest.mark.parametrize("block, expected", [(16, 64), (64, 64), (48, 192), (528, 2112)])
def test_grid_block_size_is_the_least_common_multiple(block, expected):
    assert grid_block_size(block) == expected
