"""compare_kernel.py's one pass gives shadow/bits.py's statistics (Triton's interpreter, CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.kernels.conftest import import_interpreted
from tests.shadow.pairs import pair
from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.shadow import compare_kernel as compiled
from vllm_gdn_invariant.shadow.bits import compare, ulp_distance
from vllm_gdn_invariant.shadow.compare import FieldPair, FieldStats, torch_stats

INTERPRETED = "gdn_invariant_compare_kernel_interpreted"


@pytest.fixture(scope="module")
def kernel():
    return import_interpreted(INTERPRETED, Path(compiled.__file__))


def stats(kernel, served, reference, rows=None, valid=None) -> FieldStats:
    """The kernel's row for one field, read as FieldStats."""
    out = torch.zeros(kernel.STATS_WIDTH, dtype=torch.int64)
    kernel.field_stats(served, reference, out, rows, valid)
    elements = reference.numel() if reference.dim() == 1 else reference[0].numel()
    return FieldStats.of_row(out.tolist(), elements)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "n, row", [(2112, 2112), (3 * compiled.BLOCK + 5, 3 * compiled.BLOCK + 5), (4 * 1056, 1056)]
)
def test_one_pass_gives_the_statistics_of_bits_compare(kernel, dtype, n, row):
    served, reference = pair(dtype, n, seed=n)
    got = stats(kernel, served.view(-1, row), reference.view(-1, row))
    want = compare(served, reference)
    assert got.differing == want["elements_differing"]
    assert got.nan_mismatches == want["nan_mismatches"] == 1
    assert got.ulp_histogram == want["ulp_histogram"]
    assert all(count > 0 for count in got.ulp_histogram.values())  # every bucket is exercised
    assert got.max_abs_diff == want["max_abs_diff"]
    int64_max = torch.iinfo(torch.int64).max
    assert got.max_ulp == int(ulp_distance(served, reference).max()) == int64_max


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_writes_the_torch_paths_row_item_for_item(kernel, dtype):
    """Both ways give the same raw row (a NaN on one side included: item 1 is then the
    largest distance of the other pairs in both), not only the same FieldStats."""
    served, reference = pair(dtype, 4 * 1056, seed=3)
    field = FieldPair(served.view(4, 1056), reference.view(4, 1056))
    by_kernel = torch.zeros(kernel.STATS_WIDTH, dtype=torch.int64)
    kernel.field_stats(field.served, field.reference, by_kernel)
    by_torch = torch.zeros(kernel.STATS_WIDTH, dtype=torch.int64)
    torch_stats(field, by_torch)
    assert by_kernel.tolist() == by_torch.tolist()
    assert by_kernel[2] == 1 and 0 < by_kernel[1] < torch.iinfo(torch.int64).max


def test_finite_pairs_give_the_largest_distance_and_difference(kernel):
    reference = torch.zeros(5000)
    served = reference.clone()
    served[4999] = -torch.finfo(torch.float32).tiny  # the tail: far from +0 in ULPs
    served[7] = 0.5
    got = stats(kernel, served, reference)
    assert got.max_ulp == int(ulp_distance(served, reference).max()) == 0x3F000000  # 0.5
    assert got.max_abs_diff == 0.5
    assert got.differing == 2 and got.ulp_histogram[">16"] == 2


def test_equal_tensors_give_zeros(kernel):
    x = torch.randn(777).bfloat16()
    got = stats(kernel, x, x.clone())
    assert (got.differing, got.max_ulp, got.nan_mismatches, got.max_abs_diff) == (0, 0, 0, 0.0)
    assert got.ulp_histogram["0"] == 777


def test_served_rows_are_read_in_place_and_invalid_rows_left_out(kernel):
    """Served rows picked by index from a cache whose rows are further apart than their
    length; a differing row marked invalid counts nowhere, the others exactly."""
    g = torch.Generator().manual_seed(5)
    storage = torch.randn(6, 2, 300, generator=g)
    cache = storage[:, 0, :256]  # rows of 256 elements, 600 apart
    blocks = torch.tensor([4, 1, 3], dtype=torch.int64)
    reference = cache.index_select(0, blocks).clone()
    reference[0, 3] += 1.0  # row 0 differs in one element
    reference[2, :] = -reference[2, :]  # row 2 differs everywhere (and is left out)
    valid = torch.tensor([True, True, False])
    got = stats(kernel, cache, reference, blocks, valid)
    served = cache.index_select(0, blocks)[:2]
    want = compare(served, reference[:2])
    assert got.rows == 2 and got.compared == 512 == want["total_elements"]
    assert got.differing == want["elements_differing"] == 1
    assert got.ulp_histogram == want["ulp_histogram"]
    assert got.max_abs_diff == want["max_abs_diff"]
    everything = stats(kernel, cache, reference, blocks)
    assert everything.rows == 3 and everything.differing == 257


def three_fields(seed: int):
    """A check's three fields of 3 rows, the served ones read in place by index from strided
    caches: output bf16 by position, recurrent state fp32 and conv state bf16 by block; rows
    0 and 2 of each differ (one NaN mismatch in the state)."""
    g = torch.Generator().manual_seed(seed)
    positions = torch.tensor([2, 0, 1], dtype=torch.int64)
    blocks = torch.tensor([4, 1, 3], dtype=torch.int32)
    fields = []
    for dtype, rows, shape in (
        (torch.bfloat16, positions, (3, 2, 40)),
        (torch.float32, blocks, (6, 2, 3000)),
        (torch.bfloat16, blocks, (6, 2, 700)),
    ):
        served = torch.randn(*shape, generator=g).to(dtype)[:, 0]  # rows apart by two
        reference = served.index_select(0, rows).clone()
        reference[0, 5] = reference[0, 5] * 2 + 1
        reference[2, -1] = -reference[2, -1] - 1
        fields.append((served, reference, rows))
    fields[1][1][2, 3] = float("nan")
    return fields


@pytest.mark.parametrize("valid", [None, torch.tensor([True, False, True])], ids=["all", "mask"])
def test_three_fields_in_one_launch_write_the_rows_of_one_field_at_a_time(kernel, valid):
    fields = three_fields(7)
    assert kernel.three_fields_apply(fields)
    grid, _, constexprs = kernel.three_fields_arguments(fields, torch.zeros(3, 11), valid)
    assert grid[1] == max(constexprs[f"SPLIT{f}"] for f in range(3)) > constexprs["SPLIT0"]
    together = torch.zeros(3, kernel.STATS_WIDTH, dtype=torch.int64)
    kernel.three_fields_stats(fields, together, valid)
    for f, (served, reference, rows) in enumerate(fields):
        alone = torch.zeros(kernel.STATS_WIDTH, dtype=torch.int64)
        kernel.field_stats(served, reference, alone, rows, valid)
        assert together[f].tolist() == alone.tolist(), f
        assert alone[0] > 0  # every field differs somewhere: a swapped row would show
    assert len({tuple(r) for r in together.tolist()}) == 3


def test_three_fields_of_different_rows_are_refused(kernel):
    fields = three_fields(8)
    served, reference, rows = fields[2]
    fields[2] = (served, reference[:2], rows[:2])
    with pytest.raises(ValueError, match="same rows"):
        kernel.three_fields_stats(fields, torch.zeros(3, kernel.STATS_WIDTH, dtype=torch.int64))
    assert not kernel.three_fields_apply(fields[:2])


def test_other_dtypes_and_shapes_are_refused(kernel):
    x = torch.randn(8, 4)
    assert kernel.fused_applies(x, x.clone())
    assert not kernel.fused_applies(x.half(), x.half())
    assert not kernel.fused_applies(x, x.bfloat16())
    assert not kernel.fused_applies(x, x[:4])
    assert not kernel.fused_applies(x[:0], x[:0])
    assert not kernel.fused_applies(x, x.t().contiguous().t())  # a reference not contiguous
    with pytest.raises(ValueError, match="float32 or bfloat16 rows of one shape"):
        kernel.field_stats(x.half(), x.half(), torch.zeros(kernel.STATS_WIDTH, dtype=torch.int64))
    with pytest.raises(ValueError, match="out must be int64"):
        kernel.field_stats(x, x, torch.zeros(kernel.STATS_WIDTH))


@pytest.mark.skipif(not codegen.nvidia_tool("ptxas").exists(), reason="no ptxas in Triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_compiles_for_sm90_without_spills(dtype):
    cache = codegen.meta((1000, 32, 128, 128), dtype)  # Qwen3-Next's recurrent state blocks
    reference = codegen.meta((64, 32, 128, 128), dtype)  # 64 checked rows
    arguments, constexprs = compiled.kernel_arguments(
        cache,
        reference,
        codegen.meta((compiled.STATS_WIDTH,), torch.int64),
        codegen.meta((64,), torch.int64),
        codegen.meta((64,), torch.int8),
    )
    assert constexprs["SPLIT"] > 1 and constexprs["INDEXED"]
    kernel = codegen.compile_kernel(compiled.rows_stats_kernel, arguments, constexprs, 4, 90, False)
    sass = codegen.sass_of(kernel.asm["cubin"])
    assert "rows_stats_kernel" in sass
    assert not re.search(r"\b(?:LDL|STL)\b", sass)  # no local memory: no register spills


@pytest.mark.skipif(not codegen.nvidia_tool("ptxas").exists(), reason="no ptxas in Triton")
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_the_three_fields_kernel_compiles_for_sm90_without_spills(state_dtype):
    """A check of Qwen3-Next's heads: output, recurrent state and conv state of 64 rows."""
    heads, dim = (32, 128, 128), 2 * 16 * 128 + 32 * 128
    fields = [
        (
            codegen.meta((64, 32, 128), torch.bfloat16),
            codegen.meta((64, 32, 128), torch.bfloat16),
            codegen.meta((64,), torch.int64),
        ),
        (
            codegen.meta((1000, *heads), state_dtype),
            codegen.meta((64, *heads), state_dtype),
            codegen.meta((64,), torch.int32),
        ),
        (
            codegen.meta((1000, dim, 3), torch.bfloat16),
            codegen.meta((64, dim, 3), torch.bfloat16),
            codegen.meta((64,), torch.int32),
        ),
    ]
    out = codegen.meta((3, compiled.STATS_WIDTH), torch.int64)
    valid = codegen.meta((64,), torch.int8)
    grid, arguments, constexprs = compiled.three_fields_arguments(fields, out, valid)
    assert grid[2] == 3 and grid[1] == constexprs["SPLIT1"] > constexprs["SPLIT0"]
    kernel = codegen.compile_kernel(
        compiled.three_fields_stats_kernel, arguments, constexprs, 4, 90, False
    )
    sass = codegen.sass_of(kernel.asm["cubin"])
    assert "three_fields_stats_kernel" in sass
    assert not re.search(r"\b(?:LDL|STL)\b", sass)  # no local memory: no register spills
