"""Fixtures of the batch-invariance CPU tests that run vLLM's real scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_gdn_invariant.patches.bi_align_block import grid_block_size

from .helpers import model_folder


@pytest.fixture(scope="module")
def folder() -> Path:
    """A folder with the tiny Qwen3-Next's config, one per test module."""
    return model_folder()


@pytest.fixture(scope="module")
def block() -> int:
    """An align-mode block of 192 tokens, a multiple of the chunk kernels' 64-token grid."""
    return grid_block_size(192)
