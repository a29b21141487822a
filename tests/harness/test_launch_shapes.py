"""The launch shapes the sweep times and the GPU test checks: well formed and the default left
out (their bits in Triton's interpreter: tests/kernels/test_kernels_recurrent.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gdn_evidence.harness.launch_shapes import conv_candidates, recurrent_candidates
from vllm_gdn_invariant.kernels import recurrent as compiled_recurrent
from vllm_gdn_invariant.kernels.validation import RecurrentDims

ROOT = Path(__file__).resolve().parents[2]
QWEN3_NEXT = RecurrentDims(64, 16, 32, 128, 128, 128**-0.5, True)
STATE_DTYPES = (torch.float32, torch.bfloat16)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES, ids=["fp32", "bf16"])
def test_recurrent_candidates_are_whole_distinct_shapes_beside_the_default(state_dtype):
    default = compiled_recurrent.recurrent_config(QWEN3_NEXT, state_dtype, interpreted=False)
    candidates = recurrent_candidates(QWEN3_NEXT, state_dtype)
    assert default not in candidates
    assert len(set(candidates)) == len(candidates)
    for c in candidates:
        assert c.log2_j + c.log2_cl + c.log2_vec == 7  # K = 128 held whole
        assert c.block_v >= (32 >> c.log2_cl) * c.num_warps  # no thread holds a copy
        assert c.block_v * c.chunks <= 128
    one_warp_chunked = [c for c in candidates if c.num_warps == 1 and c.chunks == 16]
    assert one_warp_chunked, "programs of one warp over all value rows of a head"
    splits = {(c.log2_cl, c.log2_vec) for c in candidates if c.log2_j > 0}
    assert len(splits) == 2
    vector = 16 // state_dtype.itemsize  # vLLM's layout: one slab, 16-byte vectors
    one_slab = [c for c in candidates if c.log2_j == 0]
    lanes = 128 // vector
    assert {(1 << c.log2_cl, 1 << c.log2_vec) for c in one_slab} == {(lanes, vector)}
    assert sorted((c.block_v, c.num_warps) for c in one_slab) == [(8, 1), (16, 1), (32, 1), (32, 2)]


def test_conv_candidates_fill_their_warps():
    assert all(32 * c.num_warps <= c.block_d for c in conv_candidates())


def test_docs_count_the_shapes_the_sweep_times():
    counts = [len(recurrent_candidates(QWEN3_NEXT, dtype)) for dtype in STATE_DTYPES]
    doc = " ".join((ROOT / "docs" / "kernels.md").read_text().split())
    assert f"times the default and {min(counts)} to {max(counts)} other shapes per state" in doc
