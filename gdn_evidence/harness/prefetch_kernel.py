"""A what-if recurrent decode kernel, for its time (``scripts/bench_decode.py --prefetch``): the
state block two blocks ahead in flight; nothing checks its outputs but the bench's own bit
comparison with ours.

It is ``kernels.recurrent.recurrent_step_kernel`` with another loop over a program's blocks of
value rows: the next two blocks' loads are issued before the loop, and each iteration issues
the loads of the block two ahead (in the state's dtype, widened when used) before computing its
own, so that a block's loads have a whole iteration of arithmetic to arrive. The arithmetic,
stores and layout are ``recurrent_step_kernel``'s, so its bits are the goldens'. Whole blocks
only: V a multiple of BV * CHUNKS, CHUNKS >= 2 (``kernels.recurrent``'s bf16 default from
B = 32 at Qwen3-Next's heads).
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_gdn_invariant.kernels.elementary import round_to, to_fp32
from vllm_gdn_invariant.kernels.recurrent import (
    delta_rule,
    gates,
    load_vector,
    qk_slabs,
    store_state_block,
)


@triton.jit
def prefetch_two_kernel(
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
    v0 = tl.load(p_v, mask=mask_v, other=0.0)
    v1 = tl.load(p_v + BV * stride_qkv_col, mask=mask_v, other=0.0)
    p_h = (
        state
        + block * stride_state_block
        + i_hv * stride_state_head
        + o_v[:, None] * stride_state_v
        + o_c * stride_state_k
    )
    raw0 = load_raw(p_h, mask_v, stride_state_k, K, C, J)
    raw1 = load_raw(p_h + BV * stride_state_v, mask_v, stride_state_k, K, C, J)
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)

    a_val = to_fp32(tl.load(a + i_n * stride_a_row + i_hv * stride_a_col))
    b_val = to_fp32(tl.load(b + i_n * stride_b_row + i_hv * stride_b_col))
    A_log_val = to_fp32(tl.load(A_log + i_hv * stride_A_log))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv * stride_dt_bias))
    decay, beta = gates(a_val, b_val, A_log_val, dt_bias_val)

    for i_c in tl.range(CHUNKS):
        step = tl.where(i_c + 2 < CHUNKS, 2 * BV, 0)
        raw2 = load_raw(p_h + step * stride_state_v, mask_v, stride_state_k, K, C, J)
        v2 = tl.load(p_v + step * stride_qkv_col, mask=mask_v, other=0.0)
        h = widen(raw0, J)
        h, o = delta_rule(h, q, k, to_fp32(v0), decay, beta, BV, K, LOG2_J, LOG2_CL, LOG2_VEC)
        store_state_block(p_h, h, mask_v, stride_state_k, K, C, J)
        tl.store(p_out, round_to(o, out.dtype.element_ty), mask=mask_v)
        raw0 = raw1
        raw1 = raw2
        v0 = v1
        v1 = v2
        p_h += BV * stride_state_v
        p_v += BV * stride_qkv_col
        p_out += BV


@triton.jit
def load_raw(p_h, mask_v, stride_k, K: tl.constexpr, C: tl.constexpr, J: tl.constexpr):
    """``kernels.recurrent.load_state_block`` without the widening: the slabs in the state's
    dtype."""
    o_c = tl.arange(0, C)[None, :]
    h = ()
    for j in tl.static_range(J):
        mask = mask_v[:, None] & (j * C + o_c < K)
        h = h + (tl.load(p_h + j * C * stride_k, mask=mask, other=0.0),)
    return h


@triton.jit
def widen(raw, J: tl.constexpr):
    """The J slabs of ``load_raw`` widened to fp32 (exact)."""
    h = ()
    for j in tl.static_range(J):
        h = h + (to_fp32(raw[j]),)
    return h
