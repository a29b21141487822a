"""Triton kernels that replay a whole response's GDN decode steps, bitwise the goldens per token.

For every sequence ``s`` of a packed batch and every token ``t`` of it, in order, the result is
``golden.conv_update`` on x[t] (block ``conv_indices[s]``) followed by ``golden.recurrent_step``
on its output (block ``state_indices[s]``): the spec is the docstrings of
``vllm_gdn_invariant.golden.conv`` and ``vllm_gdn_invariant.golden.recurrent``. The arithmetic is
the jit helpers that the decode-step kernels use (``conv.convolve``, ``recurrent.qk_slabs``,
``recurrent.gates``, ``recurrent.delta_rule``, the conversions of ``elementary.py``); this module
adds the token loop and where values are kept between tokens:

* the conv window of each channel (the previous W-1 inputs, in the conv-state dtype, from the
  conv state for the first tokens) and the recurrent state block stay in registers across the
  tokens; the state is rounded to its dtype and widened again after every token, which is what
  the per-token step's store and the next step's load do;
* the conv output is rounded to x's dtype before the recurrent step reads it (the golden conv's
  ``out``), and the output of token t to x's dtype;
* token t's inputs (x, a, b) are loaded while token t - 1 is computed; the conv weights and bias
  are loaded again for every token (from cache), which leaves their registers to the state.

An inactive sequence index (<= 0) follows the goldens' contract op by op: ``conv_indices[s] <= 0``
feeds zeros to the recurrent step (the conv's zero output row) and writes no conv block;
``state_indices[s] <= 0`` gives zero outputs and reads and writes no state block.

Launches. ``replay_kernel`` runs one program per (sequence, value head, block of BV value rows),
looping over the sequence's tokens; it writes ``out`` and the state block rows it holds (no other
program touches them). Each program recomputes the conv and the norms of its k-head's q and k
channels for every token (the same arithmetic, so the same bits, in every program of a k-head)
and the conv of its own v channels. The conv state it only reads: the programs of one k-head all
read the q and k channels' history, and nothing orders one program's end before another's start,
so no program can overwrite that history safely. ``conv_tail_kernel``, launched after it on the
same stream, writes each active sequence's final conv window once, in the conv-state dtype: the
last W-1 of [history, x cast to the conv-state dtype] (taps from the old history when the
sequence is shorter than W-1).

Launch shape (``ReplayConfig``; it changes the speed, never the bits: a value row's reductions
never mix with other rows', and every program computes q and k alike). The tokens of a sequence
are a chain, so a replay takes (tokens) x (one token's latency in a program) while its programs
fit on the GPU at once, and (total work) / (throughput) beyond. A token's work in a program is a
part that does not shrink with the block (loading the token, the conv, SiLU and norms of the 2K
q/k channels, the gates, the layout changes of q and k), repeated by every program and largely
by every warp, and the state block's part (BV x K elements). So the fewer, fuller programs the
better, as long as they fill the GPU: the default gives each thread 4 value rows of 32
K-elements (the recurrent kernel's row share) over 4 warps, which at K = V = 128 is one program
per (sequence, value head), 254-255 registers without spills (Triton 3.9; 3.6 spills 16-24
bytes); while the programs are fewer than the GPU's multiprocessors it halves the block, down to
2 rows per thread (64 rows, 2 programs per head). Measured on an H200 (scripts/
sweep_replay_kernel.py, docs/kernels.md): Qwen3-Next's heads at TP1 and TP4, 8 and 64 sequences
of 1024 tokens, both state dtypes, 8 shapes from 1 to 4 rows per thread and 2 to 8 warps: the
default was the fastest in all 8 cases; 4 rows per thread over 2 warps came next (8-10 % slower
where the default is one program per head), and 1 row per thread took 1.01-3x its time. With 8
sequences at TP4 (64 pairs) one program per head took 1.31-1.78x the time of the default's two.
Holding the conv weights in registers across tokens runs faster but spills at 4 rows per thread
(docs/kernels.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from vllm_gdn_invariant.golden import fp32_scale

from .conv import TRITON_DTYPES, convolve
from .elementary import INTERPRETED, round_to, to_fp32
from .launch import Launcher, cdiv, next_power_of_2
from .recurrent import (
    delta_rule,
    gates,
    load_vector,
    qk_slabs,
    row_split,
    vector_offsets,
)


@triton.jit
def bound(n, condition):
    """``n`` where ``condition`` holds, else 0: a mask ``offsets < bound(n, c)`` is
    ``(offsets < n) & c`` (Triton's interpreter cannot AND a tensor with a scalar condition)."""
    return tl.where(condition, n, 0)


@triton.jit
def token_inputs(
    x,
    a,
    b,
    t,
    i_h,
    i_hv,
    o_v,
    mask_v,
    stride_x_row,
    stride_x_col,
    stride_a_row,
    stride_a_col,
    stride_b_row,
    stride_b_col,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    C: tl.constexpr,
    LOG2_J: tl.constexpr,
):
    """x's q and k channels of k-head i_h ([J, C], zeros past K), its v channels of value head
    i_hv's rows o_v, and a, b of head i_hv, for token t, widened to fp32."""
    row = x + t * stride_x_row
    xq = load_vector(row, i_h * K, stride_x_col, K, C, LOG2_J)
    xk = load_vector(row, H * K + i_h * K, stride_x_col, K, C, LOG2_J)
    xv = to_fp32(tl.load(row + (2 * H * K + i_hv * V + o_v) * stride_x_col, mask=mask_v, other=0.0))
    a_t = to_fp32(tl.load(a + t * stride_a_row + i_hv * stride_a_col))
    b_t = to_fp32(tl.load(b + t * stride_b_row + i_hv * stride_b_col))
    return xq, xk, xv, a_t, b_t


@triton.jit
def load_taps(p, stride_tap, mask, COUNT: tl.constexpr):
    """The tuple of ``COUNT`` tensors p[.. + j * stride_tap], j = 0 .. COUNT-1 (zeros off mask)."""
    taps = ()
    for j in tl.static_range(COUNT):
        taps = taps + (tl.load(p + j * stride_tap, mask=mask, other=0.0),)
    return taps


@triton.jit
def conv_channels(
    history,
    token,
    weights,
    acc,
    W: tl.constexpr,
    OPERAND_DTYPE: tl.constexpr,
    SILU: tl.constexpr,
    CONV_DTYPE: tl.constexpr,
    X_DTYPE: tl.constexpr,
):
    """One token through the conv of a set of channels: the golden conv's output (rounded to
    x's dtype, widened to fp32) and the next token's history (the window's last W-1 taps).
    ``history``: W-1 tensors in the conv-state dtype; ``token``: x widened to fp32."""
    window = history + (round_to(token, CONV_DTYPE),)
    y = to_fp32(round_to(convolve(acc, window, weights, W, OPERAND_DTYPE, SILU), X_DTYPE))
    shifted = ()
    for j in tl.static_range(1, W):
        shifted = shifted + (window[j],)
    return y, shifted


@triton.jit
def replay_kernel(
    x,
    a,
    b,
    A_log,
    dt_bias,
    conv_weight,
    conv_bias,
    conv_state,
    conv_indices,
    state,
    state_indices,
    cu_seqlens,
    out,
    scale,
    stride_x_row,
    stride_x_col,
    stride_a_row,
    stride_a_col,
    stride_b_row,
    stride_b_col,
    stride_A_log,
    stride_dt_bias,
    stride_weight_dim,
    stride_weight_tap,
    stride_bias,
    stride_conv_block,
    stride_conv_dim,
    stride_conv_tap,
    stride_conv_indices,
    stride_state_block,
    stride_state_head,
    stride_state_v,
    stride_state_k,
    stride_state_indices,
    stride_cu,
    stride_out_row,
    stride_out_head,
    stride_out_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    W: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
    OPERAND_DTYPE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    J: tl.constexpr = 1 << LOG2_J
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    CONV_DTYPE: tl.constexpr = conv_state.dtype.element_ty
    X_DTYPE: tl.constexpr = x.dtype.element_ty
    STATE_DTYPE: tl.constexpr = state.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_sh = pid // NV
    i_s = i_sh // HV
    i_hv = i_sh % HV
    i_h = i_hv // (HV // H)

    bos = tl.load(cu_seqlens + i_s * stride_cu).to(tl.int64)
    eos = tl.load(cu_seqlens + (i_s + 1) * stride_cu).to(tl.int64)
    conv_block = tl.load(conv_indices + i_s * stride_conv_indices).to(tl.int64)
    state_block = tl.load(state_indices + i_s * stride_state_indices).to(tl.int64)
    conv_on = conv_block > 0
    state_on = state_block > 0

    # q and k of k-head i_h as [J, C] (k = j * C + c); a value-row block as J slabs [BV, C].
    o_k = vector_offsets(C, LOG2_J)
    o_c = tl.arange(0, C)[None, :]
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    channel_q = i_h * K + o_k
    channel_k = H * K + i_h * K + o_k
    channel_v = 2 * H * K + i_hv * V + o_v

    # History of the program's channels.
    p_conv = conv_state + bound(conv_block, conv_on) * stride_conv_block
    conv_k = bound(K, conv_on)
    conv_v = bound(V, conv_on)
    hist_q = load_taps(p_conv + channel_q * stride_conv_dim, stride_conv_tap, o_k < conv_k, W - 1)
    hist_k = load_taps(p_conv + channel_k * stride_conv_dim, stride_conv_tap, o_k < conv_k, W - 1)
    hist_v = load_taps(p_conv + channel_v * stride_conv_dim, stride_conv_tap, o_v < conv_v, W - 1)

    # The recurrent state block, fp32 in registers.
    state_v = bound(V, state_on)
    p_h = (
        state
        + bound(state_block, state_on) * stride_state_block
        + i_hv * stride_state_head
        + o_v[:, None] * stride_state_v
        + o_c * stride_state_k
    )
    h = ()
    for j in tl.static_range(J):
        mask = (o_v[:, None] < state_v) & (j * C + o_c < K)
        h = h + (to_fp32(tl.load(p_h + j * C * stride_state_k, mask=mask, other=0.0)),)
    A_log_val = to_fp32(tl.load(A_log + i_hv * stride_A_log))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv * stride_dt_bias))

    p_out = out + i_hv * stride_out_head + o_v * stride_out_v
    # Token t's inputs are loaded during token t - 1 (the last token loads itself again).
    first = tl.where(eos > bos, bos, 0)
    xq, xk, xv, a_t, b_t = token_inputs(
        x,
        a,
        b,
        first,
        i_h,
        i_hv,
        o_v,
        mask_v,
        stride_x_row,
        stride_x_col,
        stride_a_row,
        stride_a_col,
        stride_b_row,
        stride_b_col,
        H,
        K,
        V,
        C,
        LOG2_J,
    )
    for t in range(bos, eos):
        following = tl.where(t + 1 < eos, t + 1, t)
        next_inputs = token_inputs(
            x,
            a,
            b,
            following,
            i_h,
            i_hv,
            o_v,
            mask_v,
            stride_x_row,
            stride_x_col,
            stride_a_row,
            stride_a_col,
            stride_b_row,
            stride_b_col,
            H,
            K,
            V,
            C,
            LOG2_J,
        )
        wq = load_taps(conv_weight + channel_q * stride_weight_dim, stride_weight_tap, o_k < K, W)
        wk = load_taps(conv_weight + channel_k * stride_weight_dim, stride_weight_tap, o_k < K, W)
        wv = load_taps(conv_weight + channel_v * stride_weight_dim, stride_weight_tap, mask_v, W)
        if HAS_BIAS:
            bias_q = to_fp32(tl.load(conv_bias + channel_q * stride_bias, mask=o_k < K, other=0.0))
            bias_k = to_fp32(tl.load(conv_bias + channel_k * stride_bias, mask=o_k < K, other=0.0))
            bias_v = to_fp32(tl.load(conv_bias + channel_v * stride_bias, mask=mask_v, other=0.0))
        else:
            bias_q = tl.full([J, C], 0.0, tl.float32)
            bias_k = tl.full([J, C], 0.0, tl.float32)
            bias_v = tl.full([BV], 0.0, tl.float32)
        q, hist_q = conv_channels(
            hist_q, xq, wq, bias_q, W, OPERAND_DTYPE, SILU, CONV_DTYPE, X_DTYPE
        )
        k, hist_k = conv_channels(
            hist_k, xk, wk, bias_k, W, OPERAND_DTYPE, SILU, CONV_DTYPE, X_DTYPE
        )
        v, hist_v = conv_channels(
            hist_v, xv, wv, bias_v, W, OPERAND_DTYPE, SILU, CONV_DTYPE, X_DTYPE
        )
        # Zero past K (the golden's padding) and where the conv is inactive (its zero output).
        q = tl.where(o_k < conv_k, q, 0.0)
        k = tl.where(o_k < conv_k, k, 0.0)
        v = tl.where(o_v < conv_v, v, 0.0)
        q_slabs, k_slabs = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)
        decay, beta = gates(a_t, b_t, A_log_val, dt_bias_val)
        h, o = delta_rule(h, q_slabs, k_slabs, v, decay, beta, BV, K, LOG2_J, LOG2_CL, LOG2_VEC)
        stored = ()
        for j in tl.static_range(J):
            stored = stored + (to_fp32(round_to(h[j], STATE_DTYPE)),)  # the per-token store
        h = stored
        o = tl.where(o_v < state_v, o, 0.0)
        tl.store(p_out + t * stride_out_row, round_to(o, out.dtype.element_ty), mask=mask_v)
        xq, xk, xv, a_t, b_t = next_inputs

    written_v = bound(state_v, eos > bos)
    for j in tl.static_range(J):
        mask = (o_v[:, None] < written_v) & (j * C + o_c < K)
        tl.store(p_h + j * C * stride_state_k, round_to(h[j], STATE_DTYPE), mask=mask)


@triton.jit
def conv_tail_kernel(
    x,
    conv_state,
    conv_indices,
    cu_seqlens,
    stride_x_row,
    stride_x_col,
    stride_conv_block,
    stride_conv_dim,
    stride_conv_tap,
    stride_conv_indices,
    stride_cu,
    DIM: tl.constexpr,
    W: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Each active sequence's final conv window: tap j is x[bos + L - (W-1) + j] cast to the
    conv-state dtype, or the old history's tap j + L when that token precedes the sequence."""
    i_s = tl.program_id(0).to(tl.int64)
    o_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    bos = tl.load(cu_seqlens + i_s * stride_cu).to(tl.int64)
    length = tl.load(cu_seqlens + (i_s + 1) * stride_cu).to(tl.int64) - bos
    block = tl.load(conv_indices + i_s * stride_conv_indices).to(tl.int64)
    dim = bound(bound(DIM, block > 0), length > 0)
    p_state = conv_state + bound(block, block > 0) * stride_conv_block + o_d * stride_conv_dim
    window = ()
    for j in tl.static_range(W - 1):
        position = length - (W - 1) + j
        from_x = position >= 0
        token = tl.load(
            x + (bos + position) * stride_x_row + o_d * stride_x_col,
            mask=o_d < bound(dim, from_x),
            other=0.0,
        )
        token = round_to(to_fp32(token), conv_state.dtype.element_ty)
        old = tl.load(
            p_state + (j + length) * stride_conv_tap, mask=o_d < bound(dim, position < 0), other=0.0
        )
        window = window + (tl.where(from_x, token, old),)
    for j in tl.static_range(W - 1):
        tl.store(p_state + j * stride_conv_tap, window[j], mask=o_d < dim)


MAX_ROWS_PER_THREAD = 4
MIN_ROWS_PER_THREAD = 2
WARPS = 4
H200_MULTIPROCESSORS = 132
TAIL_BLOCK_D = 256
TAIL_WARPS = 4


@dataclass(frozen=True)
class ReplayConfig:
    """Launch shape of replay_kernel (RecurrentConfig's fields: value rows per program, the split
    of the padded K into slabs, lanes and vectors, warps); it changes the speed, never the bits."""

    block_v: int
    log2_j: int
    log2_cl: int
    log2_vec: int
    num_warps: int


class ReplayTensors(NamedTuple):
    """The tensors of a replay, in ``replay_tokens``' order (shapes in its docstring)."""

    x: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor
    conv_weight: Tensor
    conv_bias: Tensor | None
    conv_state: Tensor
    conv_indices: Tensor
    state: Tensor
    state_indices: Tensor
    cu_seqlens: Tensor


@dataclass(frozen=True)
class ReplayDims:
    """Sizes of a replay, from the shapes of its arguments, and its options: SiLU after the
    conv, QK norm, the conv state's layout ([blocks, dim, W-1] when ``dim_first``)."""

    num_sequences: int
    num_k_heads: int
    num_v_heads: int
    head_k: int
    head_v: int
    taps: int
    scale: float  # rounded to fp32, as the goldens round it
    silu: bool = True
    use_qk_l2norm: bool = True
    dim_first: bool = True


def replay_config(
    dims: ReplayDims,
    state_dtype: torch.dtype,
    multiprocessors: int,
    interpreted: bool = INTERPRETED,
) -> ReplayConfig:
    """The default launch shape (module docstring): K split by ``row_split`` (32 elements of
    a value row per thread, in 16-byte vectors) over 4 warps (fewer for short V),
    4 value rows per thread, halved down to 2 while the programs are fewer than the GPU's
    ``multiprocessors``; all V rows per program under the interpreter."""
    log2_j, log2_cl, log2_vec = row_split(dims.head_k, state_dtype)
    rows_per_warp = 32 >> log2_cl
    block_v = next_power_of_2(dims.head_v)
    if not interpreted:
        block_v = min(block_v, rows_per_warp * WARPS * MAX_ROWS_PER_THREAD)
        pairs = dims.num_sequences * dims.num_v_heads
        smallest = rows_per_warp * WARPS * MIN_ROWS_PER_THREAD
        while block_v > smallest and pairs * cdiv(dims.head_v, block_v) < multiprocessors:
            block_v //= 2
    return ReplayConfig(
        block_v=block_v,
        log2_j=log2_j,
        log2_cl=log2_cl,
        log2_vec=log2_vec,
        num_warps=max(1, min(WARPS, block_v // (rows_per_warp * MIN_ROWS_PER_THREAD))),
    )


def multiprocessors(device: torch.device) -> int:
    """The streaming multiprocessors of a CUDA device (torch caches its properties); 0 else."""
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def replay_dims(
    tensors: ReplayTensors,
    *,
    num_k_heads: int,
    scale: float,
    activation: str | None = "silu",
    use_qk_l2norm: bool = True,
    dim_first: bool = True,
) -> ReplayDims:
    """The sizes of a replay from its tensors' shapes (no device reads) and its options
    (``replay_tokens``' keyword arguments)."""
    _, num_v_heads, head_v, head_k = tensors.state.shape
    return ReplayDims(
        num_sequences=tensors.cu_seqlens.shape[0] - 1,
        num_k_heads=num_k_heads,
        num_v_heads=num_v_heads,
        head_k=head_k,
        head_v=head_v,
        taps=tensors.conv_weight.shape[1],
        scale=fp32_scale(scale),
        silu=activation is not None,
        use_qk_l2norm=use_qk_l2norm,
        dim_first=dim_first,
    )


def conv_layout(tensors: ReplayTensors, dims: ReplayDims) -> Tensor:
    """The conv state as [blocks, dim, W-1] (a view), whose strides the kernels take."""
    return tensors.conv_state if dims.dim_first else tensors.conv_state.transpose(1, 2)


def kernel_arguments(
    tensors: ReplayTensors, out: Tensor, dims: ReplayDims, config: ReplayConfig
) -> tuple[tuple[int], tuple, dict]:
    """(grid, positional arguments, constexpr arguments) of replay_kernel."""
    t = tensors
    operand_dtype = torch.promote_types(t.conv_state.dtype, t.conv_weight.dtype)
    num_v_tiles = cdiv(dims.head_v, config.block_v)
    bias = t.conv_weight if t.conv_bias is None else t.conv_bias  # not read without a bias
    arguments = (
        *t._replace(conv_bias=bias),  # NamedTuple's public copy-with-changes
        out,
        dims.scale,
        *t.x.stride(),
        *t.a.stride(),
        *t.b.stride(),
        t.A_log.stride(0),
        t.dt_bias.stride(0),
        *t.conv_weight.stride(),
        0 if t.conv_bias is None else t.conv_bias.stride(0),
        *conv_layout(t, dims).stride(),
        t.conv_indices.stride(0),
        *t.state.stride(),
        t.state_indices.stride(0),
        t.cu_seqlens.stride(0),
        *out.stride(),
    )
    constexprs = {
        "H": dims.num_k_heads,
        "HV": dims.num_v_heads,
        "K": dims.head_k,
        "V": dims.head_v,
        "W": dims.taps,
        "BV": config.block_v,
        "NV": num_v_tiles,
        "LOG2_J": config.log2_j,
        "LOG2_CL": config.log2_cl,
        "LOG2_VEC": config.log2_vec,
        "OPERAND_DTYPE": TRITON_DTYPES[operand_dtype],
        "HAS_BIAS": t.conv_bias is not None,
        "SILU": dims.silu,
        "USE_QK_L2NORM": dims.use_qk_l2norm,
    }
    grid = (dims.num_sequences * dims.num_v_heads * num_v_tiles,)
    return grid, arguments, constexprs


def tail_arguments(tensors: ReplayTensors, dims: ReplayDims) -> tuple[tuple[int, int], tuple, dict]:
    """(grid, positional arguments, constexpr arguments) of conv_tail_kernel."""
    t = tensors
    dim = t.x.shape[1]
    arguments = (
        t.x,
        t.conv_state,
        t.conv_indices,
        t.cu_seqlens,
        *t.x.stride(),
        *conv_layout(t, dims).stride(),
        t.conv_indices.stride(0),
        t.cu_seqlens.stride(0),
    )
    constexprs = {"DIM": dim, "W": dims.taps, "BLOCK_D": TAIL_BLOCK_D}
    return (dims.num_sequences, cdiv(dim, TAIL_BLOCK_D)), arguments, constexprs


# One launch per response, so Triton's JIT launcher serves them (conv_bias may be None among
# the tensors, which the direct launch's key does not take).
LAUNCH_REPLAY = Launcher(replay_kernel, tensors=13, direct=False)
LAUNCH_TAIL = Launcher(conv_tail_kernel, tensors=4, direct=False)


def launch_replay(
    tensors: ReplayTensors, out: Tensor, dims: ReplayDims, config: ReplayConfig
) -> tuple[object, object]:
    """Launch replay_kernel, then conv_tail_kernel; returns what the two launches returned
    (Triton's compiled kernels; None under the interpreter or when there are no tokens)."""
    device = tensors.x.device
    if dims.num_sequences == 0 or tensors.x.shape[0] == 0:
        return None, None
    grid, arguments, constexprs = kernel_arguments(tensors, out, dims, config)
    compiled = LAUNCH_REPLAY(grid, arguments, constexprs, num_warps=config.num_warps, device=device)
    grid, arguments, constexprs = tail_arguments(tensors, dims)
    tail = LAUNCH_TAIL(grid, arguments, constexprs, num_warps=TAIL_WARPS, device=device)
    return compiled, tail


def replay_tokens(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    conv_state: Tensor,
    conv_indices: Tensor,
    state: Tensor,
    state_indices: Tensor,
    cu_seqlens: Tensor,
    *,
    num_k_heads: int,
    scale: float,
    activation: str | None = "silu",
    use_qk_l2norm: bool = True,
    dim_first: bool = True,
    out: Tensor | None = None,
) -> Tensor:
    """Replay packed sequences token by token; returns ``out [N, HV, V]`` in x's dtype, the
    states updated in place.

    ``x`` [N, 2*H*K + HV*V] is each token's q | k | v before the conv, ``a``, ``b`` [N, HV],
    ``A_log``, ``dt_bias`` [HV], ``conv_weight`` [dim, W], ``conv_bias`` [dim] or None,
    ``conv_state`` [blocks, dim, W-1] (``dim_first``) or [blocks, W-1, dim], ``state``
    [blocks, HV, V, K], ``conv_indices``, ``state_indices`` [S] and ``cu_seqlens`` [S+1] (from 0
    to N; a sequence may be empty). Token t of sequence s gives bitwise the output of
    ``golden.conv_update`` then ``golden.recurrent_step`` on the states left by the tokens before
    it; afterwards blocks ``conv_indices[s]`` and ``state_indices[s]`` hold bitwise the goldens'
    states after the last token, every other block untouched (indices <= 0: the goldens' inactive
    rows, module docstring). ``out``, if given, is written instead of a new tensor.

    Nothing is validated (the callers check the arguments) and nothing is read back to the host:
    sizes come from shapes. Runs on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1``.
    """
    tensors = ReplayTensors(
        x, a, b, A_log, dt_bias, conv_weight, conv_bias, conv_state, conv_indices, state,
        state_indices, cu_seqlens,
    )  # fmt: skip
    dims = replay_dims(
        tensors,
        num_k_heads=num_k_heads,
        scale=scale,
        activation=activation,
        use_qk_l2norm=use_qk_l2norm,
        dim_first=dim_first,
    )
    if out is None:
        out = torch.empty(
            (x.shape[0], dims.num_v_heads, dims.head_v), dtype=x.dtype, device=x.device
        )
    launch_replay(tensors, out, dims, replay_config(dims, state.dtype, multiprocessors(x.device)))
    return out
