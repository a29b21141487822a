"""Triton kernel of the causal-conv1d decode update, bitwise equal to the golden.

The arithmetic is the golden's, specified in the docstring of ``vllm_gdn_invariant.golden.conv``
(token cast to the cache dtype, fp32 accumulator from the bias or +0, taps in order with each
product rounded to the operand dtype, SiLU, one rounding to x's dtype), with SiLU and the
conversions of ``kernels/elementary.py``. The layout is that of vLLM's ``causal_conv1d_update``:
one program per (row, block of ``BLOCK_D`` channels), the W-1 history taps read through the
cache's strides (either layout), the shifted window written back in place. An inactive row
(index <= 0) writes a zero output block and touches no state.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .call_plans import CALL_PLANS, CallPlan, call_key
from .elementary import round_to, silu, to_fp32
from .launch import BoundLaunch, Launcher, cdiv, next_power_of_2, run_bound, tensor_layouts
from .validation import ConvDims, check_conv_args, signature


@triton.jit
def tap_product(window_j, weight_j, OPERAND_DTYPE: tl.constexpr):
    """fp32(window_j * weight_j in the operand dtype): the fp32 product rounded to that dtype."""
    return to_fp32(round_to(to_fp32(window_j) * to_fp32(weight_j), OPERAND_DTYPE))


@triton.jit
def convolve(
    acc, window, weights, W: tl.constexpr, OPERAND_DTYPE: tl.constexpr, SILU: tl.constexpr
):
    """The golden's conv output in fp32, before its rounding to x's dtype: ``acc`` (the fp32
    bias, or +0) plus the W tap products window[j] * weights[j] in order, then SiLU if SILU.
    ``window`` (cache dtype, the token last) and ``weights`` are tuples of W tensors."""
    for j in tl.static_range(W):
        acc = acc + tap_product(window[j], weights[j], OPERAND_DTYPE)
    if SILU:
        acc = silu(acc)
    return acc


@triton.jit
def conv_update_kernel(
    x,
    conv_state,
    weight,
    bias,
    state_indices,
    out,
    stride_x_row,
    stride_x_dim,
    stride_state_block,
    stride_state_dim,
    stride_state_tap,
    stride_weight_dim,
    stride_weight_tap,
    stride_bias,
    stride_indices,
    stride_out_row,
    DIM: tl.constexpr,
    W: tl.constexpr,
    BLOCK_D: tl.constexpr,
    OPERAND_DTYPE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
):
    i_n = tl.program_id(0).to(tl.int64)
    o_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = o_d < DIM
    p_out = out + i_n * stride_out_row + o_d

    block = tl.load(state_indices + i_n * stride_indices).to(tl.int64)
    if block <= 0:
        tl.store(p_out, tl.full([BLOCK_D], 0, out.dtype.element_ty), mask=mask_d)
        return

    p_state = conv_state + block * stride_state_block + o_d * stride_state_dim
    p_weight = weight + o_d * stride_weight_dim
    token = tl.load(x + i_n * stride_x_row + o_d * stride_x_dim, mask=mask_d, other=0.0)
    token = round_to(to_fp32(token), conv_state.dtype.element_ty)

    if HAS_BIAS:
        acc = to_fp32(tl.load(bias + o_d * stride_bias, mask=mask_d, other=0.0))
    else:
        acc = tl.full([BLOCK_D], 0.0, tl.float32)
    # window = [state[:, 0], ..., state[:, W-2], token]; the new state is window[1:].
    window = ()
    weights = ()
    for j in tl.static_range(W):
        if j < W - 1:
            window = window + (tl.load(p_state + j * stride_state_tap, mask=mask_d, other=0.0),)
        weights = weights + (tl.load(p_weight + j * stride_weight_tap, mask=mask_d, other=0.0),)
    window = window + (token,)
    acc = convolve(acc, window, weights, W, OPERAND_DTYPE, SILU)
    for j in tl.static_range(W - 1):
        tl.store(p_state + j * stride_state_tap, window[j + 1], mask=mask_d)
    tl.store(p_out, round_to(acc, out.dtype.element_ty), mask=mask_d)


INTERPRETED = not isinstance(conv_update_kernel, triton.runtime.JITFunction)
LAUNCH_CONV = Launcher(conv_update_kernel, tensors=6)
CONFIGS = 1024  # dims whose launch shape is kept
TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@dataclass(frozen=True)
class ConvConfig:
    """Launch shape of conv_update_kernel; it changes the speed, never the bits."""

    block_d: int
    num_warps: int


WIDE_BATCH_CHANNELS = 64 * 8192  # batch rows x channels from which the wide shape is taken
NARROW = ConvConfig(block_d=128, num_warps=4)
WIDE = ConvConfig(block_d=256, num_warps=8)
STATE_FIRST = ConvConfig(block_d=512, num_warps=8)


@functools.lru_cache(maxsize=CONFIGS)
def conv_config(dims: ConvDims, interpreted: bool = INTERPRETED) -> ConvConfig:
    """With a state-first cache ([blocks, W-1, dim], vLLM's default layout; each tap's channels
    contiguous) 512 channels over 8 warps per program at every batch size; with a dim-first one
    128 channels over 4 warps, and 256 over 8 from WIDE_BATCH_CHANNELS batch rows x channels on
    (the shapes that timed best against vLLM 0.26.0's conv update on an H100 at Qwen3-Next's
    8192 channels, docs/kernels.md, "Launch shapes, timed" and "The conv in vLLM's default
    layout"). The whole row (up to 4096 channels) under the interpreter, which only makes its
    Python loop shorter."""
    if interpreted:
        return ConvConfig(block_d=min(next_power_of_2(dims.dim), 4096), num_warps=4)
    if not dims.dim_first:
        return STATE_FIRST
    return WIDE if dims.batch * dims.dim >= WIDE_BATCH_CHANNELS else NARROW


def kernel_arguments(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    state_indices: Tensor,
    bias: Tensor | None,
    out: Tensor,
    dims: ConvDims,
    config: ConvConfig,
) -> tuple[tuple[int, int], tuple, dict]:
    """(grid, positional arguments, constexpr arguments) of conv_update_kernel."""
    layout = conv_state if dims.dim_first else conv_state.transpose(1, 2)  # [blocks, dim, W-1]
    operand_dtype = torch.promote_types(conv_state.dtype, weight.dtype)
    grid = (dims.batch, cdiv(dims.dim, config.block_d))
    arguments = (
        x,
        conv_state,
        weight,
        weight if bias is None else bias,  # not read without a bias
        state_indices,
        out,
        x.stride(0),
        x.stride(1),
        *layout.stride(),
        *weight.stride(),
        0 if bias is None else bias.stride(0),
        state_indices.stride(0),
        out.stride(0),
    )
    constexprs = {
        "DIM": dims.dim,
        "W": dims.taps,
        "BLOCK_D": config.block_d,
        "OPERAND_DTYPE": TRITON_DTYPES[operand_dtype],
        "HAS_BIAS": bias is not None,
        "SILU": dims.silu,
    }
    return grid, arguments, constexprs


def bound_key(tensors: tuple, no_bias: bool, dims: ConvDims, config: ConvConfig) -> tuple:
    """The key of a bound launch of the kernel's leading ``tensors`` (x .. out, the weight in the
    bias's place where ``no_bias``): the grid and every argument after the tensors follow from
    it."""
    return (dims, config, no_bias, tensors[0].get_device(), tensor_layouts(tensors))


def new_output(x: Tensor, dims: ConvDims) -> Tensor:
    """The kernel's output ``[B, dim]`` (x's dtype and device), uninitialized."""
    return torch.empty((dims.batch, dims.dim), dtype=x.dtype, device=x.device)


def launch_into(
    out: Tensor,
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    state_indices: Tensor,
    bias: Tensor | None,
    dims: ConvDims,
    config: ConvConfig,
    bound: BoundLaunch | None = None,
) -> BoundLaunch | None:
    """Run the kernel on checked arguments (``check_conv_args``), writing ``out`` [B, dim]
    (``new_output``): with ``bound``, a launch bound for these tensors' layouts, directly;
    else through the launch bound to their key, binding one on its first launch. Returns the
    bound launch that ran (None under the interpreter or for an empty batch)."""
    tensors = (x, conv_state, weight, weight if bias is None else bias, state_indices, out)
    if bound is not None:
        run_bound(bound, tensors)
        return bound
    if dims.batch == 0:
        return None
    return LAUNCH_CONV.launch_keyed(
        bound_key(tensors, bias is None, dims, config),
        tensors,
        lambda: kernel_arguments(x, conv_state, weight, state_indices, bias, out, dims, config),
        num_warps=config.num_warps,
        device=x.device,
    )


def launch_conv(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    state_indices: Tensor,
    bias: Tensor | None,
    dims: ConvDims,
    config: ConvConfig,
) -> tuple[Tensor, object]:
    """Run the kernel on checked arguments (``check_conv_args``).

    Returns ``out`` and the compiled kernel that ran (Triton's; None under the interpreter or
    for an empty batch).
    """
    out = new_output(x, dims)
    bound = launch_into(out, x, conv_state, weight, state_indices, bias, dims, config)
    return out, None if bound is None else bound.compiled


def conv_call_key(
    x: object,
    conv_state: object,
    weight: object,
    state_indices: object,
    *,
    bias: object,
    activation: object,
    dim_first: object,
) -> tuple | None:
    """The call key (``call_plans.call_key``) of ``conv_update`` with these arguments."""
    options = (signature(bias), (type(activation), activation), (type(dim_first), dim_first))
    tensors = (x, conv_state, weight, state_indices)
    if bias is not None:
        tensors = (*tensors, bias)  # its layout in the key; its signature in options
    return call_key("conv", tensors, options)


def conv_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    state_indices: Tensor,
    *,
    bias: Tensor | None = None,
    activation: str | None = "silu",
    dim_first: bool = True,
) -> Tensor:
    """Causal-conv1d decode update with the golden's bits; returns ``out [B, dim]``,
    ``conv_state`` in place.

    Arguments, shapes, dtypes and contract are ``golden.conv_update``'s (checked the same way
    before anything is written): ``out`` is bitwise the golden's ``out`` and, after the call,
    ``conv_state`` is bitwise the golden's ``new_conv_state``. Runs on CUDA tensors, or on CPU
    tensors under ``TRITON_INTERPRET=1``.
    """
    key = conv_call_key(
        x, conv_state, weight, state_indices, bias=bias, activation=activation, dim_first=dim_first
    )
    plan = CALL_PLANS.lookup(key, state_indices, num_blocks=conv_state.shape[0])
    if plan is None:
        dims = check_conv_args(
            x,
            conv_state,
            weight,
            state_indices,
            bias=bias,
            activation=activation,
            dim_first=dim_first,
            interpreted=INTERPRETED,
        )
    else:
        dims = plan.dims
    out = new_output(x, dims)
    tensors = (x, conv_state, weight, state_indices, bias)
    if plan is not None and out.data_ptr() & 15 == plan.out_alignment:
        launch_into(out, *tensors, dims, None, plan.bound)
        return out
    bound = launch_into(out, *tensors, dims, conv_config(dims))
    if plan is None and bound is not None:
        CALL_PLANS.keep(key, CallPlan(dims, bound, out.data_ptr() & 15))
    return out
