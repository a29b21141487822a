"""Which decode rows of a step are checked.

Every decode row is checked with probability ``rate``, but rows are drawn in groups: a step is
sampled with probability ``min(1, rate * B / m)`` and then ``m`` of its ``B`` decode rows, a
window of consecutive positions starting at a uniform position and wrapping around, so each
row's chance is ``rate`` (as long as ``rate * B <= m``; above that every step is sampled and
the cap ``m`` holds the fraction at ``m / B``). ``m`` is the caller's row limit (the
``max_rows`` cap and what fits in the snapshot memory cap). Drawing in groups pays the fixed
cost of a check (reference launches, one host sync) in few steps rather than in every step.

The same rows are checked in every GDN layer of a step: the draw is made once per step, keyed
on vLLM's forward context of the step. With the same seed every process (every tensor
parallel rank) draws the same rows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Draw:
    """One step's draw: the window of ``count`` decode-row positions from ``start``, wrapping
    around (the snapshot copies those rows: snapshot.py)."""

    start: int
    count: int


class RowSampler:
    """Draws, once per step, whether and where a step's decode rows are checked."""

    def __init__(self, rate: float, seed: int) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        self.rate = rate
        self._rng = random.Random(seed)
        self._step_key: object | None = None
        self._draw: Draw | None = None
        self.steps = 0
        self.sampled_steps = 0

    def draw(self, step_key: object, num_rows: int, limit: int) -> Draw | None:
        """The draw of the step ``step_key`` (the first layer of a step draws; the others
        get the same answer). ``limit`` is the row limit of the first layer that asks."""
        if step_key is self._step_key:
            return self._draw
        self._step_key = step_key
        self._draw = None
        self.steps += 1
        m = min(limit, num_rows)
        if m <= 0:
            return None
        probability = min(1.0, self.rate * num_rows / m)
        if probability < 1.0 and self._rng.random() >= probability:
            return None
        self._draw = Draw(self._rng.randrange(num_rows), m)
        self.sampled_steps += 1
        return self._draw
