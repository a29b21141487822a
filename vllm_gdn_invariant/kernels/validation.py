"""Argument checks of the kernels' wrappers: the goldens' checks, then the kernels' own limits.

``check_recurrent_args`` and ``check_conv_args`` take the arguments of
``golden.check_recurrent_args`` / ``golden.check_conv_args`` (the checks of
``golden.recurrent_step`` and ``golden.conv_update``) and make the same checks with the same
exceptions and messages (tests/kernels/test_kernels_contract.py pins that the wrappers and the
goldens raise alike): ``golden.check_recurrent_dims`` / ``golden.check_conv_dims`` (every type,
dtype, rank, device and shape; no value read), whose verdict ``CHECKED_SIGNATURES`` keeps per
argument signature, then ``golden.check_state_index_values`` (active indices in range and not
repeated), whose verdict ``CHECKED_INDICES`` keeps per index tensor, so that a call with an index
tensor already checked, unchanged, reads nothing back from the device and a call whose arguments
look like those of an earlier passing call repeats none of the metadata checks. The kernels add
three limits of their own, each a ``ValueError`` naming the argument:

* tensors on CPU run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this
  package is imported); otherwise the data must be on a CUDA device;
* the state (``state``, ``conv_state``) is written in place, so its elements must not overlap in
  memory (an expanded view is refused);
* the recurrent kernel holds a [next_power_of_2(K)] vector per tile, so K is limited to
  Triton's largest tensor, 2^20 elements.

Nothing is written before all checks pass.
"""

import math
import weakref
from collections.abc import Callable
from numbers import Integral, Real

import torch
from torch import Tensor

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.golden import ConvDims, RecurrentDims

__all__ = [
    "CHECKED_INDICES",
    "CHECKED_SIGNATURES",
    "MAX_HEAD_K",
    "CheckedIndices",
    "CheckedSignatures",
    "ConvDims",
    "RecurrentDims",
    "check_conv_args",
    "check_recurrent_args",
    "signature",
    "require_no_overlap",
    "require_runnable_device",
]

MAX_HEAD_K = 1 << 20  # Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL)


def require_runnable_device(device: torch.device, interpreted: bool, name: str) -> None:
    """CUDA always; CPU only when the kernels were built for Triton's interpreter."""
    if runnable(device, interpreted):
        return
    if device.type == "cpu":
        raise ValueError(
            f"{name} is on the CPU; the kernels run on CPU tensors only in Triton's interpreter "
            "(set TRITON_INTERPRET=1 before vllm_gdn_invariant.kernels is imported)"
        )
    raise ValueError(f"{name} is on {device}; the kernels run on CUDA devices")


def require_no_overlap(value: Tensor, name: str) -> None:
    """Refuse a tensor whose elements share memory (it is updated in place)."""
    if value.is_contiguous():
        return
    extent = 1
    dims = zip(value.stride(), value.shape, strict=True)
    for stride, size in sorted((s, n) for s, n in dims if n > 1):
        if stride < extent:
            raise ValueError(
                f"{name} has overlapping elements (strides {value.stride()} for shape "
                f"{tuple(value.shape)}); it is updated in place, so each element needs its own "
                "memory"
            )
        extent = stride * size


INDEX_VERDICTS = 256  # index tensors whose verdict is kept


class CheckedIndices:
    """The index tensors whose values passed ``golden.check_state_index_values``.

    A verdict holds for one tensor object (held by a weak reference, so that a new tensor at a
    freed tensor's address is another tensor) while its data pointer, version counter (which
    every in-place change PyTorch makes to it or to a view of it bumps), shape, strides, dtype,
    device and the ``num_blocks`` it was checked against stay the same; anything else checks
    again. Writes that PyTorch does not count are not seen: a custom kernel or a CUDA graph
    replay writing the memory, a numpy or DLPack alias, another tensor ``set_`` onto the same
    storage; after such a write, call ``clear()``. Inference tensors count no versions, so they
    are checked at every call. Only passing verdicts are kept (a failing check raises), the
    most recent ``capacity`` of them.
    """

    def __init__(self, capacity: int = INDEX_VERDICTS) -> None:
        self.capacity = capacity
        self.verdicts: dict[int, tuple[weakref.ref, tuple]] = {}

    def check(self, state_indices: Tensor, *, num_blocks: int) -> None:
        """``golden.check_state_index_values(state_indices, num_blocks=num_blocks)`` unless a
        kept verdict covers it; reads nothing back from the device when one does."""
        if state_indices.is_inference():
            golden.check_state_index_values(state_indices, num_blocks=num_blocks)
            return
        key = self.fingerprint(state_indices, num_blocks)
        if self.covers(self.verdicts.get(id(state_indices)), state_indices, key):
            return
        golden.check_state_index_values(state_indices, num_blocks=num_blocks)
        self.keep(state_indices, key)

    @staticmethod
    def covers(kept: tuple[weakref.ref, tuple] | None, state_indices: Tensor, key: tuple) -> bool:
        """Whether a kept verdict is for this very tensor object and fingerprint."""
        return kept is not None and kept[0]() is state_indices and kept[1] == key

    @staticmethod
    def fingerprint(state_indices: Tensor, num_blocks: int) -> tuple:
        """What a verdict is valid for, besides the tensor object."""
        return (
            state_indices.data_ptr(),
            state_indices._version,
            state_indices.shape,
            state_indices.stride(),
            state_indices.dtype,
            state_indices.device,
            num_blocks,
        )

    def keep(self, state_indices: Tensor, key: tuple) -> None:
        """Keep a passing verdict, dropping the oldest one beyond ``capacity``."""
        slot = id(state_indices)
        verdicts = self.verdicts

        def forget(ref: weakref.ref) -> None:
            kept = verdicts.get(slot)
            if kept is not None and kept[0] is ref:
                verdicts.pop(slot, None)

        verdicts.pop(slot, None)
        verdicts[slot] = (weakref.ref(state_indices, forget), key)
        while len(verdicts) > self.capacity:
            verdicts.pop(next(iter(verdicts)), None)

    def clear(self) -> None:
        """Forget every verdict: the next call with any index tensor checks it again."""
        self.verdicts.clear()


CHECKED_INDICES = CheckedIndices()


SIGNATURE_VERDICTS = 1024  # argument signatures whose verdict is kept


def signature(value: object) -> tuple:
    """What the metadata checks read of one argument: a tensor's type, dtype, shape and device;
    another value's type and value, and a non-integral real's sign (-0.0 and 0.0 are one key
    otherwise, numpy's included)."""
    if isinstance(value, Tensor):
        return (type(value), value.dtype, value.shape, value.device)
    if isinstance(value, float):
        return (type(value), value, math.copysign(1.0, value))
    if value is None or isinstance(value, (int, str)):  # no signed zero
        return (type(value), value)
    if isinstance(value, Real) and not isinstance(value, Integral):
        return (type(value), value, math.copysign(1.0, value))
    return (type(value), value)


def signatures(tensors: tuple) -> list:
    """``signature`` of each of ``tensors`` (faster when all are tensors; an object of another
    type with a dtype, shape and device gets those, a key that never passes the checks)."""
    try:
        return [(type(value), value.dtype, value.shape, value.device) for value in tensors]
    except AttributeError:  # not all tensors
        return [signature(value) for value in tensors]


class CheckedSignatures:
    """The verdicts of argument signatures that passed the metadata checks.

    The checks of ``golden.check_recurrent_dims`` / ``golden.check_conv_dims``, the recurrent
    kernel's K limit and ``require_runnable_device`` read each argument's ``signature`` and
    nothing else, so arguments with the signatures of passing ones pass them with the same dims.
    A key is the op's name, whether the kernels are interpreted and every argument's signature;
    its verdict is the dims and whether the data's device can run the kernels. A key that cannot
    be hashed (an argument of an unhashable type) is never kept, and its call checks every time.
    Only passing verdicts are kept (a failing check raises), the most recent ``capacity`` of
    them.
    """

    def __init__(self, capacity: int = SIGNATURE_VERDICTS) -> None:
        self.capacity = capacity
        self.verdicts: dict[tuple, tuple[object, bool]] = {}

    def verdict(self, key: tuple, check: Callable[[], tuple[object, bool]]) -> tuple[object, bool]:
        """The kept verdict of ``key``, or ``check()``'s (dims, runnable), kept when ``key`` can
        be."""
        try:
            kept = self.verdicts.get(key)
        except TypeError:  # unhashable: check every time
            return check()
        if kept is not None:
            return kept
        verdict = check()
        if len(self.verdicts) >= self.capacity:  # another thread may drop or clear them too
            self.verdicts.pop(next(iter(self.verdicts), None), None)
        self.verdicts[key] = verdict
        return verdict

    def clear(self) -> None:
        """Forget every verdict: the next call with any arguments checks them again."""
        self.verdicts.clear()


CHECKED_SIGNATURES = CheckedSignatures()


def runnable(device: torch.device, interpreted: bool) -> bool:
    """Whether ``require_runnable_device`` passes ``device``."""
    return device.type == "cuda" or (device.type == "cpu" and interpreted)


def check_recurrent_args(
    mixed_qkv: object,
    a: object,
    b: object,
    A_log: object,
    dt_bias: object,
    state: object,
    state_indices: object,
    *,
    num_k_heads: object,
    scale: object,
    use_qk_l2norm: object,
    interpreted: bool,
) -> RecurrentDims:
    """``golden.check_recurrent_args``'s checks (the metadata checks' verdict kept per argument
    signature, the index values' per index tensor), then the recurrent kernel's limits (module
    docstring); returns the dims."""
    tensors = (mixed_qkv, a, b, A_log, dt_bias, state, state_indices)

    def check() -> tuple[RecurrentDims, bool]:
        dims = golden.check_recurrent_dims(
            *tensors, num_k_heads=num_k_heads, scale=scale, use_qk_l2norm=use_qk_l2norm
        )
        if dims.head_k > MAX_HEAD_K:
            raise ValueError(
                f"state has K={dims.head_k}; the recurrent kernel supports K <= {MAX_HEAD_K} "
                "(a K vector is one Triton tensor)"
            )
        return dims, runnable(mixed_qkv.device, interpreted)

    options = (
        (type(num_k_heads), num_k_heads),
        signature(scale),
        (type(use_qk_l2norm), use_qk_l2norm),
    )
    key = ("recurrent", interpreted, *signatures(tensors), *options)
    dims, on_runnable_device = CHECKED_SIGNATURES.verdict(key, check)
    CHECKED_INDICES.check(state_indices, num_blocks=state.shape[0])
    if not on_runnable_device:
        require_runnable_device(mixed_qkv.device, interpreted, "mixed_qkv")
    require_no_overlap(state, "state")
    return dims


def check_conv_args(
    x: object,
    conv_state: object,
    weight: object,
    state_indices: object,
    *,
    bias: object = None,
    activation: object = "silu",
    dim_first: object = True,
    interpreted: bool,
) -> ConvDims:
    """``golden.check_conv_args``'s checks (the metadata checks' verdict kept per argument
    signature, the index values' per index tensor), then the conv kernel's limits (module
    docstring); returns the dims."""
    tensors = (x, conv_state, weight, state_indices)

    def check() -> tuple[ConvDims, bool]:
        dims = golden.check_conv_dims(
            *tensors, bias=bias, activation=activation, dim_first=dim_first
        )
        return dims, runnable(x.device, interpreted)

    options = (signature(bias), (type(activation), activation), (type(dim_first), dim_first))
    key = ("conv", interpreted, *signatures(tensors), *options)
    dims, on_runnable_device = CHECKED_SIGNATURES.verdict(key, check)
    CHECKED_INDICES.check(state_indices, num_blocks=conv_state.shape[0])
    if not on_runnable_device:
        require_runnable_device(x.device, interpreted, "x")
    require_no_overlap(conv_state, "conv_state")
    return dims
