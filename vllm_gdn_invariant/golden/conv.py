"""Golden causal-conv1d decode update (one token per row) over a paged conv state.

Arithmetic, per active row and channel d, with W = weight.shape[1] taps:

    token   = x[d] cast to the cache dtype
    window  = [state[d, 0], ..., state[d, W-2], token]           # cache dtype
    acc     = fp32(bias[d]) if bias is given else 0.0            # fp32
    for j in 0 .. W-1:                                           # in this order
        p   = window[j] * weight[d, j]  in the operand dtype     # promote(cache, weight)
        acc = acc + fp32(p)
    y       = acc / (1 + exp(-acc))  if activation is silu, else acc
    out[d]  = y cast to x's dtype
    state[d, :] = window[1:]                                     # cache dtype

The product in the operand dtype is the fp32 product of the two operands rounded to that dtype:
for a bf16 cache and bf16 weight it is rounded to bf16 before it is added (what torch and Triton
do for ``bf16 * bf16``); for an fp32 cache it is the fp32 product. Every add is its own rounded
fp32 op; exp is elementary.py's and the division is IEEE.

This follows vLLM's ``causal_conv1d_update`` Triton kernel
(vllm/model_executor/layers/mamba/ops/causal_conv1d.py, the same decode arithmetic in 0.30.0 to
0.34.0): token cast to the cache dtype, accumulator from the bias, taps in order, product in
the operand dtype, shifted window as the new state. It differs in: SiLU (Triton lowers
``acc / (1 + tl.exp(-acc))`` to ``ex2.approx`` and the approximate ``div.full.f32``); contraction
(with an fp32 operand dtype the compiler may fuse a tap's multiply and add into an FMA); the
output store (the kernel stores ``acc`` in the cache dtype and then casts to x's dtype, two
roundings when x is wider than the cache; the golden rounds once, which agrees whenever x is
bf16); and inactive rows (the kernel skips only index == null_block_id and leaves that output
row unwritten; the golden treats every index <= 0 as inactive and writes zeros).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from .contract import (
    CONV_STATE_DTYPES,
    FLOAT_DTYPES,
    ActiveRows,
    active_rows,
    check_state_index_values,
    require_bool,
    require_shape,
    require_state_indices,
    require_tensor,
)
from .elementary import silu

ACTIVATIONS = (None, "silu", "swish")


def accumulate_taps(window: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """fp32 accumulator over the taps, from the bias, each product rounded to the operand dtype.

    Shapes: window [n, dim, W] (cache dtype), weight [dim, W], bias [dim] or None.
    Returns acc [n, dim] in fp32.
    """
    operand_dtype = torch.promote_types(window.dtype, weight.dtype)
    n, dim, taps = window.shape
    if bias is None:
        acc = torch.zeros((n, dim), dtype=torch.float32, device=window.device)
    else:
        acc = bias.to(torch.float32).expand(n, dim)
    for j in range(taps):
        product = window[:, :, j].to(torch.float32) * weight[:, j].to(torch.float32)
        acc = acc + product.to(operand_dtype).to(torch.float32)
    return acc


@dataclass(frozen=True)
class ConvDims:
    """Sizes of a conv update, its cache layout and whether SiLU follows the taps."""

    batch: int
    dim: int
    taps: int
    dim_first: bool
    silu: bool


@dataclass(frozen=True)
class ConvArgs(ConvDims):
    """The dims of checked conv_update arguments and their active rows."""

    active: ActiveRows


def check_conv_dims(
    x: object,
    conv_state: object,
    weight: object,
    state_indices: object,
    *,
    bias: object = None,
    activation: object = "silu",
    dim_first: object = True,
) -> ConvDims:
    """conv_update's argument checks but the index values (contract.py): every type, dtype,
    rank, device and shape, the indices' included; reads no tensor's values."""
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
    require_state_indices(state_indices, batch=batch, device=device, device_of="x")
    silu = activation is not None
    return ConvDims(batch=batch, dim=dim, taps=taps, dim_first=dim_first, silu=silu)


def check_conv_args(
    x: object,
    conv_state: object,
    weight: object,
    state_indices: object,
    *,
    bias: object = None,
    activation: object = "silu",
    dim_first: object = True,
) -> ConvArgs:
    """conv_update's argument checks (contract.py): ``check_conv_dims``, then the index
    values; raises before anything is computed."""
    options = {"bias": bias, "activation": activation, "dim_first": dim_first}
    dims = check_conv_dims(x, conv_state, weight, state_indices, **options)
    check_state_index_values(state_indices, num_blocks=conv_state.shape[0])
    return ConvArgs(**dims.__dict__, active=active_rows(state_indices))


def conv_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    state_indices: Tensor,
    *,
    bias: Tensor | None = None,
    activation: str | None = "silu",
    dim_first: bool = True,
) -> tuple[Tensor, Tensor]:
    """Golden causal-conv1d decode update; returns ``(out [B, dim], new_conv_state)``, out of place.

    ``x`` [B, dim]; ``conv_state`` [num_blocks, dim, W-1] if ``dim_first`` else
    [num_blocks, W-1, dim]; ``weight`` [dim, W]; ``state_indices`` [B] (<= 0: inactive, zero
    output, no block touched); ``activation`` None, "silu" or "swish" (= silu). Fixes the
    arithmetic of vLLM's ``causal_conv1d_update``: token cast to the cache dtype, fp32
    accumulator from the bias, taps in order with each product rounded to the operand dtype,
    then SiLU as ``acc / (1 + exp(-acc))``; it differs from the kernel in its exp and IEEE
    division, in never fusing a multiply-add, in rounding the output once to x's dtype and in
    zeroing inactive rows (module docstring). ``out`` has x's dtype; ``new_conv_state`` equals
    ``conv_state`` outside the active rows' blocks.
    """
    checked = check_conv_args(
        x, conv_state, weight, state_indices, bias=bias, activation=activation, dim_first=dim_first
    )
    batch, dim, dim_first, active = checked.batch, checked.dim, checked.dim_first, checked.active
    layout = conv_state if dim_first else conv_state.transpose(1, 2)  # [num_blocks, dim, W-1]
    history = layout.index_select(0, active.blocks)
    token = x.index_select(0, active.rows).to(conv_state.dtype)
    window = torch.cat([history, token[:, :, None]], dim=2)  # [n, dim, W]
    y = accumulate_taps(window, weight, bias)
    if activation is not None:
        y = silu(y)

    out = torch.zeros((batch, dim), dtype=x.dtype, device=x.device)
    out[active.rows] = y.to(x.dtype)
    new_conv_state = conv_state.clone()
    new_layout = new_conv_state if dim_first else new_conv_state.transpose(1, 2)
    new_layout[active.blocks] = window[:, :, 1:]
    return out, new_conv_state
