"""Which decode rows are checked: each with probability ``rate``, drawn in groups per step.

The rows a draw checks are read from the snapshot the checker takes for it
(``take_snapshot``, the torch path), not recomputed here.
"""

from __future__ import annotations

import pytest
import torch

from vllm_gdn_invariant.shadow.sampling import Draw, RowSampler
from vllm_gdn_invariant.shadow.snapshot import take_snapshot


def checked_rows(draw: Draw, num_rows: int) -> list[int]:
    """The decode-row positions whose inputs and state the snapshot of ``draw`` copies, in a
    step of ``num_rows`` decode rows (decode row ``i`` owns state block ``i + 1``)."""
    blocks = torch.arange(1, num_rows + 1)
    cache = torch.arange(num_rows + 1, dtype=torch.float32).view(-1, 1)
    inputs = torch.zeros(num_rows, 1)
    snapshot = take_snapshot(draw.start, draw.count, blocks, cache, cache, inputs, inputs, inputs)
    rows = snapshot.rows.tolist()
    assert snapshot.ssm_blocks.flatten().tolist() == [r + 1 for r in rows]  # their own blocks
    return rows


# Measured fraction of rows checked over 20,000 steps (seed 0): 0.016075 at rate 1/64 with
# 256 rows and limit 64 (relative error 0.029), 0.2507 at 1/4 with 12 rows and limit 4
# (0.003), 0.49895 at 1/2 with 3 rows (0.002). Regression bound on the relative error: 0.05.
FRACTION_BOUND = 0.05


@pytest.mark.parametrize("rate, rows, limit", [(1 / 64, 256, 64), (0.25, 12, 4), (0.5, 3, 8)])
def test_each_row_is_checked_with_probability_rate(rate, rows, limit):
    sampler = RowSampler(rate, seed=0)
    per_row = [0] * rows
    steps = 20_000
    for _ in range(steps):
        draw = sampler.draw(object(), rows, limit)
        if draw is not None:
            for row in checked_rows(draw, rows):
                per_row[row] += 1
    fraction = sum(per_row) / (steps * rows)
    assert abs(fraction - rate) / rate < FRACTION_BOUND
    # no row is favoured: the window starts uniformly and wraps around
    assert min(per_row) > 0.8 * max(per_row)


def test_rows_come_in_groups_so_few_steps_pay_for_a_check():
    sampler = RowSampler(1 / 64, seed=0)
    sampled = sum(sampler.draw(object(), 256, 64) is not None for _ in range(10_000))
    # min(1, rate * 256 / 64) = 1/16 of the steps (measured: 642 of 10,000), not nearly every
    # step as with one draw per row (1 - (63/64)**256 = 98 %)
    assert 500 < sampled < 750


def test_every_layer_of_a_step_gets_the_same_rows():
    sampler = RowSampler(0.3, seed=3)
    for _ in range(50):
        step = object()
        first = sampler.draw(step, 10, 4)
        for _layer in range(5):
            assert sampler.draw(step, 10, 4) is first
    assert sampler.steps == 50


def test_rate_one_checks_up_to_the_limit_in_every_step():
    sampler = RowSampler(1.0, seed=0)
    for rows, limit in [(3, 8), (8, 8), (20, 8)]:
        draw = sampler.draw(object(), rows, limit)
        picked = checked_rows(draw, rows)
        assert len(picked) == min(rows, limit) == len(set(picked))
        assert all(0 <= r < rows for r in picked)


def test_the_same_seed_draws_the_same_rows_in_every_process():
    def draws(seed):
        sampler = RowSampler(0.2, seed)
        out = []
        for _ in range(200):
            draw = sampler.draw(object(), 16, 4)
            out.append(None if draw is None else checked_rows(draw, 16))
        return out

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)


def test_rate_outside_the_unit_interval_is_refused():
    with pytest.raises(ValueError, match="rate"):
        RowSampler(0.0, 0)
