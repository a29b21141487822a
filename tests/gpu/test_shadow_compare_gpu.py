"""GPU: compare_kernel.py's one pass gives compare.py's torch statistics on CUDA, field by
field, for a checked layer's shapes, with served rows read in place from a cache and an
inactive row left out. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.shadow.pairs import pair
from vllm_gdn_invariant.shadow.compare import (
    STATS_WIDTH,
    FieldPair,
    all_device_stats,
    device_stats,
    torch_stats,
)
from vllm_gdn_invariant.shadow.compare_kernel import BLOCK, three_fields_apply

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def row(stats_of, field: FieldPair, valid: torch.Tensor | None = None) -> list[int]:
    """One field's statistics row (int64, the float max |diff| as its bits) on the host."""
    out = torch.zeros(STATS_WIDTH, dtype=torch.int64, device=field.reference.device)
    stats_of(field, out, valid)
    return out.tolist()


def on_cpu(field: FieldPair) -> FieldPair:
    rows = None if field.rows is None else field.rows.cpu()
    return FieldPair(field.served.cpu(), field.reference.cpu(), rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "rows, elements",
    [(1, 2112), (3, BLOCK + 5), (64, 32 * 128 * 128)],
    ids=["small", "tail", "64-rows"],
)
def test_the_one_pass_equals_the_torch_ops_on_cuda(dtype, rows, elements):
    served, reference = pair(dtype, rows * elements, seed=rows)
    field = FieldPair(served.view(rows, elements).cuda(), reference.view(rows, elements).cuda())
    fused = row(device_stats, field)
    assert fused == row(torch_stats, field)
    assert fused == row(torch_stats, on_cpu(field))
    assert fused[0] > 0 and fused[2] == 1  # differences and one NaN mismatch to count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_read_in_place_with_an_inactive_row_equal_the_torch_ops(dtype):
    cache_rows, elements = 12, 32 * 128
    served, _ = pair(dtype, cache_rows * 2 * elements, seed=7)
    cache = served.view(cache_rows, 2, elements)[:, 1].cuda()  # rows 2 * elements apart
    blocks = torch.tensor([5, 0, 9, 2], device="cuda")
    reference = cache.index_select(0, blocks).clone()
    reference.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)[:, ::7] += 3
    valid = blocks > 0
    field = FieldPair(cache, reference, blocks)
    fused = row(device_stats, field, valid)
    assert fused == row(torch_stats, field, valid)
    assert fused == row(torch_stats, on_cpu(field), valid.cpu())
    assert fused[10] == 3 and fused[0] > 0  # three rows compared, with differences


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_three_fields_in_one_launch_equal_the_torch_ops_on_cuda(state_dtype):
    """A check of Qwen3-Next's heads (64 rows): output by position, recurrent and conv state
    by block from strided caches, one inactive row; the one launch gives each field's torch
    row."""
    g = torch.Generator().manual_seed(11)
    positions = torch.randperm(64, generator=g)
    blocks = torch.randperm(100, generator=g)[:64].to(torch.int32) + 1
    blocks[5] = 0  # inactive
    valid = blocks > 0
    fields = []
    for dtype, rows, shape in (
        (torch.bfloat16, positions, (64, 32, 128)),
        (state_dtype, blocks, (101, 32, 128, 128)),
        (torch.bfloat16, blocks, (101, 8192, 3)),
    ):
        cache = torch.randn(shape[0], 2 * torch.Size(shape[1:]).numel(), generator=g)
        served = cache.to(dtype)[:, : torch.Size(shape[1:]).numel()].view(shape).cuda()
        reference = served.index_select(0, rows.cuda()).clone()
        bits = reference.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)
        bits.view(64, -1)[:, ::97] += 2
        fields.append(FieldPair(served, reference, rows.cuda()))
    assert three_fields_apply([(p.served, p.reference, p.rows) for p in fields])
    out = torch.zeros(3, STATS_WIDTH, dtype=torch.int64, device="cuda")
    all_device_stats(fields, out, valid.cuda())
    for f, field in enumerate(fields):
        assert out[f].tolist() == row(torch_stats, field, valid.cuda()), f
        assert out[f, 10] == 63 and out[f, 0] > 0
