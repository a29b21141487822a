"""A what-if recurrent decode kernel, for its instruction count (``sass_mix.py``) and its time
(``scripts/bench_decode.py --what-if``); no golden of this repository has its bits, and nothing
checks its outputs.

It is ``kernels.recurrent.recurrent_step_kernel`` (same layout, gates, conversions, stores) with
another order of every K-sum of products, the one a cheaper golden could fix:

    S(x * y) = halves-sum over the groups g of  (t0 + t1),
               t_e = x[4g + e] * y[4g + e] + x[4g + e + 2] * y[4g + e + 2]   (e = 0, 1)

that is, each group of 4 contiguous k first (in a thread's registers at every launch shape), then
the golden's pairwise halves over the group sums; with ``FMA`` the first product of each ``t_e``
is fused (``fma(x_lo, y_lo, x_hi * y_hi)``) and so is the update (``fma(v, k, h)``). The golden's
order pairs k with k + K/2 first, which puts the lanes' bits of k before the registers' and makes
every lane level add a thread's whole vector. Contiguous inputs, a power-of-two K held whole by
the launch shape (``kernels.recurrent.recurrent_config``'s; one block of value rows per
program, whatever its ``chunks``), V a multiple of its rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_gdn_invariant.kernels import codegen
from vllm_gdn_invariant.kernels.elementary import (
    QK_NORM_EPS,
    add,
    add_halves,
    halve_last,
    round_to,
    sqrt,
    to_fp32,
)
from vllm_gdn_invariant.kernels.recurrent import (
    RecurrentConfig,
    gates,
    load_vector,
    to_slabs,
    unreplicated,
)

KERNEL_NAME = "grouped_recurrent_kernel"


@triton.jit
def split_half(x, A: tl.constexpr, B: tl.constexpr, W: tl.constexpr):
    """[A, B, W] -> (x[..., :W/2], x[..., W/2:]), each [A, B, W/2]."""
    return tl.split(tl.permute(tl.reshape(x, [A, B, 2, W // 2]), [0, 1, 3, 2]))


@triton.jit
def grouped_dot(
    xs,
    ys,
    R: tl.constexpr,
    RY: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
    FMA: tl.constexpr,
):
    """S(x * y) in the module docstring's order: ``xs`` J slabs [R, C], ``ys`` J slabs [RY, C]
    (RY = 1 broadcasts) -> [R]."""
    C: tl.constexpr = 1 << (LOG2_CL + LOG2_VEC)
    G: tl.constexpr = C // 4
    VG: tl.constexpr = (1 << LOG2_VEC) // 4
    sums = ()
    for j in tl.static_range(1 << LOG2_J):
        x_lo, x_hi = split_half(tl.reshape(xs[j], [R, G, 4]), R, G, 4)
        y_lo, y_hi = split_half(tl.reshape(ys[j], [RY, G, 4]), RY, G, 4)
        if FMA:
            t = tl.fma(x_lo, y_lo, x_hi * y_hi)
        else:
            t = x_lo * y_lo + x_hi * y_hi
        t0, t1 = split_half(t, R, G, 2)
        sums = sums + (tl.reshape(t0 + t1, [R, G]),)
    x = add_halves(sums, LOG2_J)  # group g = lane * VG + i, i < VG
    for level in tl.static_range(LOG2_CL):
        x = tl.reduce(tl.reshape(x, [R, 2, (G >> level) // 2]), 1, add)
    x = tl.reshape(x, [R, 1, VG])
    for level in tl.static_range(LOG2_VEC - 2):
        x = halve_last(x, R, 1, VG >> level)
    return tl.reshape(x, [R])


@triton.jit
def grouped_recurrent_kernel(
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
    stride_state_block,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    NV: tl.constexpr,
    LOG2_J: tl.constexpr,
    LOG2_CL: tl.constexpr,
    LOG2_VEC: tl.constexpr,
    FMA: tl.constexpr,
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
    o_v = i_v * BV + tl.arange(0, BV)
    p_out = out + i_nh * V + o_v
    block = tl.load(state_indices + i_n).to(tl.int64)
    if block <= 0:
        tl.store(p_out, tl.full([BV], 0, out.dtype.element_ty))
        return
    row = mixed_qkv + i_n * stride_qkv_row
    q = load_vector(row, i_h * K, 1, K, C, LOG2_J)
    k = load_vector(row, H * K + i_h * K, 1, K, C, LOG2_J)
    v = to_fp32(tl.load(row + (2 * H * K + i_hv * V + o_v)))
    p_h = state + block * stride_state_block + i_hv * V * K + o_v[:, None] * K + o_c
    h = ()
    for j in tl.static_range(J):
        h = h + (to_fp32(tl.load(p_h + j * C)),)
    q_slabs = to_slabs(q, LOG2_J, C)
    k_slabs = to_slabs(k, LOG2_J, C)
    q_norm = grouped_dot(q_slabs, q_slabs, 1, 1, LOG2_J, LOG2_CL, LOG2_VEC, FMA)
    k_norm = grouped_dot(k_slabs, k_slabs, 1, 1, LOG2_J, LOG2_CL, LOG2_VEC, FMA)
    q = unreplicated(tl.div_rn(q, sqrt(q_norm + QK_NORM_EPS)[:, None]), J, C)
    k = unreplicated(tl.div_rn(k, sqrt(k_norm + QK_NORM_EPS)[:, None]), J, C)
    q_slabs = to_slabs(q * scale, LOG2_J, C)
    k_slabs = to_slabs(k, LOG2_J, C)
    a_val = to_fp32(tl.load(a + i_n * HV + i_hv))
    b_val = to_fp32(tl.load(b + i_n * HV + i_hv))
    A_log_val = to_fp32(tl.load(A_log + i_hv))
    dt_bias_val = to_fp32(tl.load(dt_bias + i_hv))
    decay, beta = gates(a_val, b_val, A_log_val, dt_bias_val)
    decayed = ()
    for j in tl.static_range(J):
        decayed = decayed + (h[j] * decay,)
    v = (v - grouped_dot(decayed, k_slabs, BV, 1, LOG2_J, LOG2_CL, LOG2_VEC, FMA)) * beta
    updated = ()
    for j in tl.static_range(J):
        if FMA:
            updated = updated + (tl.fma(v[:, None], k_slabs[j], decayed[j]),)
        else:
            updated = updated + (decayed[j] + v[:, None] * k_slabs[j],)
    o = grouped_dot(updated, q_slabs, BV, 1, LOG2_J, LOG2_CL, LOG2_VEC, FMA)
    for j in tl.static_range(J):
        tl.store(p_h + j * C, round_to(updated[j], state.dtype.element_ty))
    tl.store(p_out, round_to(o, out.dtype.element_ty))


def kernel_arguments(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    out: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    heads: dict[str, int],
    config: RecurrentConfig,
    fma: bool,
) -> tuple[tuple[int], tuple, dict]:
    """(grid, positional arguments, constexpr arguments) of grouped_recurrent_kernel."""
    HV, K, V = heads["HV"], heads["K"], heads["V"]
    width = 1 << (config.log2_j + config.log2_cl + config.log2_vec)
    if width != K or V % config.block_v or config.log2_vec < 2:
        raise ValueError(
            f"the what-if kernel takes K = J * C (unpadded), V a multiple of BV and 4 or more "
            f"elements per thread, got K={K}, V={V}, {config}"
        )
    if not all(t.is_contiguous() for t in (mixed_qkv, a, b, state)):
        raise ValueError("the what-if kernel takes contiguous mixed_qkv, a, b and state")
    num_v_tiles = triton.cdiv(V, config.block_v)
    grid = (num_v_tiles * mixed_qkv.shape[0] * HV,)
    arguments = (
        mixed_qkv, a, b, A_log, dt_bias, out, state, state_indices, K**-0.5,
        mixed_qkv.stride(0), state.stride(0),
    )  # fmt: skip
    constexprs = {
        **heads,
        "BV": config.block_v,
        "NV": num_v_tiles,
        "LOG2_J": config.log2_j,
        "LOG2_CL": config.log2_cl,
        "LOG2_VEC": config.log2_vec,
        "FMA": fma,
    }
    return grid, arguments, constexprs


def launch_grouped(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    state_indices: torch.Tensor,
    heads: dict[str, int],
    config: RecurrentConfig,
    fma: bool,
) -> torch.Tensor:
    """Run grouped_recurrent_kernel (contraction off): out [B, 1, HV, V], state in place."""
    out = torch.empty(
        (mixed_qkv.shape[0], 1, heads["HV"], heads["V"]),
        dtype=mixed_qkv.dtype,
        device=mixed_qkv.device,
    )
    grid, arguments, constexprs = kernel_arguments(
        mixed_qkv, a, b, A_log, dt_bias, out, state, state_indices, heads, config, fma
    )
    grouped_recurrent_kernel[grid](
        *arguments, **constexprs, num_warps=config.num_warps, enable_fp_fusion=False
    )
    return out


def compile_grouped(
    heads: dict[str, int],
    config: RecurrentConfig,
    state_dtype: torch.dtype,
    *,
    batch: int,
    capability: int = 90,
    fma: bool,
):
    """grouped_recurrent_kernel compiled for ``sm_<capability>`` with contraction off (the
    only FMAs are the explicit ones)."""
    meta = codegen.meta
    H, HV, K, V = heads["H"], heads["HV"], heads["K"], heads["V"]
    mixed = meta((batch, 2 * H * K + HV * V), torch.bfloat16)
    gates_in = meta((batch, HV), torch.bfloat16)
    _, arguments, constexprs = kernel_arguments(
        mixed, gates_in, gates_in, meta((HV,), torch.float32), meta((HV,), torch.float32),
        meta((batch, 1, HV, V), torch.bfloat16), meta((1024, HV, V, K), state_dtype),
        meta((batch,), torch.int32), heads, config, fma,
    )  # fmt: skip
    return codegen.compile_kernel(
        grouped_recurrent_kernel, arguments, constexprs, config.num_warps, capability, False
    )
