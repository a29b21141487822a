"""The GDN decode step as mode ``golden`` serves it inside vLLM: the conv update, then the
recurrent step, both golden-matched kernels, launched from shapes alone.

``recurrent_step`` and ``conv_update`` (the public functions) check every argument, state
indices included, which reads index values back to the host; a decode step inside vLLM may
be captured in a CUDA graph, where that is not allowed. :func:`decode_step` takes vLLM's own
tensors (its caches, its state indices, padded rows with index <= 0 as inactive, as in the
goldens' contract), derives the sizes from shapes, and launches the two kernels with the
launch shapes of the public functions, so its bits are theirs.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor

from vllm_gdn_invariant.golden import RecurrentDims, fp32_scale

from .conv import ConvConfig, conv_config, launch_conv
from .recurrent import RecurrentConfig, launch_into, new_output, recurrent_config
from .validation import ConvDims

PLANS = 1024  # decode-step shapes whose dims and launch shapes are kept


def decode_step(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    conv_state: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    state: Tensor,
    state_indices: Tensor,
    *,
    num_k_heads: int,
    scale: float,
    activation: str | None = "silu",
    dim_first: bool = True,
    out: Tensor | None = None,
) -> Tensor:
    """One decode token per row: ``out [B, 1, HV, V]``; ``conv_state`` and ``state`` in place.

    ``x`` [B, 2*H*K + HV*V] is the row's q | k | v before the convolution, ``conv_weight``
    [dim, W], ``conv_state`` vLLM's cache ([blocks, dim, W-1] when ``dim_first``, else
    [blocks, W-1, dim]), ``state`` [blocks, HV, V, K]. Bitwise ``golden.conv_update`` followed
    by ``golden.recurrent_step`` on the conv output. The output goes to ``out`` when given (a
    contiguous [B, 1, HV, V] tensor of x's dtype on x's device, such as vLLM's
    ``core_attn_out[:B].unsqueeze(1)``), else to a new tensor.
    """
    num_v_heads, head_v, head_k = state.shape[1:]
    conv_dims, conv_shape, dims, shape = decode_plan(
        *x.shape,
        conv_weight.shape[1],
        dim_first,
        activation is not None,
        num_k_heads,
        num_v_heads,
        head_v,
        head_k,
        scale,
        math.copysign(1.0, scale),  # -0.0 and 0.0 are one key otherwise
        state.dtype,
    )
    if out is None:
        out = new_output(x, dims)
    else:
        check_output(out, x, dims)
    conv_out, _ = launch_conv(
        x, conv_state, conv_weight, state_indices, conv_bias, conv_dims, conv_shape
    )
    launch_into(out, conv_out, a, b, A_log, dt_bias, state, state_indices, dims, shape)
    return out


def check_output(out: Tensor, x: Tensor, dims: RecurrentDims) -> None:
    """ValueError unless ``out`` can take the recurrent kernel's output for ``x``: [B, 1, HV, V],
    contiguous, x's dtype and device (the kernel writes it as contiguous memory)."""
    want = (dims.batch, 1, dims.num_v_heads, dims.head_v)
    if tuple(out.shape) != want or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"decode_step: out must be {list(want)} {x.dtype} on {x.device}, got "
            f"{list(out.shape)} {out.dtype} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError(f"decode_step: out must be contiguous, got strides {out.stride()}")


@functools.lru_cache(maxsize=PLANS)
def decode_plan(
    batch: int,
    dim: int,
    taps: int,
    dim_first: bool,
    silu: bool,
    num_k_heads: int,
    num_v_heads: int,
    head_v: int,
    head_k: int,
    scale: float,
    scale_sign: float,
    state_dtype: torch.dtype,
) -> tuple[ConvDims, ConvConfig, RecurrentDims, RecurrentConfig]:
    """The two kernels' dims and launch shapes (those of the public functions) for a decode
    step's sizes, computed once per distinct sizes."""
    conv_dims = ConvDims(batch=batch, dim=dim, taps=taps, dim_first=dim_first, silu=silu)
    dims = RecurrentDims(
        batch=batch,
        num_k_heads=num_k_heads,
        num_v_heads=num_v_heads,
        head_k=head_k,
        head_v=head_v,
        scale=fp32_scale(scale),  # as the goldens round it
        use_qk_l2norm=True,
    )
    return conv_dims, conv_config(conv_dims), dims, recurrent_config(dims, state_dtype)
