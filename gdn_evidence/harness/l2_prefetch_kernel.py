"""A what-if recurrent decode kernel, for its time (``scripts/bench_decode.py --l2-prefetch``): a
program's whole state range asked into L2 before anything else; nothing checks its outputs but
the bench's own bit comparison with ours and the CPU tests.

It is one bulk L2 prefetch (``cp.async.bulk.prefetch.L2.global``, Hopper's copy engine; SASS
``UBLKPF.L2``) of the CHUNKS * BV state rows the program takes, issued by its first thread, then
``kernels.recurrent.recurrent_step_kernel`` itself, called with the same arguments: the same
arithmetic, loads and stores, so the goldens' bits. Ours loads a program's next block only after
most of the current block's arithmetic (ptxas's choice, docs/kernels.md "Register budgets"); the
prefetch holds no register and puts every block's lines on their way to L2 at once. It needs
sm_90 or later, a state whose rows are K contiguous elements 16-byte aligned (the bench's), and
two or more blocks per program to make a difference. Under Triton's interpreter it is skipped.
"""

from __future__ import annotations

import triton
import triton.language as tl

from vllm_gdn_invariant.kernels.elementary import INTERPRETED
from vllm_gdn_invariant.kernels.recurrent import recurrent_step_kernel

ON_DEVICE = tl.constexpr(not INTERPRETED)


@triton.jit
def prefetch_into_l2(address, nbytes):
    """Ask the ``nbytes`` (a multiple of 16) from ``address`` (16-byte aligned) into L2: one bulk
    prefetch, issued by thread 0 of the program."""
    if ON_DEVICE:
        tl.inline_asm_elementwise(
            "{ .reg .pred first; .reg .b32 thread; mov.u32 thread, %tid.x; "
            "setp.eq.u32 first, thread, 0; "
            "@first cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r",
            [address + tl.zeros([1], tl.int32), nbytes + tl.zeros([1], tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def l2_prefetch_kernel(
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
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_hv = i_nh % HV
    block = tl.load(state_indices + (i_nh // HV) * stride_indices).to(tl.int64)
    if block > 0:
        first_row = i_v * (CHUNKS * BV)
        rows = tl.minimum(CHUNKS * BV, V - first_row)
        item_bytes: tl.constexpr = state.dtype.element_ty.primitive_bitwidth // 8
        nbytes = (rows - 1) * stride_state_v * item_bytes + K * item_bytes
        prefetch_into_l2(
            state
            + block * stride_state_block
            + i_hv * stride_state_head
            + first_row * stride_state_v,
            (nbytes // 16 * 16).to(tl.int32),
        )
    recurrent_step_kernel(
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
        H,
        HV,
        K,
        V,
        BV,
        NV,
        CHUNKS,
        LOG2_J,
        LOG2_CL,
        LOG2_VEC,
        USE_QK_L2NORM,
    )
