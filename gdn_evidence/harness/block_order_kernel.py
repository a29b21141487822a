"""A what-if recurrent decode kernel, for its time (``scripts/bench_decode.py --block-order``):
a program's blocks of value rows taken in another order; nothing checks its outputs but the
bench's own bit comparison with ours and the CPU tests.

In ours (``kernels.recurrent.recurrent_step_kernel``) every program of a whole head takes its
blocks first to last, so at any moment the programs resident together read and write the same
block of their heads: addresses a head's bytes apart (32 KiB with a bf16 state at Qwen3-Next's
K = V = 128), a power of two. With ``ROTATE`` a program starts at block ``i_nh % CHUNKS`` of its
head and wraps around, so that neighbouring programs are at different blocks; without it the
order is ours (the control: this kernel's own loop at ours' order). The next block's loads go
out before this block's arithmetic, as in ours; after the last block they read that block
again, values nobody uses. The arithmetic, stores and layout are ``recurrent_step_kernel``'s, so
its bits are the goldens'. Whole blocks only: V a multiple of BV * CHUNKS, CHUNKS >= 2.
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
def block_order_kernel(
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
    ROTATE: tl.constexpr,
):
    J: tl.constexpr = 1 << LOG2_J
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)

    # Block c of the program holds rows first_v + c * BV + (0 .. BV - 1); the program takes
    # blocks start, start + 1, ... (mod CHUNKS).
    o_c = tl.arange(0, C)[None, :]
    rows = tl.arange(0, BV)
    first_v = i_v * (CHUNKS * BV)
    mask_v = rows < BV  # whole blocks

    block = tl.load(state_indices + i_n * stride_indices).to(tl.int64)
    if block <= 0:
        for i_c in tl.static_range(CHUNKS):
            tl.store(
                out + i_nh * V + first_v + i_c * BV + rows, tl.full([BV], 0, out.dtype.element_ty)
            )
        return

    start = i_nh % CHUNKS if ROTATE else 0
    o_v = first_v + start * BV + rows
    row = mixed_qkv + i_n * stride_qkv_row
    q = load_vector(row, i_h * K, stride_qkv_col, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, stride_qkv_col, K, C, LOG2_J)
    v_row = row + (2 * H * K + i_hv * V) * stride_qkv_col
    v = to_fp32(tl.load(v_row + o_v * stride_qkv_col))
    head = state + block * stride_state_block + i_hv * stride_state_head + o_c * stride_state_k
    h = load_state_block(head + o_v[:, None] * stride_state_v, mask_v, stride_state_k, K, C, J)
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)

    a_val = to_fp32(tl.load(a + i_n * stride_a_row + i_hv * stride_a_col))
    b_val = to_fp32(tl.load(b + i_n * stride_b_row + i_hv * stride_b_col))
    A_log_val = to_fp32(tl.load(A_log + i_hv * stride_A_log))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv * stride_dt_bias))
    decay, beta = gates(a_val, b_val, A_log_val, dt_bias_val)

    for i_c in tl.range(CHUNKS):
        next_block = tl.where(i_c + 1 < CHUNKS, (start + i_c + 1) % CHUNKS, (start + i_c) % CHUNKS)
        o_next = first_v + next_block * BV + rows
        h_next = load_state_block(
            head + o_next[:, None] * stride_state_v, mask_v, stride_state_k, K, C, J
        )
        v_next = to_fp32(tl.load(v_row + o_next * stride_qkv_col))
        h, o = delta_rule(h, q, k, v, decay, beta, BV, K, LOG2_J, LOG2_CL, LOG2_VEC)
        store_state_block(head + o_v[:, None] * stride_state_v, h, mask_v, stride_state_k, K, C, J)
        tl.store(out + i_nh * V + o_v, round_to(o, out.dtype.element_ty))
        h = h_next
        v = v_next
        o_v = o_next
