"""Argument checks of the kernels' wrappers: the goldens' checks, then the kernels' own limits.

``check_recurrent_args`` and ``check_conv_args`` take the arguments of
``golden.check_recurrent_args`` / ``golden.check_conv_args`` (the checks of
``golden.recurrent_step`` and ``golden.conv_update``) and call them first, so a bad argument
raises the golden's exception with the golden's message (tests/kernels/test_kernels_contract.py
pins that the wrappers and the goldens raise alike). The kernels add three limits of their own,
each a ``ValueError`` naming the argument:

* tensors on CPU run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this
  package is imported); otherwise the data must be on a CUDA device;
* the state (``state``, ``conv_state``) is written in place, so its elements must not overlap in
  memory (an expanded view is refused);
* the recurrent kernel holds a [next_power_of_2(K)] vector per tile, so K is limited to
  Triton's largest tensor, 2^20 elements.

Nothing is written before all checks pass.
"""

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from vllm_gdn_invariant import golden
from vllm_gdn_invariant.golden import RecurrentArgs, RecurrentDims

__all__ = [
    "MAX_HEAD_K",
    "ConvDims",
    "RecurrentDims",
    "check_conv_args",
    "check_recurrent_args",
    "require_no_overlap",
    "require_runnable_device",
]

MAX_HEAD_K = 1 << 20  # Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL)


@dataclass(frozen=True)
class ConvDims:
    """Sizes of a checked conv update, and whether SiLU follows the taps."""

    batch: int
    dim: int
    taps: int
    dim_first: bool
    silu: bool


def require_runnable_device(device: torch.device, interpreted: bool, name: str) -> None:
    """CUDA always; CPU only when the kernels were built for Triton's interpreter."""
    if device.type == "cuda" or (device.type == "cpu" and interpreted):
        return
    if device.type == "cpu":
        raise ValueError(
            f"{name} is on the CPU; the kernels run on CPU tensors only in Triton's interpreter "
            "(set TRITON_INTERPRET=1 before vllm_gdn_invariant.kernels is imported)"
        )
    raise ValueError(f"{name} is on {device}; the kernels run on CUDA devices")


def require_no_overlap(value: Tensor, name: str) -> None:
    """Refuse a tensor whose elements share memory (it is updated in place)."""
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


RECURRENT_PARAMETERS = inspect.signature(golden.check_recurrent_args)
CONV_PARAMETERS = inspect.signature(golden.check_conv_args)


def bound_arguments(parameters: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, object]:
    """The arguments of a call with ``parameters`` by parameter name, defaults included."""
    bound = parameters.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def check_recurrent_args(*args: object, interpreted: bool, **kwargs: object) -> RecurrentArgs:
    """``golden.check_recurrent_args(*args, **kwargs)``, then the recurrent kernel's limits
    (module docstring); returns the golden's checked arguments."""
    checked = golden.check_recurrent_args(*args, **kwargs)
    named = bound_arguments(RECURRENT_PARAMETERS, args, kwargs)
    require_runnable_device(named["mixed_qkv"].device, interpreted, "mixed_qkv")
    require_no_overlap(named["state"], "state")
    if checked.head_k > MAX_HEAD_K:
        raise ValueError(
            f"state has K={checked.head_k}; the recurrent kernel supports K <= {MAX_HEAD_K} "
            "(a K vector is one Triton tensor)"
        )
    return checked


def check_conv_args(*args: object, interpreted: bool, **kwargs: object) -> ConvDims:
    """``golden.check_conv_args(*args, **kwargs)``, then the conv kernel's limits (module
    docstring)."""
    checked = golden.check_conv_args(*args, **kwargs)
    named = bound_arguments(CONV_PARAMETERS, args, kwargs)
    require_runnable_device(named["x"].device, interpreted, "x")
    require_no_overlap(named["conv_state"], "conv_state")
    return ConvDims(
        batch=checked.batch,
        dim=checked.dim,
        taps=checked.taps,
        dim_first=checked.dim_first,
        silu=named["activation"] is not None,
    )
