"""CPU checks of shadow/bits.py: equal bits, differing elements, ULP distances, histograms."""

import math

import pytest
import torch

from tests.harness.helpers import next_up
from vllm_gdn_invariant.shadow.bits import (
    ULP_BUCKETS,
    compare,
    differ,
    ordered_bits,
    same_bits,
    ulp_distance,
    ulp_histogram,
)


def test_ordered_bits_step_by_one_between_neighbours_and_merge_signed_zeros():
    x = torch.tensor([-1.0, -0.0, 0.0, 1e-45, 1.0, 3.4e38], dtype=torch.float32)
    ordered = ordered_bits(x)
    assert ordered[1] == ordered[2] == 0
    assert (ordered_bits(next_up(x)) - ordered)[[0, 3, 4, 5]].tolist() == [1, 1, 1, 1]
    assert ordered[3] == 1  # the smallest subnormal is one step above zero


def test_ulp_distance_of_known_pairs():
    one = torch.tensor([1.0])
    a = torch.tensor([1.0, 1.0, -1.0, 0.0, math.nan, math.nan, -1e-45, 2.0])
    b = torch.cat(
        [
            next_up(one),
            next_up(one, 3),
            -next_up(one),
            torch.tensor([-0.0, math.nan, 1.0, 1e-45]),
            torch.nextafter(torch.tensor([2.0]), torch.tensor([0.0])),
        ]
    )
    expected = [1, 3, 1, 0, 0, torch.iinfo(torch.int64).max, 2, 1]
    assert ulp_distance(a, b).tolist() == expected


def test_ulp_distance_counts_bf16_ulps():
    a = torch.tensor([1.0, 1.0, -2.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, 1.0234375, -2.015625], dtype=torch.bfloat16)  # +1, +3, +1 ULP
    assert ulp_distance(a, b).tolist() == [1, 3, 1]


def test_ulp_distance_refuses_mismatched_dtypes():
    with pytest.raises(ValueError, match="cannot compare"):
        ulp_distance(torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16))


def test_ulp_histogram_buckets():
    base = torch.ones(11)
    steps = [0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 1000]
    b = torch.stack([next_up(base[i : i + 1], s)[0] for i, s in enumerate(steps)])
    histogram = ulp_histogram(base, b)
    assert histogram == {"0": 1, "1": 1, "2": 1, "3-4": 2, "5-8": 2, "9-16": 2, ">16": 2}
    assert list(histogram) == list(ULP_BUCKETS)


def test_compare_counts_differing_bits_max_diff_and_nans():
    a = torch.tensor([1.0, 0.0, 2.0, math.nan, 5.0])
    b = torch.tensor([1.0, -0.0, 2.5, 1.0, 5.0])
    stats = compare(a, b)
    assert stats["elements_differing"] == 3  # -0 vs +0 differs in bits
    assert stats["total_elements"] == 5
    assert stats["max_abs_diff"] == 0.5
    assert stats["nan_mismatches"] == 1
    assert stats["ulp_histogram"]["0"] == 3 and stats["ulp_histogram"][">16"] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_differ_counts_signed_zeros_and_nan_against_values_but_not_equal_nans(dtype):
    a = torch.tensor([[1.0, 0.0], [math.nan, math.nan]], dtype=dtype)
    b = torch.tensor([[1.0, -0.0], [math.nan, 2.0]], dtype=dtype)
    assert differ(a, b) == 2
    assert differ(a[:, 1], b[:, 1]) == 2  # strided views are read element by element


def test_same_bits_tells_signed_zeros_apart_and_compares_integers_by_value():
    assert same_bits(torch.tensor([math.nan, 1.0]), torch.tensor([math.nan, 1.0]))
    assert not same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not same_bits(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert not same_bits(torch.zeros(2), torch.zeros(1, 2))
    assert same_bits(torch.arange(3), torch.arange(3))
