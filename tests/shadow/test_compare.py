"""The checker's field statistics are those of shadow/bits.py's compare."""

from __future__ import annotations

import pytest
import torch

from tests.shadow.pairs import pair
from vllm_gdn_invariant.shadow.bits import compare, ulp_distance
from vllm_gdn_invariant.shadow.compare import (
    at_most_by_bincount,
    at_most_by_bounds,
    summarize,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_statistics_equal_bits_compare(dtype):
    served, reference = pair(dtype, 64 * 33, seed=1)
    stats = summarize({"output": (served, reference)})["output"]
    want = compare(served, reference)
    assert stats.compared == want["total_elements"]
    assert stats.differing == want["elements_differing"]
    assert stats.max_abs_diff == want["max_abs_diff"]
    assert stats.nan_mismatches == want["nan_mismatches"] == 1
    assert stats.ulp_histogram == want["ulp_histogram"]
    assert (
        stats.max_ulp == int(ulp_distance(served, reference).max()) == torch.iinfo(torch.int64).max
    )


def test_equal_tensors_give_zeros_for_every_field():
    x = torch.randn(4, 8)
    stats = summarize({"a": (x, x.clone()), "b": (x.bfloat16(), x.bfloat16())})
    for s in stats.values():
        assert (s.differing, s.max_ulp, s.max_abs_diff, s.nan_mismatches) == (0, 0, 0.0, 0)
        assert s.ulp_histogram["0"] == s.compared


def test_fields_are_kept_apart():
    x = torch.zeros(10)
    y = x.clone()
    y[3] = torch.finfo(torch.float32).tiny  # far from 0 in ULPs, one element
    stats = summarize({"same": (x, x.clone()), "one": (y, x)})
    assert stats["same"].differing == 0
    assert stats["one"].differing == 1 and stats["one"].ulp_histogram[">16"] == 1


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="differ in dtype or shape"):
        summarize({"x": (torch.zeros(3), torch.zeros(4))})


def test_both_bound_count_ways_count_every_bucket_alike():
    served, reference = pair(torch.float32, 64 * 33, seed=2)
    distance = ulp_distance(served, reference).flatten()
    by_bincount = at_most_by_bincount(distance)
    assert torch.equal(at_most_by_bounds(distance), by_bincount)
    # every bucket is populated, so a shifted bound shows
    assert (torch.diff(by_bincount) > 0).all() and 0 < by_bincount[0]
    assert by_bincount[-1] < distance.numel()
