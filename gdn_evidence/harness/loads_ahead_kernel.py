"""What-if recurrent decode kernels that issue the state's loads, or ask for it, earlier, for
their time (``scripts/bench_decode.py --early-loads`` and ``--l2-prefetch``); nothing checks their
outputs but the bench's own bit comparison with ours and the CPU tests. Their arithmetic, its
order and their stores are ``kernels.recurrent.recurrent_step_kernel``'s (that kernel, or its
device functions called on the same values), so their bits are the goldens'.

Two things hold ours' loads back. With few programs (small B) one program's chain of waits is
the kernel's time, and ours' holds three memory latencies in a row: the block's index (the
state's address and the inactive-row branch wait on it, and q, k and v are loaded after the
branch), q and k (their norms end in barriers), and the gates' inputs (a, b, A_log, dt_bias),
loaded after those barriers, where no compiler moves a load back across; the gates' arithmetic
then comes before the state's first operation, the decay. And ours loads a program's next block
of value rows only after most of the current block's arithmetic (ptxas's choice, docs/kernels.md
"Register budgets"), where holding it earlier in registers cost more occupancy than it won.

* ``loads_ahead_kernel``: ours, with EARLY_LOADS every load that does not depend on the
  state's block issued first, the state's as soon as the index is in, and the gates and the
  norms computed while the state is on its way; with AHEAD > 0, blocks 1 .. AHEAD of the program
  asked into L2 before the loop and block i + 1 + AHEAD at the top of iteration i (AHEAD = 1
  without early loads, where ``l2_ahead`` holds, is 344febd's package kernel). It takes every
  launch shape ours takes.
  With OUT_AS_HELD each block's outputs are stored from the layout the K-sum leaves them in
  (``store_as_held``), not converted into a store layout through shared memory between two
  barriers, as ours does.
* ``l2_prefetch_kernel``: all the state rows the program takes asked into L2 at once, then
  ``recurrent_step_kernel`` itself, called with the same arguments.

The request into L2 is ``prefetch_rows``: one bulk prefetch of a range of state rows, issued by
the program's first thread. It needs sm_90 or later and a state whose rows are K contiguous
elements, 16-byte aligned (``l2_ahead``'s rule); under Triton's interpreter it is skipped. In
vLLM 0.26.0's engine the request made the package's kernel slower (docs/kernels.md, "The L2
request taken out of the package"), so the package does not ask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_gdn_invariant.kernels.elementary import INTERPRETED, round_to, to_fp32
from vllm_gdn_invariant.kernels.recurrent import (
    RecurrentConfig,
    delta_rule,
    gates,
    load_state_block,
    load_vector,
    qk_slabs,
    recurrent_step_kernel,
    store_state_block,
)

ON_DEVICE = tl.constexpr(not INTERPRETED)
L2_PREFETCH_CAPABILITY = 90  # cp.async.bulk.prefetch.L2 needs sm_90 or later
L2_PREFETCH_ALIGNMENT = 16  # bytes: the bulk prefetch's address and size unit


@triton.jit
def prefetch_into_l2(address, nbytes):
    """Ask the ``nbytes`` (a multiple of 16) from ``address`` (16-byte aligned) into L2: one bulk
    prefetch (``cp.async.bulk.prefetch.L2.global``, SASS ``UBLKPF.L2``), issued by thread 0 of
    the program; it holds no register and changes no value. Skipped under the interpreter."""
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
def prefetch_rows(p_head, first_row, rows, V: tl.constexpr, K: tl.constexpr, stride_v):
    """``prefetch_into_l2`` of state rows first_row .. first_row + rows - 1 of a head (those
    below V) from ``p_head``, the head's row 0: the whole 16-byte units of that range."""
    item_bytes: tl.constexpr = p_head.dtype.element_ty.primitive_bitwidth // 8
    rows = tl.minimum(rows, V - first_row)
    if rows > 0:
        nbytes = (rows - 1) * stride_v * item_bytes + K * item_bytes
        prefetch_into_l2(p_head + first_row * stride_v, (nbytes // 16 * 16).to(tl.int32))


def l2_ahead(
    state: torch.Tensor, config: RecurrentConfig, capability: int, interpreted: bool = INTERPRETED
) -> bool:
    """Whether a request into L2 ahead of the loads can be issued for ``state`` at ``config``
    (344febd's package rule): a program of two or more blocks, sm_90 or later, compiled, the
    state's rows contiguous and its base and every stride 16-byte aligned."""
    item = state.element_size()
    return (
        config.chunks >= 2
        and capability >= L2_PREFETCH_CAPABILITY
        and not interpreted
        and state.stride(-1) == 1
        and state.data_ptr() % L2_PREFETCH_ALIGNMENT == 0
        and all(stride * item % L2_PREFETCH_ALIGNMENT == 0 for stride in state.stride()[:-1])
    )


def device_capability(device: torch.device) -> int:
    """``major * 10 + minor`` of an NVIDIA CUDA device; 0 for any other (ROCm's included: its
    torch reports a device of type cuda, with no bulk prefetch)."""
    if device.type != "cuda" or torch.version.hip is not None:
        return 0
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


@triton.jit
def gate_inputs(p_a, p_b, p_A_log, p_dt_bias):
    """(a, b, A_log, dt_bias) of one (row, value head), loaded and widened to fp32 as ours
    loads them."""
    return (
        to_fp32(tl.load(p_a)),
        to_fp32(tl.load(p_b)),
        to_fp32(tl.load(p_A_log)),
        to_fp32(tl.load(p_dt_bias)),
    )


@triton.jit
def store_as_held(pointer, value, mask):
    """``tl.store(pointer, value, mask=mask)`` of 16- or 32-bit values, issued in the layout
    ``value`` has: every thread that holds an element stores it (copies store the same bits),
    so the value takes no conversion into a store layout. Inline PTX ``st.global`` (NVIDIA
    targets); ``tl.store`` under the interpreter."""
    if ON_DEVICE:
        if value.dtype.primitive_bitwidth == 16:
            bits = value.to(tl.int16, bitcast=True)
            ptx_store(pointer, bits, mask, "st.global.b16", "=r,l,h,r")
        else:
            bits = value.to(tl.int32, bitcast=True)
            ptx_store(pointer, bits, mask, "st.global.b32", "=r,l,r,r")
    else:
        tl.store(pointer, value, mask=mask)


@triton.jit
def ptx_store(pointer, bits, mask, STORE: tl.constexpr, CONSTRAINTS: tl.constexpr):
    """``STORE [pointer], bits`` where ``mask`` holds, per element, in inline PTX. ``bits`` is
    an integer tensor (Triton 3.6 rejects a pointer beside a float among inline PTX operands)."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $3, 0; @p " + STORE + " [$1], $2; mov.u32 $0, 0; }",
        CONSTRAINTS,
        [pointer, bits, mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def qkv_vectors(
    row,
    p_v,
    mask_v,
    i_h,
    stride_col,
    H: tl.constexpr,
    K: tl.constexpr,
    C: tl.constexpr,
    LOG2_J: tl.constexpr,
):
    """q, k (fp32 [J, C]) of k-head ``i_h`` and the block's v (fp32), loaded from the packed
    row as ours loads them."""
    q = load_vector(row, i_h * K, stride_col, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, stride_col, K, C, LOG2_J)
    return q, k, to_fp32(tl.load(p_v, mask=mask_v, other=0.0))


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
        p_head = state + block * stride_state_block + i_hv * stride_state_head
        prefetch_rows(p_head, i_v * (CHUNKS * BV), CHUNKS * BV, V, K, stride_state_v)
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


@triton.jit
def loads_ahead_kernel(
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
    AHEAD: tl.constexpr,
    EARLY_LOADS: tl.constexpr,
    OUT_AS_HELD: tl.constexpr,
):
    J: tl.constexpr = 1 << LOG2_J
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    pid = tl.program_id(0).to(tl.int64)
    i_v = pid % NV
    i_nh = pid // NV
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)
    first_row = i_v * (CHUNKS * BV)
    o_c = tl.arange(0, C)[None, :]
    o_v = first_row + tl.arange(0, BV)
    mask_v = o_v < V

    row = mixed_qkv + i_n * stride_qkv_row
    p_v = row + (2 * H * K + i_hv * V + o_v) * stride_qkv_col
    p_a = a + i_n * stride_a_row + i_hv * stride_a_col
    p_b = b + i_n * stride_b_row + i_hv * stride_b_col
    p_A_log, p_dt_bias = A_log + i_hv * stride_A_log, dt_bias + i_hv * stride_dt_bias
    if EARLY_LOADS:  # before the block's index arrives
        gate_values = gate_inputs(p_a, p_b, p_A_log, p_dt_bias)
        q, k, v = qkv_vectors(row, p_v, mask_v, i_h, stride_qkv_col, H, K, C, LOG2_J)

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

    p_head = state + block * stride_state_block + i_hv * stride_state_head
    if AHEAD > 0:  # blocks 1 .. AHEAD, those the program takes
        ahead_rows = tl.minimum(AHEAD, CHUNKS - 1) * BV
        prefetch_rows(p_head, first_row + BV, ahead_rows, V, K, stride_state_v)
    if not EARLY_LOADS:
        q, k, v = qkv_vectors(row, p_v, mask_v, i_h, stride_qkv_col, H, K, C, LOG2_J)
    p_h = p_head + o_v[:, None] * stride_state_v + o_c * stride_state_k
    h = load_state_block(p_h, mask_v, stride_state_k, K, C, J)
    if EARLY_LOADS:  # while the state is on its way
        decay, beta = gates(gate_values[0], gate_values[1], gate_values[2], gate_values[3])
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)
    if not EARLY_LOADS:
        gate_values = gate_inputs(p_a, p_b, p_A_log, p_dt_bias)
        decay, beta = gates(gate_values[0], gate_values[1], gate_values[2], gate_values[3])

    for i_c in tl.range(CHUNKS):
        if AHEAD > 0:
            if i_c + 1 + AHEAD < CHUNKS:
                ahead = first_row + (i_c + 1 + AHEAD) * BV
                prefetch_rows(p_head, ahead, BV, V, K, stride_state_v)
        if CHUNKS > 1:  # ours' loads of the next block, as ours issues them
            if V % (BV * CHUNKS) == 0:
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
        if OUT_AS_HELD:  # the block's outputs stored from the K-sum's layout
            rows_out = first_row + i_c * BV + tl.arange(0, BV)
            store_as_held(
                out + i_nh * V + rows_out, round_to(o, out.dtype.element_ty), rows_out < V
            )
        else:
            tl.store(p_out, round_to(o, out.dtype.element_ty), mask=mask_v)
        if CHUNKS > 1:
            h = h_next
            v = v_next
            mask_v = mask_next
            o_v += BV
            p_h += BV * stride_state_v
            p_v += BV * stride_qkv_col
            p_out += BV
