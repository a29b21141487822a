"""Triton kernel of the GDN packed recurrent decode step, bitwise equal to the golden.

The arithmetic is the golden's, specified in the docstring of
``vllm_gdn_invariant.golden.recurrent`` (per row and value head: QK norm, scale, gates, decay,
delta update, output), with the elementary functions and the fixed-order K-sum of
``kernels/elementary.py``. The layout is that of vLLM's
``fused_recurrent_gated_delta_rule_packed_decode``: one program per (row, value head, CHUNKS
blocks of ``BV`` value rows), the whole K axis in registers, q | k | v read from the packed
``mixed_qkv`` row, the state updated in place block by block. A program's blocks share its q
and k (loaded, normalized and scaled once) and gates; with more than one, the next block's
state and v are loaded before this block's arithmetic. An inactive row (index <= 0) writes a
zero output and touches no state.

K is padded to BK = next_power_of_2(K) like the golden's sum, and a block of value rows is held
as a tuple of J slabs [BV, C] (slab j holds k = j * C + c, BK = J * C), so that the first levels
of the fixed-order sum are elementwise adds of whole slabs; padded elements hold +0, the
golden's padding. q and k are normalized as one [J, C] tensor and then split into slabs. The
reductions of a value row never mix with other rows, so the launch shape (``RecurrentConfig``)
changes no bits.
"""

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .call_plans import CALL_PLANS, CallPlan, call_key
from .elementary import (
    INTERPRETED,
    QK_NORM_EPS,
    add,
    exp,
    fixed_order_sum_slabs,
    neg,
    round_to,
    sigmoid,
    softplus,
    sqrt,
    to_fp32,
)
from .launch import BoundLaunch, Launcher, cdiv, next_power_of_2, run_bound, tensor_layouts
from .validation import RecurrentDims, check_recurrent_args, signature


@triton.jit
def split_rows(x, ROWS: tl.constexpr, C: tl.constexpr):
    """[ROWS, C] -> (rows 0 .. ROWS/2 - 1, rows ROWS/2 .. ROWS - 1), each [ROWS / 2, C]."""
    halves = tl.permute(tl.reshape(x, [2, ROWS // 2, C]), [1, 2, 0])
    return tl.split(halves)


@triton.jit
def to_slabs(x, LOG2_J: tl.constexpr, C: tl.constexpr):
    """[J, C] -> the tuple of its J rows, each [1, C] (exact data movement)."""
    slabs = (x,)
    for level in tl.static_range(LOG2_J):
        halves = ()
        for i in tl.static_range(1 << level):
            first, second = split_rows(slabs[i], (1 << LOG2_J) >> level, C)
            halves = halves + (first, second)
        slabs = halves
    return slabs


@triton.jit
def vector_offsets(C: tl.constexpr, LOG2_J: tl.constexpr):
    """k = j * C + c of a K vector held as [J, C] (row j, column c)."""
    return tl.arange(0, 1 << LOG2_J)[:, None] * C + tl.arange(0, C)[None, :]


@triton.jit
def load_vector(row, first, stride, K: tl.constexpr, C: tl.constexpr, LOG2_J: tl.constexpr):
    """Elements first .. first + K - 1 of ``row`` (``stride`` apart) as fp32 [J, C], row j
    holding k = j * C + c (zeros past K)."""
    o_k = vector_offsets(C, LOG2_J)
    return to_fp32(tl.load(row + (first + o_k) * stride, mask=o_k < K, other=0.0))


@triton.jit
def l2_normalized(x, LOG2_J: tl.constexpr, LOG2_CL: tl.constexpr, LOG2_VEC: tl.constexpr):
    """x / sqrt(S(x * x) + 1e-6) of a vector held as [J, C] (golden l2_normalize)."""
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    squares = to_slabs(x * x, LOG2_J, C)
    total = fixed_order_sum_slabs(squares, 1, LOG2_J, LOG2_CL, LOG2_VEC)  # [1]
    return unreplicated(tl.div_rn(x, sqrt(total + QK_NORM_EPS)[:, None]), 1 << LOG2_J, C)


@triton.jit
def unreplicated(y, J: tl.constexpr, C: tl.constexpr):
    """``y`` [J, C] unchanged, through a reduction over an axis of one element: it keeps Triton
    from recomputing what made ``y`` (the normalization's divisions) in the replicated layout
    of the slabs ``y`` is split into."""
    return tl.reshape(tl.reduce(tl.reshape(y, [J, C, 1]), 2, add), [J, C])


@triton.jit
def qk_slabs(
    q,
    k,
    scale,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    """q and k of one k-head, fp32 [J, C] with zeros past K -> (q, k) as J slabs [1, C] each:
    both l2-normalized if USE_QK_L2NORM, then q times ``scale``."""
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    if USE_QK_L2NORM:
        q = l2_normalized(q, LOG2_J, LOG2_CL, LOG2_VEC)
        k = l2_normalized(k, LOG2_J, LOG2_CL, LOG2_VEC)
    return to_slabs(q * scale, LOG2_J, C), to_slabs(k, LOG2_J, C)


@triton.jit
def gates(a_val, b_val, A_log_val, dt_bias_val):
    """(exp(g), beta) of one (row, value head) from fp32 scalars: g = -exp(A_log) *
    softplus(a + dt_bias), beta = sigmoid(b)."""
    g = neg(exp(A_log_val)) * softplus(a_val + dt_bias_val)
    return exp(g), sigmoid(b_val)


@triton.jit
def delta_rule(
    h,
    q,
    k,
    v,
    decay,
    beta,
    BV: tl.constexpr,
    K: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
):
    """Decay, delta update and output of a block of BV value rows, fp32: ``h`` the J slabs
    [BV, C] of the state, ``q`` and ``k`` J slabs [1, C] (``qk_slabs``), ``v`` [BV], ``decay``
    = exp(g). Returns (the new state's J slabs, o [BV]); the caller rounds and stores them.
    Padded k (>= K) enters each sum as +0, the golden's padding."""
    J: tl.constexpr = 1 << LOG2_J
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    o_c = tl.arange(0, C)[None, :]
    hk = ()
    decayed = ()
    for j in tl.static_range(J):
        h_j = h[j] * decay
        decayed = decayed + (h_j,)
        hk_j = h_j * k[j]
        if J * C != K:
            hk_j = tl.where(j * C + o_c < K, hk_j, 0.0)  # the golden's zero padding
        hk = hk + (hk_j,)
    v = (v - fixed_order_sum_slabs(hk, BV, LOG2_J, LOG2_CL, LOG2_VEC)) * beta
    updated = ()
    hq = ()
    for j in tl.static_range(J):
        h_j = decayed[j] + v[:, None] * k[j]
        updated = updated + (h_j,)
        hq_j = h_j * q[j]
        if J * C != K:
            hq_j = tl.where(j * C + o_c < K, hq_j, 0.0)
        hq = hq + (hq_j,)
    return updated, fixed_order_sum_slabs(hq, BV, LOG2_J, LOG2_CL, LOG2_VEC)


@triton.jit
def recurrent_step_kernel(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    out,
    state,
    state_indices,
    scale,
    stride_qkv_row,
    stride_qkv_col,
    stride_a_row,
    stride_a_col,
    stride_b_row,
    stride_b_col,
    stride_A_log,
    stride_dt_bias,
    stride_state_block,
    stride_state_head,
    stride_state_v,
    stride_state_k,
    stride_indices,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    CHUNKS: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    J: tl.constexpr = 1 << LOG2_J
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)

    # A program takes CHUNKS blocks of BV value rows, one after the other. A block is BV rows
    # x the padded width J * C = next_power_of_2(K), held as J slabs [BV, C]; slab j holds
    # k = j * C + c.
    o_c = tl.arange(0, C)[None, :]
    o_v = i_v * (CHUNKS * BV) + tl.arange(0, BV)
    mask_v = o_v < V

    p_out = out + i_nh * V + o_v
    block = tl.load(state_indices + i_n * stride_indices).to(tl.int64)
    if block <= 0:
        for i_c in tl.static_range(CHUNKS):
            tl.store(
                p_out + i_c * BV,
                tl.full([BV], 0, out.dtype.element_ty),
                mask=o_v + i_c * BV < V,
            )
        return

    row = mixed_qkv + i_n * stride_qkv_row
    q = load_vector(row, i_h * K, stride_qkv_col, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, stride_qkv_col, K, C, LOG2_J)
    p_v = row + (2 * H * K + i_hv * V + o_v) * stride_qkv_col
    v = to_fp32(tl.load(p_v, mask=mask_v, other=0.0))
    p_h = (
        state
        + block * stride_state_block
        + i_hv * stride_state_head
        + o_v[:, None] * stride_state_v
        + o_c * stride_state_k
    )
    h = load_state_block(p_h, mask_v, stride_state_k, K, C, J)
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)

    a_val = to_fp32(tl.load(a + i_n * stride_a_row + i_hv * stride_a_col))
    b_val = to_fp32(tl.load(b + i_n * stride_b_row + i_hv * stride_b_col))
    A_log_val = to_fp32(tl.load(A_log + i_hv * stride_A_log))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv * stride_dt_bias))
    decay, beta = gates(a_val, b_val, A_log_val, dt_bias_val)

    for i_c in tl.range(CHUNKS):
        if CHUNKS > 1:  # the next block's loads go out before this block's arithmetic
            if V % (BV * CHUNKS) == 0:  # whole blocks: after the last, this block again
                mask_next = mask_v
                step = tl.where(i_c + 1 < CHUNKS, BV, 0)
            else:
                mask_next = (o_v + BV < V) & (i_c + 1 < CHUNKS)
                step = BV
            h_next = load_state_block(
                p_h + step * stride_state_v, mask_next, stride_state_k, K, C, J
            )
            v_next = to_fp32(tl.load(p_v + step * stride_qkv_col, mask=mask_next, other=0.0))
        h, o = delta_rule(h, q, k, v, decay, beta, BV, K, LOG2_J, LOG2_CL, LOG2_VEC)
        store_state_block(p_h, h, mask_v, stride_state_k, K, C, J)
        tl.store(p_out, round_to(o, out.dtype.element_ty), mask=mask_v)
        if CHUNKS > 1:
            h = h_next
            v = v_next
            mask_v = mask_next
            o_v += BV
            p_h += BV * stride_state_v
            p_v += BV * stride_qkv_col
            p_out += BV


@triton.jit
def load_state_block(p_h, mask_v, stride_k, K: tl.constexpr, C: tl.constexpr, J: tl.constexpr):
    """A block of state rows as J fp32 slabs [BV, C]: slab j from ``p_h + j * C * stride_k``
    [BV, C], rows where ``mask_v`` [BV] holds, zeros past K and elsewhere."""
    o_c = tl.arange(0, C)[None, :]
    h = ()
    for j in tl.static_range(J):
        mask = mask_v[:, None] & (j * C + o_c < K)
        h = h + (to_fp32(tl.load(p_h + j * C * stride_k, mask=mask, other=0.0)),)
    return h


@triton.jit
def store_state_block(p_h, h, mask_v, stride_k, K: tl.constexpr, C: tl.constexpr, J: tl.constexpr):
    """``load_state_block``'s inverse: the J fp32 slabs ``h`` rounded to the state's dtype and
    stored where that function loads them."""
    o_c = tl.arange(0, C)[None, :]
    for j in tl.static_range(J):
        mask = mask_v[:, None] & (j * C + o_c < K)
        tl.store(p_h + j * C * stride_k, round_to(h[j], p_h.dtype.element_ty), mask=mask)


LAUNCH_RECURRENT = Launcher(recurrent_step_kernel, tensors=8)
TILE_VECTOR_BYTES = 16  # each thread loads 16 contiguous bytes of a row per slab
ROW_ELEMENTS_PER_THREAD = 32  # of one value row's K, per thread
WARPS = 4
CONFIGS = 1024  # (dims, state dtype) pairs whose launch shape is kept


@dataclass(frozen=True)
class RecurrentConfig:
    """Launch shape of recurrent_step_kernel; it changes the speed, never the bits.

    A program takes ``chunks`` blocks of ``block_v`` value rows in turn and holds a block as
    J = 2^log2_j slabs [block_v, C] of the padded K (slab j holds k = j * C + c), with
    C = VEC * 2^log2_cl: VEC = 2^log2_vec contiguous elements per thread and 2^log2_cl lanes
    along c.
    """

    block_v: int
    log2_j: int
    log2_cl: int
    log2_vec: int
    num_warps: int
    chunks: int = 1


@dataclass(frozen=True)
class ShapeRule:
    """A launch shape independent of the head sizes: each thread holds ``row_elements`` of a
    value row's padded K in vectors of ``vector_bytes``; a program of ``num_warps`` warps takes
    ``chunks`` blocks of ``block_v`` value rows (each capped by the head's V)."""

    row_elements: int
    vector_bytes: int
    block_v: int
    num_warps: int
    chunks: int


# From the (batch row, value head) pair count on, per state dtype: the shapes that timed best
# against vLLM 0.26.0's packed decode on an H100 at Qwen3-Next's heads (K = V = 128, 32 value
# heads), B = 1 to 1024 (docs/kernels.md, "Launch shapes, timed").
SHAPE_RULES: dict[torch.dtype, tuple[tuple[int, ShapeRule], ...]] = {
    torch.float32: (
        (0, ShapeRule(row_elements=32, vector_bytes=16, block_v=8, num_warps=1, chunks=1)),
        (512, ShapeRule(row_elements=16, vector_bytes=16, block_v=8, num_warps=1, chunks=1)),
        (8192, ShapeRule(row_elements=4, vector_bytes=16, block_v=8, num_warps=1, chunks=1)),
    ),
    torch.bfloat16: (
        (0, ShapeRule(row_elements=32, vector_bytes=8, block_v=8, num_warps=1, chunks=1)),
        (256, ShapeRule(row_elements=32, vector_bytes=16, block_v=64, num_warps=2, chunks=1)),
        (512, ShapeRule(row_elements=32, vector_bytes=8, block_v=16, num_warps=2, chunks=4)),
        (1024, ShapeRule(row_elements=32, vector_bytes=16, block_v=16, num_warps=2, chunks=8)),
    ),
}


def log2(n: int) -> int:
    """log2 of a power of two."""
    return n.bit_length() - 1


def row_split(
    head_k: int,
    state_dtype: torch.dtype,
    row_elements: int = ROW_ELEMENTS_PER_THREAD,
    vector_bytes: int = TILE_VECTOR_BYTES,
) -> tuple[int, int, int]:
    """(log2_j, log2_cl, log2_vec) of a padded K row held ``row_elements`` per thread, in
    vectors of ``vector_bytes``."""
    block_k = next_power_of_2(head_k)
    lanes = min(32, max(1, block_k // row_elements))
    vec = max(1, min(vector_bytes // state_dtype.itemsize, block_k // lanes))
    return log2(block_k // (lanes * vec)), log2(lanes), log2(vec)


def shape_rule(pairs: int, state_dtype: torch.dtype) -> ShapeRule:
    """The rule of SHAPE_RULES for ``pairs`` (batch rows x value heads)."""
    rules = SHAPE_RULES[state_dtype]
    return next(rule for start, rule in reversed(rules) if pairs >= start)


@functools.lru_cache(maxsize=CONFIGS)
def recurrent_config(
    dims: RecurrentDims, state_dtype: torch.dtype, interpreted: bool = INTERPRETED
) -> RecurrentConfig:
    """The default launch shape for ``dims`` and the state dtype: SHAPE_RULES' rule for the
    batch's (row, value head) pairs. Under the interpreter a program takes all V rows over up
    to 4 warps (32 elements of K per thread in 16-byte vectors), which only shortens its
    Python loop."""
    head_v = next_power_of_2(dims.head_v)
    if interpreted:
        log2_j, log2_cl, log2_vec = row_split(dims.head_k, state_dtype)
        rows_per_warp = 32 >> log2_cl
        return RecurrentConfig(
            head_v, log2_j, log2_cl, log2_vec, max(1, min(WARPS, head_v // rows_per_warp))
        )
    rule = shape_rule(dims.batch * dims.num_v_heads, state_dtype)
    log2_j, log2_cl, log2_vec = row_split(
        dims.head_k, state_dtype, rule.row_elements, rule.vector_bytes
    )
    block_v = min(rule.block_v, head_v)
    return RecurrentConfig(
        block_v=block_v,
        log2_j=log2_j,
        log2_cl=log2_cl,
        log2_vec=log2_vec,
        num_warps=max(1, min(rule.num_warps, block_v // (32 >> log2_cl))),
        chunks=max(1, min(rule.chunks, head_v // block_v)),
    )


def kernel_arguments(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    out: Tensor,
    state: Tensor,
    state_indices: Tensor,
    dims: RecurrentDims,
    config: RecurrentConfig,
) -> tuple[tuple[int], tuple, dict]:
    """(grid, positional arguments, constexpr arguments) of recurrent_step_kernel."""
    num_v_tiles = cdiv(dims.head_v, config.block_v * config.chunks)
    grid = (num_v_tiles * dims.batch * dims.num_v_heads,)
    arguments = (
        mixed_qkv,
        a,
        b,
        A_log,
        dt_bias,
        out,
        state,
        state_indices,
        dims.scale,
        mixed_qkv.stride(0),
        mixed_qkv.stride(1),
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        A_log.stride(0),
        dt_bias.stride(0),
        *state.stride(),
        state_indices.stride(0),
    )
    constexprs = {
        "H": dims.num_k_heads,
        "HV": dims.num_v_heads,
        "K": dims.head_k,
        "V": dims.head_v,
        "BV": config.block_v,
        "NV": num_v_tiles,
        "CHUNKS": config.chunks,
        "LOG2_J": config.log2_j,
        "LOG2_CL": config.log2_cl,
        "LOG2_VEC": config.log2_vec,
        "USE_QK_L2NORM": dims.use_qk_l2norm,
    }
    return grid, arguments, constexprs


def bound_key(tensors: tuple, dims: RecurrentDims, config: RecurrentConfig) -> tuple:
    """The key of a bound launch of the kernel's leading ``tensors`` (mixed_qkv .. state_indices,
    out among them): the grid and every argument after the tensors follow from it."""
    return (dims, config, tensors[0].get_device(), tensor_layouts(tensors))


def new_output(mixed_qkv: Tensor, dims: RecurrentDims) -> Tensor:
    """The kernel's output ``[B, 1, HV, V]`` (mixed_qkv's dtype and device), uninitialized."""
    return torch.empty(
        (dims.batch, 1, dims.num_v_heads, dims.head_v),
        dtype=mixed_qkv.dtype,
        device=mixed_qkv.device,
    )


def launch_into(
    out: Tensor,
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    state_indices: Tensor,
    dims: RecurrentDims,
    config: RecurrentConfig,
    bound: BoundLaunch | None = None,
) -> BoundLaunch | None:
    """Run the kernel on checked arguments (``check_recurrent_args``), writing ``out``
    (``new_output``): with ``bound``, a launch bound for these tensors' layouts, directly;
    else through the launch bound to their key, binding one on its first launch. Returns the
    bound launch that ran (None under the interpreter or for an empty batch)."""
    tensors = (mixed_qkv, a, b, A_log, dt_bias, out, state, state_indices)
    if bound is not None:
        run_bound(bound, tensors)
        return bound
    if dims.batch == 0:
        return None
    return LAUNCH_RECURRENT.launch_keyed(
        bound_key(tensors, dims, config),
        tensors,
        lambda: kernel_arguments(*tensors, dims, config),
        num_warps=config.num_warps,
        device=mixed_qkv.device,
    )


def launch_recurrent(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    state_indices: Tensor,
    dims: RecurrentDims,
    config: RecurrentConfig,
) -> tuple[Tensor, object]:
    """Run the kernel on checked arguments (``check_recurrent_args``).

    Returns ``out`` and the compiled kernel that ran (Triton's; None under the interpreter or
    for an empty batch).
    """
    out = new_output(mixed_qkv, dims)
    bound = launch_into(out, mixed_qkv, a, b, A_log, dt_bias, state, state_indices, dims, config)
    return out, None if bound is None else bound.compiled


def recurrent_call_key(
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
) -> tuple | None:
    """The call key (``call_plans.call_key``) of ``recurrent_step`` with these arguments."""
    options = (
        (type(num_k_heads), num_k_heads),
        signature(scale),
        (type(use_qk_l2norm), use_qk_l2norm),
    )
    tensors = (mixed_qkv, a, b, A_log, dt_bias, state, state_indices)
    return call_key("recurrent", tensors, options)


def recurrent_step(
    mixed_qkv: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
    state_indices: Tensor,
    *,
    num_k_heads: int,
    scale: float,
    use_qk_l2norm: bool = True,
) -> Tensor:
    """GDN decode step with the golden's bits; returns ``out [B, 1, HV, V]``, ``state`` in place.

    Arguments, shapes, dtypes and contract are ``golden.recurrent_step``'s (checked the same
    way before anything is written): ``out`` is bitwise the golden's ``out`` and, after the
    call, ``state`` is bitwise the golden's ``new_state``: the active rows' blocks updated,
    every other block untouched. Runs on CUDA tensors, or on CPU tensors under
    ``TRITON_INTERPRET=1``.
    """
    tensors = (mixed_qkv, a, b, A_log, dt_bias, state, state_indices)
    key = recurrent_call_key(
        *tensors, num_k_heads=num_k_heads, scale=scale, use_qk_l2norm=use_qk_l2norm
    )
    plan = CALL_PLANS.lookup(key, state_indices, num_blocks=state.shape[0])
    if plan is None:
        dims = check_recurrent_args(
            *tensors,
            num_k_heads=num_k_heads,
            scale=scale,
            use_qk_l2norm=use_qk_l2norm,
            interpreted=INTERPRETED,
        )
    else:
        dims = plan.dims
    out = new_output(mixed_qkv, dims)
    if plan is not None and out.data_ptr() & 15 == plan.out_alignment:
        launch_into(out, *tensors, dims, None, plan.bound)
        return out
    bound = launch_into(out, *tensors, dims, recurrent_config(dims, state.dtype))
    if plan is None and bound is not None:
        CALL_PLANS.keep(key, CallPlan(dims, bound, out.data_ptr() & 15))
    return out
