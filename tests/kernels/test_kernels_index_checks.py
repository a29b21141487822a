"""The kernels check index values once per unchanged index tensor (validation.CheckedIndices).

A second call with the same index tensor reads nothing of it (no operation is dispatched on any
argument tensor during its validation); any change the verdict cannot vouch for checks again and
raises the golden's error before anything is written: the tensor changed in place (directly or
through a view), a new tensor at a freed tensor's address with the same metadata, a state with
fewer blocks. Negative controls: caches keyed without the version counter, the tensor's identity
or ``num_blocks`` accept each of these changes, so the scenarios tell them apart.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import vllm_gdn_invariant.golden as golden_package
from vllm_gdn_invariant.shadow.bits import same_bits

from ..golden.helpers import build_conv_case, build_recurrent_case

OPS = ["recurrent", "conv"]


class Op:
    """One op's case and its checks: the kernels' validation, the golden's, the public call."""

    def __init__(self, kernels, name: str, batch: int = 3, seed: int = 1):
        self.kernels, self.name = kernels, name
        if name == "recurrent":
            self.case = build_recurrent_case(batch, H=1, HV=2, K=8, V=4, seed=seed)
            self.state_position, self.golden = 5, golden_package.check_recurrent_args
            self.validate = kernels.validation.check_recurrent_args
            self.public = kernels.recurrent_step
        else:
            self.case = build_conv_case(batch, dim=16, seed=seed)
            self.state_position, self.golden = 1, golden_package.check_conv_args
            self.validate = kernels.validation.check_conv_args
            self.public = kernels.conv_update

    @property
    def state(self) -> torch.Tensor:
        return self.case.args()[self.state_position]

    def args(self, indices: torch.Tensor, state: torch.Tensor | None = None) -> list:
        args = list(self.case.args())
        args[-1] = indices  # state_indices is the last positional argument of both ops
        if state is not None:
            args[self.state_position] = state
        return args

    def check(self, indices: torch.Tensor, state: torch.Tensor | None = None) -> None:
        self.validate(*self.args(indices, state), **self.case.kwargs, interpreted=True)

    def golden_error(self, indices, state=None) -> tuple[type, str]:
        with pytest.raises((TypeError, ValueError)) as info:
            self.golden(*self.args(indices, state), **self.case.kwargs)
        return info.type, str(info.value)

    def call(self, indices, state=None):
        return self.public(*self.args(indices, state), **self.case.kwargs)


@pytest.fixture
def fresh_verdicts(kernels, monkeypatch):
    """An empty verdict cache for the test."""
    monkeypatch.setattr(kernels.validation, "CHECKED_INDICES", kernels.validation.CheckedIndices())
    return kernels.validation.CHECKED_INDICES


@pytest.fixture
def value_checks(monkeypatch) -> list:
    """Counts the calls of golden.check_state_index_values (the one check that reads values)."""
    calls = []
    check = golden_package.check_state_index_values

    def counted(state_indices, **kwargs):
        calls.append(state_indices)
        return check(state_indices, **kwargs)

    monkeypatch.setattr(golden_package, "check_state_index_values", counted)
    return calls


class ArgumentReads(TorchDispatchMode):
    """Records every dispatched operation that takes one of ``watched``'s storages."""

    def __init__(self, watched: list[torch.Tensor]):
        super().__init__()
        self.storages = {t.untyped_storage().data_ptr() for t in watched}
        self.operations: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for leaf in pytree.tree_leaves((args, kwargs)):
            if (
                isinstance(leaf, torch.Tensor)
                and leaf.untyped_storage().data_ptr() in self.storages
            ):
                self.operations.append(str(func))
        return func(*args, **kwargs)


def raised(function, *args) -> tuple[type, str] | None:
    try:
        function(*args)
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    return None


@pytest.mark.parametrize("op", OPS)
def test_a_second_call_with_the_same_indices_checks_no_values(
    kernels, fresh_verdicts, value_checks, op
):
    op = Op(kernels, op)
    indices = op.case.state_indices
    op.call(indices)
    before = op.state.clone()
    op.call(indices)
    assert len(value_checks) == 1
    assert not same_bits(op.state, before)  # the second call ran


def test_one_value_check_serves_every_layer_of_a_step(kernels, fresh_verdicts, value_checks):
    """A trainer's step: conv and recurrent for several layers with one index tensor and states
    of as many blocks; the values are checked once."""
    recurrent, conv = Op(kernels, "recurrent"), Op(kernels, "conv")
    assert recurrent.state.shape[0] == conv.state.shape[0]
    indices = recurrent.case.state_indices
    for _ in range(3):
        conv.call(indices)
        recurrent.call(indices)
    assert len(value_checks) == 1


@pytest.mark.parametrize("op", OPS)
def test_a_kept_verdict_dispatches_no_operation_on_any_argument(kernels, fresh_verdicts, op):
    op = Op(kernels, op)
    indices = op.case.state_indices
    watched = [t for t in op.args(indices) if isinstance(t, torch.Tensor)]
    first, second = ArgumentReads(watched), ArgumentReads(watched)
    with first:
        op.check(indices)
    with second:
        op.check(indices)
    assert first.operations  # the detector sees the first call's reads of the indices
    assert second.operations == []


def mutate_in_place(indices: torch.Tensor) -> torch.Tensor:
    indices.fill_(int(indices[0]))  # every row on one block: repeated active indices
    return indices


def mutate_through_a_view(indices: torch.Tensor) -> torch.Tensor:
    indices[-1:].copy_(indices[:1])  # the last row repeats the first's block
    return indices


CHANGES = {"in place": mutate_in_place, "through a view": mutate_through_a_view}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("op", OPS)
def test_indices_changed_after_a_passing_call_raise_the_goldens_error_before_writing(
    kernels, fresh_verdicts, op, change
):
    op = Op(kernels, op)
    indices = op.case.state_indices.clone()
    op.call(indices)
    CHANGES[change](indices)
    before = op.state.clone()
    assert raised(op.call, indices) == op.golden_error(indices)
    assert same_bits(op.state, before)


def same_address_pair(values: list[int], bad: list[int]):
    """A first index tensor over a buffer, then (after the first is freed and the buffer
    rewritten with ``bad`` outside PyTorch) a second one at the same address with the same
    version, shape, strides, dtype and device."""
    buffer = bytearray(torch.tensor(values, dtype=torch.int32).numpy().tobytes())

    def first() -> torch.Tensor:
        return torch.frombuffer(buffer, dtype=torch.int32)

    def second() -> torch.Tensor:
        buffer[:] = torch.tensor(bad, dtype=torch.int32).numpy().tobytes()
        return torch.frombuffer(buffer, dtype=torch.int32)

    return first, second


@pytest.mark.parametrize("op", OPS)
def test_a_new_tensor_at_a_freed_tensors_address_is_checked_again(kernels, fresh_verdicts, op):
    op = Op(kernels, op)
    values = op.case.state_indices.tolist()
    first, second = same_address_pair(values, [values[0]] * len(values))
    indices = first()
    address, fingerprint = indices.data_ptr(), fresh_verdicts.fingerprint(indices, 0)
    op.call(indices)
    del indices
    replacement = second()
    assert replacement.data_ptr() == address
    assert fresh_verdicts.fingerprint(replacement, 0) == fingerprint  # only identity differs
    before = op.state.clone()
    assert raised(op.call, replacement) == op.golden_error(replacement)
    assert same_bits(op.state, before)


@pytest.mark.parametrize("op", OPS)
def test_the_same_indices_against_fewer_blocks_are_checked_again(kernels, fresh_verdicts, op):
    op = Op(kernels, op)
    indices = op.case.state_indices
    op.call(indices)
    fewer = op.state[: int(indices.max())]  # the largest index is out of range now
    before = op.state.clone()
    assert raised(op.call, indices, fewer) == op.golden_error(indices, fewer)
    assert same_bits(op.state, before)


@pytest.mark.parametrize("op", OPS)
def test_failing_indices_raise_at_every_call(kernels, fresh_verdicts, value_checks, op):
    op = Op(kernels, op)
    bad = torch.full_like(op.case.state_indices, 2)
    expected = op.golden_error(bad)
    assert raised(op.call, bad) == expected
    assert raised(op.call, bad) == expected
    assert len(value_checks) == 2


def test_inference_tensors_are_checked_at_every_call(kernels, fresh_verdicts, value_checks):
    op = Op(kernels, "recurrent")
    with torch.inference_mode():
        indices = op.case.state_indices.clone()
    op.check(indices)
    op.check(indices)
    assert len(value_checks) == 2
    with torch.inference_mode():
        mutate_in_place(indices)
    assert raised(op.check, indices) == op.golden_error(indices)


def test_verdicts_beyond_the_capacity_are_forgotten_oldest_first(
    kernels, monkeypatch, value_checks
):
    verdicts = kernels.validation.CheckedIndices(capacity=2)
    monkeypatch.setattr(kernels.validation, "CHECKED_INDICES", verdicts)
    op = Op(kernels, "recurrent")
    tensors = [op.case.state_indices.clone() for _ in range(3)]
    for indices in tensors:
        op.check(indices)
    assert len(verdicts.verdicts) == 2
    op.check(tensors[2])
    op.check(tensors[1])
    assert len(value_checks) == 3
    op.check(tensors[0])
    assert len(value_checks) == 4


def test_a_freed_tensors_verdict_is_dropped(kernels, fresh_verdicts):
    op = Op(kernels, "recurrent")
    indices = op.case.state_indices.clone()
    op.check(indices)
    assert len(fresh_verdicts.verdicts) == 1
    del indices
    assert fresh_verdicts.verdicts == {}


def test_clear_forgets_every_verdict(kernels, fresh_verdicts, value_checks):
    op = Op(kernels, "recurrent")
    indices = op.case.state_indices
    op.check(indices)
    fresh_verdicts.clear()
    op.check(indices)
    assert len(value_checks) == 2


# Negative controls: caches that leave out one part of the key accept the change it covers.


def without_version(kernels):
    class WithoutVersion(kernels.validation.CheckedIndices):
        @staticmethod
        def fingerprint(state_indices, num_blocks):
            full = kernels.validation.CheckedIndices.fingerprint(state_indices, num_blocks)
            return full[:1] + full[2:]

    return WithoutVersion()


def without_num_blocks(kernels):
    class WithoutNumBlocks(kernels.validation.CheckedIndices):
        @staticmethod
        def fingerprint(state_indices, num_blocks):
            return kernels.validation.CheckedIndices.fingerprint(state_indices, 0)

    return WithoutNumBlocks()


def without_identity(kernels):
    class ByFingerprint(kernels.validation.CheckedIndices):
        """Keeps fingerprints alone: a tensor at a freed tensor's address is taken for it."""

        def __init__(self):
            super().__init__()
            self.passed = set()

        def check(self, state_indices, *, num_blocks):
            key = self.fingerprint(state_indices, num_blocks)
            if key not in self.passed:
                golden_package.check_state_index_values(state_indices, num_blocks=num_blocks)
                self.passed.add(key)

    return ByFingerprint()


def changed_in_place(op):
    indices = op.case.state_indices.clone()
    op.check(indices)
    return lambda: op.check(mutate_in_place(indices))


def fewer_blocks(op):
    indices = op.case.state_indices
    op.check(indices)
    return lambda: op.check(indices, op.state[: int(indices.max())])


def freed_and_replaced(op):
    values = op.case.state_indices.tolist()
    first, second = same_address_pair(values, [values[0]] * len(values))
    indices = first()
    op.check(indices)
    del indices
    return lambda: op.check(second())


@pytest.mark.parametrize(
    "broken, scenario",
    [
        (without_version, changed_in_place),
        (without_num_blocks, fewer_blocks),
        (without_identity, freed_and_replaced),
    ],
    ids=["version", "num_blocks", "identity"],
)
def test_a_cache_without_one_part_of_the_key_accepts_the_change_it_covers(
    kernels, monkeypatch, broken, scenario
):
    for verdicts in (kernels.validation.CheckedIndices(), broken(kernels)):
        monkeypatch.setattr(kernels.validation, "CHECKED_INDICES", verdicts)
        bad_call = scenario(Op(kernels, "recurrent"))
        outcome = raised(bad_call)
        if type(verdicts) is kernels.validation.CheckedIndices:
            assert outcome is not None  # the full key catches it
        else:
            assert outcome is None  # the broken key lets the bad indices through
