"""A what-if recurrent decode kernel, for its time (``scripts/bench_decode.py --early-loads``):
ours with every load that does not depend on the state's block issued first; nothing checks its
outputs but the bench's own bit comparison with ours and the CPU tests.

Ours loads the block's index, and only once it has arrived q, k, v and the state; the gates'
inputs (a, b, A_log, dt_bias) go out after q and k are normalized, past the norms' barriers,
which no compiler moves a load across. With few programs (small B) one program's chain is the
kernel's time, and it holds three memory latencies in a row (the index, q and k, the gates'
inputs) with the norms and the gates' arithmetic between them. Here the gates' inputs, q, k and
v are loaded before the index arrives, the state as soon as it has, and the gates and the norms
are computed while the state is on its way. The arithmetic, its order and the stores are
``kernels.recurrent.recurrent_step_kernel``'s (its device functions, called in the same order on
the same values), so its bits are the goldens'; it takes every launch shape ours takes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_gdn_invariant.kernels.elementary import round_to, to_fp32
from vllm_gdn_invariant.kernels.recurrent import (
    delta_rule,
    gates,
    load_state_block,
    load_vector,
    qk_slabs,
    store_state_block,
)


@triton.jit
def early_loads_kernel(
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

    # What does not depend on the state's block is loaded before the block's index arrives.
    a_val = to_fp32(tl.load(a + i_n * stride_a_row + i_hv * stride_a_col))
    b_val = to_fp32(tl.load(b + i_n * stride_b_row + i_hv * stride_b_col))
    A_log_val = to_fp32(tl.load(A_log + i_hv * stride_A_log))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv * stride_dt_bias))
    row = mixed_qkv + i_n * stride_qkv_row
    q = load_vector(row, i_h * K, stride_qkv_col, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, stride_qkv_col, K, C, LOG2_J)
    p_v = row + (2 * H * K + i_hv * V + o_v) * stride_qkv_col
    v = to_fp32(tl.load(p_v, mask=mask_v, other=0.0))

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

    p_h = (
        state
        + block * stride_state_block
        + i_hv * stride_state_head
        + o_v[:, None] * stride_state_v
        + o_c * stride_state_k
    )
    h = load_state_block(p_h, mask_v, stride_state_k, K, C, J)
    # the gates and the norms while the state is on its way
    decay, beta = gates(a_val, b_val, A_log_val, dt_bias_val)
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)

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
