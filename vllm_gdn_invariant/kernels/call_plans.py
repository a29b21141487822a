"""Repeated calls of the public functions: a call whose arguments have the signatures and
layouts of an earlier passing call reuses that call's checked dims and bound launch.

A call key holds, for each tensor argument, its type, dtype, shape, strides, device and data
pointer modulo 16, and every other argument's ``validation.signature``: all that the metadata
checks read (``validation.CheckedSignatures``: a call with the key of a passing call passes them
with the same dims, and with the same launch shape, which follows from the dims and the state's
dtype) and all that a bound launch's key reads of the arguments (``launch.tensor_layouts``; the
output, which the call allocates, is checked for the alignment it was bound with). A plan is kept
only for a call that passed every check and launched a compiled kernel directly; a call with its
key still checks its index tensor (``CallPlans.lookup``, through ``validation.CHECKED_INDICES``),
then allocates its output and launches: the bound launch when the output has the alignment it
was bound with, else a launch bound for the new alignment. Under Triton's interpreter no plan is
kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from .launch import BoundLaunch
from .validation import CHECKED_INDICES

PLANS = 1024  # call keys whose plan is kept


@dataclass(frozen=True)
class CallPlan:
    """What a passing call leaves for later calls with its key: the dims the checks returned,
    the launch bound for its tensors, and the alignment (data pointer modulo 16) of the output
    it was bound with."""

    dims: object
    bound: BoundLaunch
    out_alignment: int


def call_key(op: str, tensors: tuple, options: tuple) -> tuple | None:
    """The key of a call of ``op`` with ``tensors`` and the other arguments' signatures
    ``options``; None when an argument among ``tensors`` is not a tensor with storage."""
    try:
        layouts = [
            (type(t), t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15) for t in tensors
        ]
    except (AttributeError, TypeError, RuntimeError):
        return None
    return (op, *layouts, *options)


class CallPlans:
    """The plans of passing calls, the most recent ``capacity`` of them."""

    def __init__(self, capacity: int = PLANS) -> None:
        self.capacity = capacity
        self.plans: dict[tuple, CallPlan] = {}

    def get(self, key: tuple | None) -> CallPlan | None:
        """The plan kept under ``key``; None for none, or for a key that cannot be hashed."""
        if key is None:
            return None
        try:
            return self.plans.get(key)
        except TypeError:
            return None

    def lookup(
        self, key: tuple | None, state_indices: Tensor, *, num_blocks: int
    ) -> CallPlan | None:
        """The plan kept under ``key``, after checking the values of ``state_indices`` (the one
        argument a key does not cover) against ``num_blocks``: raises as the full checks do
        where they are bad. None, and nothing checked, where no plan is kept under ``key``."""
        plan = self.get(key)
        if plan is not None:
            CHECKED_INDICES.check(state_indices, num_blocks=num_blocks)
        return plan

    def keep(self, key: tuple | None, plan: CallPlan) -> None:
        """Keep ``plan`` under ``key`` (not when ``key`` is None or cannot be hashed), dropping
        the oldest plan beyond ``capacity``."""
        if key is None:
            return
        try:
            self.plans[key] = plan
        except TypeError:
            return
        while len(self.plans) > self.capacity:
            self.plans.pop(next(iter(self.plans)), None)

    def clear(self) -> None:
        """Forget every plan: the next call with any arguments is checked in full."""
        self.plans.clear()


CALL_PLANS = CallPlans()
