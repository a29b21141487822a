"""A what-if recurrent decode kernel, for its time (``scripts/bench_decode.py --pipelined``): the
loop over a program's blocks of value rows software-pipelined by Triton; nothing checks its
outputs but the bench's own bit comparison with ours and the CPU tests.

It is ``kernels.recurrent.recurrent_step_kernel`` with another loop: each iteration loads its
own block (state and v) and the loop is ``tl.range(CHUNKS, num_stages=STAGES)``, so that
Triton's pipeliner turns the state's loads into asynchronous copies into shared memory
(``cp.async``, SASS ``LDGSTS``): block i + STAGES - 1's copy goes out at the end of iteration i
(after its arithmetic and stores, in the sm_90 code of Triton 3.6.0 and 3.9.0) and iteration i
reads its block from shared memory. The copies in flight hold no registers. With two stages a
block's copy has the lead ours' plain loads of the next block have (ptxas issues them after most
of a block's arithmetic, docs/kernels.md "Register budgets"); from three stages, a whole
iteration more. Triton pipelines a loop without dots only where the loop says ``num_stages``;
the launch's ``num_stages`` alone leaves it as it is (``scripts/sass_mix.py --pipelined`` counts
both). The arithmetic, stores and layout are ``recurrent_step_kernel``'s, so its bits are the
goldens'; a last partial block is masked as ours masks it.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels.elementary import round_to, to_fp32
from vllm_gdn_invariant.kernels.recurrent import (
    RecurrentConfig,
    delta_rule,
    gates,
    kernel_arguments,
    load_state_block,
    load_vector,
    qk_slabs,
    row_split,
    store_state_block,
)
from vllm_gdn_invariant.kernels.validation import RecurrentDims


@triton.jit
def pipelined_kernel(
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

    # A program takes CHUNKS blocks of BV value rows; block i_c holds rows
    # first_v + i_c * BV + (0 .. BV - 1), as J slabs [BV, C] (slab j holds k = j * C + c).
    o_c = tl.arange(0, C)[None, :]
    first_v = i_v * (CHUNKS * BV) + tl.arange(0, BV)

    block = tl.load(state_indices + i_n * stride_indices).to(tl.int64)
    if block <= 0:
        for i_c in tl.static_range(CHUNKS):
            o_v = first_v + i_c * BV
            tl.store(out + i_nh * V + o_v, tl.full([BV], 0, out.dtype.element_ty), mask=o_v < V)
        return

    row = mixed_qkv + i_n * stride_qkv_row
    q = load_vector(row, i_h * K, stride_qkv_col, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, stride_qkv_col, K, C, LOG2_J)
    q, k = qk_slabs(q, k, scale, LOG2_J, LOG2_CL, LOG2_VEC, USE_QK_L2NORM)

    a_val = to_fp32(tl.load(a + i_n * stride_a_row + i_hv * stride_a_col))
    b_val = to_fp32(tl.load(b + i_n * stride_b_row + i_hv * stride_b_col))
    A_log_val = to_fp32(tl.load(A_log + i_hv * stride_A_log))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv * stride_dt_bias))
    decay, beta = gates(a_val, b_val, A_log_val, dt_bias_val)

    head = state + block * stride_state_block + i_hv * stride_state_head + o_c * stride_state_k
    for i_c in tl.range(CHUNKS, num_stages=STAGES):
        o_v = first_v + i_c * BV
        mask_v = o_v < V
        p_h = head + o_v[:, None] * stride_state_v
        h = load_state_block(p_h, mask_v, stride_state_k, K, C, J)
        p_v = row + (2 * H * K + i_hv * V + o_v) * stride_qkv_col
        v = to_fp32(tl.load(p_v, mask=mask_v, other=0.0))
        h, o = delta_rule(h, q, k, v, decay, beta, BV, K, LOG2_J, LOG2_CL, LOG2_VEC)
        store_state_block(p_h, h, mask_v, stride_state_k, K, C, J)
        tl.store(out + i_nh * V + o_v, round_to(o, out.dtype.element_ty), mask=mask_v)


ONE_WARP_8_ROWS = {"block_v": 8, "num_warps": 1}
ONE_SLAB = {"row_elements": 4, "vector_bytes": 16}  # vLLM's layout: K over the 32 lanes
# The launch shapes of the variants other than the default's, name: the fields replaced, as
# ``variant_config`` reads them (``bench_decode.py --pipelined`` times ours at each too).
SHAPES = {
    "w1c16": ONE_WARP_8_ROWS | {"chunks": 16},
    "w2c4": {"block_v": 32, "num_warps": 2, "chunks": 4},
    "w4c4": {"block_v": 32, "num_warps": 4, "chunks": 4},
    "w1c16_slab": ONE_WARP_8_ROWS | ONE_SLAB | {"chunks": 16},
    "w1c4_slab": ONE_WARP_8_ROWS | ONE_SLAB | {"chunks": 4},
}
# The stages each shape is taken with (None: the default shape).
STAGES_PER_SHAPE = (
    (None, (2, 3)),
    ("w1c16", (2, 3, 4)),
    ("w2c4", (2,)),
    ("w4c4", (2, 3)),
    ("w1c16_slab", (2, 3, 4)),
    ("w1c4_slab", (3,)),
)
# What ``bench_decode.py --pipelined`` times and ``scripts/sass_mix.py --pipelined`` counts,
# name: (launch-shape fields replaced, None for the default shape; stages). A variant applies
# where its shape takes two or more whole blocks per program.
PIPELINED = {
    f"pipelined_s{stages}" + (f"_{shape}" if shape else ""): (SHAPES.get(shape), stages)
    for shape, all_stages in STAGES_PER_SHAPE
    for stages in all_stages
}


def variant_config(
    default: RecurrentConfig, fields: dict | None, head_k: int, state_dtype: torch.dtype
) -> RecurrentConfig:
    """``default`` with ``fields`` replaced: RecurrentConfig's own, or ``row_elements`` and
    ``vector_bytes`` for the split of a K row (``kernels.recurrent.row_split``)."""
    fields = dict(fields or {})
    if "row_elements" in fields:
        split = row_split(
            head_k, state_dtype, fields.pop("row_elements"), fields.pop("vector_bytes")
        )
        fields |= dict(zip(("log2_j", "log2_cl", "log2_vec"), split, strict=True))
    return dataclasses.replace(default, **fields)


def compile_pipelined(
    heads: dict[str, int],
    config: RecurrentConfig,
    state_dtype: torch.dtype,
    stages: int,
    *,
    batch: int,
    capability: int = 90,
    num_stages: int | None = None,
):
    """pipelined_kernel compiled for ``sm_<capability>`` at ``config`` and ``stages``, with
    contraction off as ours (``num_stages``: the launch's own option, Triton's default if
    None)."""
    meta = codegen.meta
    H, HV, K, V = heads["H"], heads["HV"], heads["K"], heads["V"]
    mixed = meta((batch, 2 * H * K + HV * V), torch.bfloat16)
    gates_in = meta((batch, HV), torch.bfloat16)
    dims = RecurrentDims(batch, H, HV, K, V, K**-0.5, True)
    _, arguments, constexprs = kernel_arguments(
        mixed, gates_in, gates_in, meta((HV,), torch.float32), meta((HV,), torch.float32),
        meta((batch, 1, HV, V), torch.bfloat16), meta((1024, HV, V, K), state_dtype),
        meta((batch,), torch.int32), dims, config,
    )  # fmt: skip
    options = {} if num_stages is None else {"num_stages": num_stages}
    return codegen.compile_kernel(
        pipelined_kernel,
        arguments,
        constexprs | {"STAGES": stages},
        config.num_warps,
        capability,
        False,
        options,
    )
