"""A snapshot copies the sampled rows' inputs and blocks behind a zero null block, marks the
inactive rows, and takes the bytes its size says."""

from __future__ import annotations

import torch

from vllm_gdn_invariant.shadow.bits import same_bits
from vllm_gdn_invariant.shadow.snapshot import SnapshotSize, take_snapshot, window

CPU = torch.device("cpu")


def test_the_window_wraps_around_the_decode_rows():
    assert window(1, 3, 5, CPU).tolist() == [1, 2, 3]
    assert window(3, 4, 5, CPU).tolist() == [3, 4, 0, 1]
    assert window(0, 5, 5, CPU).tolist() == [0, 1, 2, 3, 4]
    assert window(2, 1, 3, CPU).dtype == torch.int64


def caches(g: torch.Generator):
    conv_cache = torch.randn(6, 8, 3, generator=g).to(torch.bfloat16)
    ssm_cache = torch.randn(6, 2, 4, 4, generator=g)
    mixed_qkv = torch.randn(4, 8, generator=g).to(torch.bfloat16)
    b, a = torch.randn(4, 2, generator=g), torch.randn(4, 2, generator=g)
    return conv_cache, ssm_cache, mixed_qkv, b, a


def test_rows_are_copied_behind_a_zero_null_block_and_inactive_rows_are_marked():
    conv_cache, ssm_cache, mixed_qkv, b, a = caches(torch.Generator().manual_seed(0))
    state_indices = torch.tensor([5, -1, 2, 0], dtype=torch.int32)
    rows = window(1, 3, 4, CPU)  # decode rows 1, 2, 3: blocks -1 (padding), 2, 0 (null)
    snapshot = take_snapshot(rows, state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)

    assert snapshot.blocks.tolist() == [0, 2, 0]
    assert snapshot.active.tolist() == [False, True, False]
    for scratch, cache in ((snapshot.conv_scratch, conv_cache), (snapshot.ssm_scratch, ssm_cache)):
        assert scratch.shape == (4, *cache.shape[1:])
        assert same_bits(scratch[0], torch.zeros_like(scratch[0]))
        assert same_bits(scratch[1:], cache[[0, 2, 0]])
    assert same_bits(snapshot.conv_blocks, conv_cache[[0, 2, 0]])
    assert same_bits(snapshot.mixed_qkv, mixed_qkv[1:4])
    assert same_bits(snapshot.b, b[1:4]) and same_bits(snapshot.a, a[1:4])


def test_a_snapshot_takes_the_bytes_its_size_says():
    conv_cache, ssm_cache, mixed_qkv, b, a = caches(torch.Generator().manual_seed(1))
    state_indices = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    size = SnapshotSize.of(state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)
    for m in (1, 4):
        rows = window(0, m, 4, CPU)
        snapshot = take_snapshot(rows, state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)
        assert snapshot.nbytes == size.fixed + m * size.per_row
    assert size.rows_within(size.fixed + 2 * size.per_row) == 2
    assert size.rows_within(size.fixed + 2 * size.per_row - 1) == 1
    assert size.rows_within(size.fixed) == 0


def test_a_clone_shares_no_storage():
    conv_cache, ssm_cache, mixed_qkv, b, a = caches(torch.Generator().manual_seed(2))
    state_indices = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    snapshot = take_snapshot(
        window(0, 2, 4, CPU), state_indices, conv_cache, ssm_cache, mixed_qkv, b, a
    )
    copy = snapshot.clone()
    copy.ssm_scratch.add_(1.0)
    copy.conv_scratch.add_(1.0)
    assert not same_bits(copy.ssm_blocks, snapshot.ssm_blocks)
    assert not same_bits(copy.conv_blocks, snapshot.conv_blocks)
