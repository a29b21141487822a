"""The fixed-order sum (reduction.py): its written order, padding and independence of the batch."""

import pytest
import torch

from vllm_gdn_invariant.golden import fixed_order_sum
from vllm_gdn_invariant.shadow.bits import same_bits


def fp32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_four_values_sum_as_first_half_plus_second_half():
    # (x0 + x2) + (x1 + x3) = (1 - 1) + (2^-24 + 2^-24) = 2^-23; other orders round differently.
    x = fp32([1.0, 2.0**-24, -1.0, 2.0**-24])
    assert fixed_order_sum(x).item() == 2.0**-23
    left_to_right = ((x[0] + x[1]) + x[2]) + x[3]
    adjacent_pairs = (x[0] + x[1]) + (x[2] + x[3])
    assert left_to_right.item() == 2.0**-24
    assert adjacent_pairs.item() == 2.0**-24


def test_odd_width_is_zero_padded_to_the_next_power_of_two():
    # Width 5 pads to 8: ((x0 + x4) + (x2 + 0)) + ((x1 + 0) + (x3 + 0)).
    x = fp32([1.0, 2.0**-24, 2.0**-24, 2.0**-24, -1.0])
    assert fixed_order_sum(x).item() == 2.0**-24 * 3
    padded_to_six = ((x[0] + x[3]) + (x[1] + x[4])) + x[2]  # another plausible order
    assert padded_to_six.item() != fixed_order_sum(x).item()


@pytest.mark.parametrize("width", [1, 2, 3, 7, 32, 40, 128, 129])
def test_matches_the_written_order_step_by_step(width):
    x = torch.randn(3, width, generator=torch.Generator().manual_seed(width))
    size = 1
    while size < width:
        size *= 2
    levels = [list(row) for row in torch.cat([x, torch.zeros(3, size - width)], 1)]
    while size > 1:
        size //= 2
        levels = [[row[i] + row[i + size] for i in range(size)] for row in levels]
    expected = torch.stack([row[0] for row in levels])
    assert same_bits(fixed_order_sum(x), expected)


def test_row_sums_do_not_depend_on_the_other_rows_or_the_layout():
    x = torch.randn(257, 40, generator=torch.Generator().manual_seed(1))
    full = fixed_order_sum(x)
    for i in (0, 1, 100, 256):
        assert same_bits(fixed_order_sum(x[i : i + 1]), full[i : i + 1])
    assert same_bits(fixed_order_sum(x.t().contiguous().t()), full)
    assert same_bits(fixed_order_sum(x.reshape(257, 1, 40))[:, 0], full)


def test_empty_width_sums_to_zero():
    assert same_bits(fixed_order_sum(torch.zeros(4, 0)), torch.zeros(4))
