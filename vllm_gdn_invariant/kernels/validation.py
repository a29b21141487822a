"""Argument checks of the kernels' wrappers: the goldens' checks, then the kernels' own limits.

``check_recurrent_args`` and ``check_conv_args`` make the checks of
``golden.recurrent.recurrent_step`` and ``golden.conv.conv_update`` in the same order, with the
same exception types and messages, through the golden contract's helpers (``golden/contract.py``;
tests/kernels/test_kernels_contract.py pins that the wrappers and the goldens raise alike). The
kernels add three limits of their own, each a ``ValueError`` naming the argument:

* tensors on CPU run only under Triton's interpreter (``TRITON_INTERPRET=1`` set before this
  package is imported); otherwise the data must be on a CUDA device;
* the state (``state``, ``conv_state``) is written in place, so its elements must not overlap in
  memory (an expanded view is refused);
* the recurrent kernel holds a [next_power_of_2(K)] vector per tile, so K is limited to
  Triton's largest tensor, 2^20 elements.

Nothing is written before all checks pass.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from vllm_gdn_invariant.golden.contract import (
    CONV_STATE_DTYPES,
    FLOAT_DTYPES,
    STATE_DTYPES,
    require_bool,
    require_positive_int,
    require_real,
    require_shape,
    require_tensor,
    validate_state_indices,
)
from vllm_gdn_invariant.golden.conv import ACTIVATIONS

MAX_HEAD_K = 1 << 20  # Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL)


@dataclass(frozen=True)
class RecurrentDims:
    """Sizes of a checked recurrent step, and its scale rounded to fp32."""

    batch: int
    num_k_heads: int
    num_v_heads: int
    head_k: int
    head_v: int
    scale: float
    use_qk_l2norm: bool


@dataclass(frozen=True)
class ConvDims:
    """Sizes of a checked conv update."""

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
    """golden.recurrent.recurrent_step's checks, then the kernel's limits (module docstring)."""
    require_tensor(mixed_qkv, "mixed_qkv", ndim=2, dtypes=FLOAT_DTYPES)
    device = mixed_qkv.device
    batch, width = mixed_qkv.shape
    require_tensor(a, "a", ndim=2, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv")
    num_v_heads = a.shape[1]
    require_shape(a, "a", (batch, num_v_heads), "[B, HV]")
    require_tensor(b, "b", ndim=2, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv")
    require_shape(b, "b", (batch, num_v_heads), "[B, HV] (HV from a)")
    require_tensor(
        A_log, "A_log", ndim=1, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv"
    )
    require_shape(A_log, "A_log", (num_v_heads,), "[HV]")
    require_tensor(
        dt_bias, "dt_bias", ndim=1, dtypes=FLOAT_DTYPES, device=device, device_of="mixed_qkv"
    )
    require_shape(dt_bias, "dt_bias", (num_v_heads,), "[HV]")
    require_tensor(
        state, "state", ndim=4, dtypes=STATE_DTYPES, device=device, device_of="mixed_qkv"
    )
    num_blocks, state_heads, head_v, head_k = state.shape
    if state_heads != num_v_heads:
        raise ValueError(
            f"state must have shape [num_blocks, HV, V, K] with HV={num_v_heads} (from a), "
            f"got {tuple(state.shape)}"
        )
    num_k_heads = require_positive_int(num_k_heads, "num_k_heads")
    if num_v_heads % num_k_heads != 0:
        raise ValueError(f"num_k_heads={num_k_heads} must divide HV={num_v_heads} (HV % H != 0)")
    qk_width = width - num_v_heads * head_v
    if qk_width <= 0 or qk_width % (2 * num_k_heads) != 0:
        raise ValueError(
            f"mixed_qkv width {width} is not 2*H*K + HV*V for H=num_k_heads={num_k_heads}, "
            f"HV={num_v_heads}, V={head_v}"
        )
    if qk_width // (2 * num_k_heads) != head_k:
        raise ValueError(
            f"mixed_qkv width {width} gives K={qk_width // (2 * num_k_heads)} for "
            f"num_k_heads={num_k_heads}, HV={num_v_heads}, V={head_v}, but state.shape[3]={head_k}"
        )
    scale = require_real(scale, "scale")
    use_qk_l2norm = require_bool(use_qk_l2norm, "use_qk_l2norm")
    validate_state_indices(
        state_indices, batch=batch, num_blocks=num_blocks, device=device, device_of="mixed_qkv"
    )

    require_runnable_device(device, interpreted, "mixed_qkv")
    require_no_overlap(state, "state")
    if head_k > MAX_HEAD_K:
        raise ValueError(
            f"state has K={head_k}; the recurrent kernel supports K <= {MAX_HEAD_K} (a K vector "
            "is one Triton tensor)"
        )
    return RecurrentDims(
        batch=batch,
        num_k_heads=num_k_heads,
        num_v_heads=num_v_heads,
        head_k=head_k,
        head_v=head_v,
        scale=torch.tensor(scale, dtype=torch.float32).item(),  # round once to fp32
        use_qk_l2norm=use_qk_l2norm,
    )


def check_conv_args(
    x: object,
    conv_state: object,
    weight: object,
    state_indices: object,
    *,
    bias: object,
    activation: object,
    dim_first: object,
    interpreted: bool,
) -> ConvDims:
    """golden.conv.conv_update's checks, then the kernel's limits (module docstring)."""
    require_tensor(x, "x", ndim=2, dtypes=FLOAT_DTYPES)
    device = x.device
    batch, dim = x.shape
    require_tensor(weight, "weight", ndim=2, dtypes=FLOAT_DTYPES, device=device, device_of="x")
    taps = weight.shape[1]
    if weight.shape[0] != dim or taps < 2:
        raise ValueError(
            f"weight must have shape [dim, W] with dim={dim} (from x) and W >= 2, "
            f"got {tuple(weight.shape)}"
        )
    require_tensor(
        conv_state, "conv_state", ndim=3, dtypes=CONV_STATE_DTYPES, device=device, device_of="x"
    )
    dim_first = require_bool(dim_first, "dim_first")
    num_blocks = conv_state.shape[0]
    if dim_first:
        expected, meaning = (num_blocks, dim, taps - 1), "[num_blocks, dim, W-1]"
    else:
        expected, meaning = (num_blocks, taps - 1, dim), "[num_blocks, W-1, dim]"
    require_shape(conv_state, "conv_state", expected, f"{meaning} (W = weight.shape[1])")
    if bias is not None:
        require_tensor(bias, "bias", ndim=1, dtypes=FLOAT_DTYPES, device=device, device_of="x")
        require_shape(bias, "bias", (dim,), "[dim]")
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"activation must be None or a str, got {type(activation).__name__}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    validate_state_indices(
        state_indices, batch=batch, num_blocks=num_blocks, device=device, device_of="x"
    )

    require_runnable_device(device, interpreted, "x")
    require_no_overlap(conv_state, "conv_state")
    return ConvDims(
        batch=batch, dim=dim, taps=taps, dim_first=dim_first, silu=activation is not None
    )
