"""A snapshot copies the sampled rows' inputs and blocks behind a zero null block, marks the
inactive rows, and takes the bytes its size says; the one-launch kernel (Triton's interpreter
here) copies the same bits as the torch gathers, from strided caches too."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from tests.kernels.conftest import import_interpreted
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.shadow import snapshot as snapshot_module
from vllm_gdn_invariant.shadow import snapshot_kernel as compiled
from vllm_gdn_invariant.shadow.bits import same_bits
from vllm_gdn_invariant.shadow.snapshot import (
    SnapshotSize,
    snapshot_by_kernel,
    snapshot_by_torch,
    take_snapshot,
    window,
)

CPU = torch.device("cpu")


@pytest.fixture
def interpreted_copy_window(monkeypatch):
    kernel = import_interpreted(
        "gdn_invariant_snapshot_kernel_interpreted", Path(compiled.__file__)
    )
    monkeypatch.setattr(snapshot_module, "copy_window", kernel.copy_window)


def test_the_window_wraps_around_the_decode_rows():
    assert window(1, 3, 5, CPU).tolist() == [1, 2, 3]
    assert window(3, 4, 5, CPU).tolist() == [3, 4, 0, 1]
    assert window(0, 5, 5, CPU).tolist() == [0, 1, 2, 3, 4]
    assert window(2, 1, 3, CPU).dtype == torch.int64


def caches(g: torch.Generator, state_dtype=torch.float32, padded=False):
    """(mixed_qkv, b, a, conv cache, recurrent cache) of 4 decode rows and 6 blocks; with
    ``padded`` the caches' blocks and the inputs' rows are strided, as vLLM's are."""
    pad = 5 if padded else 0

    def strided(shape, dtype):
        flat = torch.randn(shape[0], math.prod(shape[1:]) + pad, generator=g).to(dtype)
        return flat[:, : math.prod(shape[1:])].view(shape)

    return (
        strided((4, 8), torch.bfloat16),
        strided((4, 2), torch.float32),
        strided((4, 2), torch.float32),
        strided((6, 8, 3), torch.bfloat16),
        strided((6, 2, 4, 4), state_dtype),
    )


def test_rows_are_copied_behind_a_zero_null_block_and_inactive_rows_are_marked():
    mixed_qkv, b, a, conv_cache, ssm_cache = caches(torch.Generator().manual_seed(0))
    state_indices = torch.tensor([5, -1, 2, 0], dtype=torch.int32)
    # decode rows 1, 2, 3: blocks -1 (padding), 2, 0 (null)
    snapshot = take_snapshot(1, 3, state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)

    assert snapshot.rows.tolist() == [1, 2, 3]
    assert snapshot.blocks.tolist() == [0, 2, 0]
    assert snapshot.active.tolist() == [False, True, False]
    for scratch, cache in ((snapshot.conv_scratch, conv_cache), (snapshot.ssm_scratch, ssm_cache)):
        assert scratch.shape == (4, *cache.shape[1:])
        assert same_bits(scratch[0], torch.zeros_like(scratch[0]))
        assert same_bits(scratch[1:], cache[[0, 2, 0]])
    assert same_bits(snapshot.conv_blocks, conv_cache[[0, 2, 0]])
    assert same_bits(snapshot.mixed_qkv, mixed_qkv[1:4])
    assert same_bits(snapshot.b, b[1:4]) and same_bits(snapshot.a, a[1:4])


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("padded", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("start, count", [(1, 3), (3, 3), (0, 4)], ids=["inside", "wraps", "all"])
def test_the_kernel_copies_the_bits_of_the_torch_gathers(
    interpreted_copy_window, state_dtype, padded, start, count
):
    sources = caches(torch.Generator().manual_seed(count), state_dtype, padded)
    for source in sources[3:]:
        source[0].fill_(float("nan"))  # block 0 of the live cache is not the null block
    state_indices = torch.tensor([5, -1, 2, 0], dtype=torch.int32)
    by_kernel = snapshot_by_kernel(start, count, state_indices, sources)
    by_torch = snapshot_by_torch(start, count, state_indices, sources)
    for f in fields(by_torch):
        want, got = getattr(by_torch, f.name), getattr(by_kernel, f.name)
        assert got.dtype == want.dtype and got.shape == want.shape, f.name
        assert same_bits(got, want), f.name


def test_the_kernel_is_taken_only_for_rows_it_can_read():
    mixed_qkv, b, a, conv_cache, ssm_cache = caches(torch.Generator().manual_seed(3), padded=True)
    assert compiled.kernel_applies(mixed_qkv, b, a, conv_cache, ssm_cache)
    assert not compiled.kernel_applies(conv_cache.transpose(1, 2))  # a row is not one run


def test_a_snapshot_takes_the_bytes_its_size_says():
    mixed_qkv, b, a, conv_cache, ssm_cache = caches(torch.Generator().manual_seed(1))
    state_indices = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    size = SnapshotSize.of(state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)
    for m in (1, 4):
        snapshot = take_snapshot(0, m, state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)
        assert snapshot.nbytes == size.fixed + m * size.per_row
    assert size.rows_within(size.fixed + 2 * size.per_row) == 2
    assert size.rows_within(size.fixed + 2 * size.per_row - 1) == 1
    assert size.rows_within(size.fixed) == 0


def test_a_clone_shares_no_storage():
    mixed_qkv, b, a, conv_cache, ssm_cache = caches(torch.Generator().manual_seed(2))
    state_indices = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    snapshot = take_snapshot(0, 2, state_indices, conv_cache, ssm_cache, mixed_qkv, b, a)
    copy = snapshot.clone()
    copy.ssm_scratch.add_(1.0)
    copy.conv_scratch.add_(1.0)
    assert not same_bits(copy.ssm_blocks, snapshot.ssm_blocks)
    assert not same_bits(copy.conv_blocks, snapshot.conv_blocks)


@pytest.mark.skipif(not codegen.nvidia_tool("ptxas").exists(), reason="no ptxas in Triton")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_kernel_compiles_for_sm90_without_spills(state_dtype):
    heads, dim = (32, 128, 128), 2 * 16 * 128 + 32 * 128  # Qwen3-Next's
    sources = (
        codegen.meta((64, dim), torch.bfloat16),
        codegen.meta((64, 32), torch.bfloat16),
        codegen.meta((64, 32), torch.bfloat16),
        codegen.meta((1000, dim, 3), torch.bfloat16),
        codegen.meta((1000, *heads), state_dtype),
    )
    copies = tuple(
        codegen.meta((65 if i >= 3 else 64, *t.shape[1:]), t.dtype) for i, t in enumerate(sources)
    )
    grid, arguments, constexprs = compiled.kernel_arguments(
        7,
        64,
        codegen.meta((64,), torch.int32),
        sources,
        codegen.meta((64,), torch.int64),
        codegen.meta((64,), torch.int32),
        codegen.meta((64,), torch.bool),
        copies,
    )
    assert grid == (64, math.prod(heads) // compiled.BLOCK)
    kernel = codegen.compile_kernel(compiled.snapshot_kernel, arguments, constexprs, 4, 90, False)
    sass = codegen.sass_of(kernel.asm["cubin"])
    assert "snapshot_kernel" in sass
    assert not re.search(r"\b(?:LDL|STL)\b", sass)  # no local memory: no register spills
