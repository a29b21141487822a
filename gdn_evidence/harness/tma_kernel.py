"""A what-if recurrent decode kernel, for its time (``scripts/bench_decode.py --tma``): the state's
blocks read through a tensor descriptor (on sm_90, the Tensor Memory Accelerator: one bulk copy
per slab into shared memory, no per-thread loads); nothing checks its outputs but the bench's
own bit comparison with ours and the CPU tests.

It is ``harness/pipelined_kernel.py``'s loop (each iteration reads its own block; ``tl.range(CHUNKS,
num_stages=STAGES)``, so that from two stages Triton's pipeliner issues a block's copies
``STAGES - 1`` iterations ahead) with the state's slabs loaded by ``desc.load`` from a
descriptor of the program's head ([V, K], K contiguous) that each program makes on the device.
The arithmetic, stores and layout of the stores are ``recurrent_step_kernel``'s, so its bits are
the goldens'. Whole blocks only (V a multiple of BV * CHUNKS), a state whose K is contiguous and
whose heads start 16-byte aligned; the launch needs ``triton.set_allocator`` (``allocate``) for
the descriptors' global scratch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gdn_evidence.harness.loads_ahead_kernel import gate_inputs
from gdn_evidence.harness.pipelined_kernel import SHAPES
from vllm_gdn_invariant.kernels.elementary import INTERPRETED, round_to, to_fp32
from vllm_gdn_invariant.kernels.recurrent import (
    delta_rule,
    gates,
    load_vector,
    qk_slabs,
    store_state_block,
)


@triton.jit
def tma_kernel(
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
    STAGES: tl.constexpr,
):
    J: tl.constexpr = 1 << LOG2_J
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)

    o_c = tl.arange(0, C)[None, :]
    rows = tl.arange(0, BV)
    first_v = i_v * (CHUNKS * BV)
    mask_v = rows < BV  # whole blocks

    block = tl.load(state_indices + i_n * stride_indices).to(tl.int64)
    if block <= 0:
        for i_c in tl.static_range(CHUNKS):
            o_v = first_v + i_c * BV + rows
            tl.store(out + i_nh * V + o_v, tl.full([BV], 0, out.dtype.element_ty))
        return

    row = mixed_qkv + i_n * stride_qkv_row
    q = load_vector(row, i_h * K, stride_qkv_col, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, stride_qkv_col, K, C, LOG2_J)
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)

    decay, beta = gates(
        *gate_inputs(
            a + i_n * stride_a_row + i_hv * stride_a_col,
            b + i_n * stride_b_row + i_hv * stride_b_col,
            A_log + i_hv * stride_A_log,
            dt_bias + i_hv * stride_dt_bias,
        )
    )

    head = state + block * stride_state_block + i_hv * stride_state_head
    desc = tl.make_tensor_descriptor(
        head, shape=[V, K], strides=[stride_state_v, 1], block_shape=[BV, C]
    )
    for i_c in tl.range(CHUNKS, num_stages=STAGES):
        v0 = first_v + i_c * BV
        h = ()
        for j in tl.static_range(J):
            h = h + (to_fp32(desc.load([v0.to(tl.int32), j * C])),)
        o_v = v0 + rows
        v = to_fp32(tl.load(row + (2 * H * K + i_hv * V + o_v) * stride_qkv_col))
        h, o = delta_rule(h, q, k, v, decay, beta, BV, K, LOG2_J, LOG2_CL, LOG2_VEC)
        p_h = head + o_v[:, None] * stride_state_v + o_c * stride_state_k
        store_state_block(p_h, h, mask_v, stride_state_k, K, C, J)
        tl.store(out + i_nh * V + o_v, round_to(o, out.dtype.element_ty))


def allocate(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global scratch for the descriptors ``tma_kernel`` makes (``triton.set_allocator``): on the
    GPU, or on the CPU under Triton's interpreter."""
    return torch.empty(size, device="cpu" if INTERPRETED else "cuda", dtype=torch.int8)


# What ``bench_decode.py --tma`` times, name: (launch-shape fields replaced, None for the
# default shape; stages).
TMA = {
    **{f"tma_s{stages}": (None, stages) for stages in (1, 2, 3)},
    **{f"tma_s{stages}_w1c16": (SHAPES["w1c16"], stages) for stages in (1, 2, 3, 4)},
}
